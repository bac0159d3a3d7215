"""Exact peaks by resetting high-water marks (``exact_peaks=True`` only).

Reading a process's high-water mark (VmHWM) changes nothing; *resetting*
it (writing 5 to /proc/<pid>/clear_refs, proc(5)) makes every interval's
peak exact, but it also resets what ``getrusage``'s ``ru_maxrss``,
``/usr/bin/time -v`` and the process's own benchmark code read: a 500 MiB
spike under a monitor then read 31 MiB to the process itself. So nbmon only
resets when the user asks for it, and says so where the option is
documented.

Resetting it resets it for everybody, so two nbmon readers that each reset
would steal each other's peaks (a dashboard's helper process and a
``ResourceMonitor`` in the kernel, say). Every reader of one process
therefore shares a *board*: a small file with a slot per reader. Whoever
reads and resets the mark folds the value into every reader's slot, under a
file lock; each reader takes the largest value collected in its own slot
since its previous take.

Boards live in nbmon's private per-user directory (:mod:`nbmon.private`),
never in /dev/shm: another user can neither plant one nor read one. A
board is opened without following links and checked on its descriptor, read
and written with ``pread``/``pwrite`` (never mapped: a file truncated under
a mapping kills the reader with SIGBUS), its content validated on every
read; its lock is taken without blocking, with a deadline. A board that
cannot be had -- a full disk, an unsafe directory, a lock held too long --
turns exact peaks off for that process with a reason in words
(:attr:`PeakMark.error`), never a hang, an exception or a signal. Boards
are named by the target's pid *and* start time (a reused pid never shares a
dead process's board), removed by their last reader, at interpreter exit,
and swept when their process is gone (by the first mark a monitor opens
as it starts, and at most once a minute by any other).

A mark's three descriptors (clear_refs, status, its board) count against
the fd budget of :mod:`.procfs`, as the tree's own files do: beyond it a
mark opens them for each take and closes them again, so a pool of 500
children under ``ulimit -n 256`` keeps as few descriptors open with exact
peaks as without.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import os
import struct
import time
import weakref

from ...private import alive, open_private, pid_started, private_dir, started_in
from ..procfs import BUDGET, pread, read_path

CLEAR_REFS_RESET_PEAK = b"5"   # proc(5): resets the peak RSS (VmHWM) to the current RSS
SLOTS = 32                     # readers of one process at a time
_MAGIC = 0x6E626D6F6E504B32    # "nbmonPK2"
# The board, as int64: magic, slots in use (high-water index), then per
# slot: reader pid (0 = free), reader start time (ticks), peak kB collected.
_HEADER, _SLOT = 2, 3
_WORDS = _HEADER + _SLOT * SLOTS
_BOARD = struct.Struct(f"<{_WORDS}q")
_MAX_KB = 1 << 40              # no process has a PiB: a larger value is not a peak
OPEN_WAIT_S = 1.0              # how long opening waits for a board's lock
TAKE_WAIT_S = 0.05             # how long a take waits (then it skips: the mark keeps the peak)
SWEEP_EVERY_S = 60.0
_open_marks: "weakref.WeakSet[PeakMark]" = weakref.WeakSet()
_swept_at = [-SWEEP_EVERY_S]
_me: list[int] = []            # (pid, start time) of this process, after a fork too


def _self() -> tuple[int, int]:
    pid = os.getpid()
    if not _me or _me[0] != pid:
        _me[:] = [pid, pid_started(pid) or 0]
    return _me[0], _me[1]


def _lock(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)


def sweep(directory: str) -> int:
    """Remove the boards of processes that are gone; returns how many."""
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        pid, _, started = name.partition("-")
        if not (pid.isdigit() and started.isdigit()) or alive(int(pid), int(started)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed += 1
        except OSError:
            pass
    return removed


def sweep_at_next_open() -> None:
    """The next mark opened sweeps first, however recent the last sweep: a
    monitor starts (a tree killed with its readers left their boards)."""
    _swept_at[0] = -SWEEP_EVERY_S


class PeakMark:
    """One reader's share of one process's high-water mark.

    :meth:`open` returns False (and says why in :attr:`error`) when the
    mark cannot be reset here: another user's process, no clear_refs, no
    usable board. :meth:`take_kb` returns the process's peak RSS in KiB
    since this reader's previous take (or since open), and resets the mark;
    NaN if it is unknown now (the process exited, or the board was busy:
    the next take then has it).

    A mark keeps its three descriptors (clear_refs, status, the board) open
    while :data:`~.procfs.BUDGET` grants all three; otherwise it opens them
    for each use and closes them after, checking by the start time that the
    pid still names its process (a path names whoever has the pid now).
    """

    def __init__(self, pid: int):
        self.pid = pid
        self.error = ""
        self.path = ""
        self.started = -1
        self._fds: tuple[int, int, int] | None = None   # (clear_refs, status, board), kept
        self._slot = -1

    @property
    def kept(self) -> bool:
        return self._fds is not None

    def open(self) -> bool:
        started = pid_started(self.pid)
        if started is None:
            self.error = f"no process {self.pid}"
            return False
        self.started = started
        try:
            target = self._open_target()
        except OSError as err:  # another user's process, a kernel without clear_refs, no descriptor left
            self.error = f"cannot reset the high-water mark of pid {self.pid}: {err.strerror or err}"
            return False
        keep = BUDGET.take(3)
        board = -1
        try:
            directory = private_dir("peaks")
            if time.monotonic() - _swept_at[0] >= SWEEP_EVERY_S:
                _swept_at[0] = time.monotonic()
                sweep(directory)
            self.path = os.path.join(directory, f"{self.pid}-{started}")
            board = self._locked_board(OPEN_WAIT_S)
            if board < 0:
                raise OSError(errno.EWOULDBLOCK, f"its board {self.path} stayed locked for {OPEN_WAIT_S:g} s")
            self._join(board, *target)
            fcntl.flock(board, fcntl.LOCK_UN)
        except BaseException as err:
            _close(*target)
            if board >= 0:
                os.close(board)
            if keep:
                BUDGET.give_back(3)
            if not isinstance(err, OSError):
                raise
            self.error = f"no board for pid {self.pid}'s peaks: {err}"
            return False
        if keep:
            self._fds = (*target, board)
        else:
            _close(*target, board)
        _open_marks.add(self)
        return True

    def _open_target(self) -> tuple[int, int]:
        """clear_refs and status of the process, opened now; then checked to
        be this process's (it held the pid after they were opened)."""
        clear = os.open(f"/proc/{self.pid}/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            status = os.open(f"/proc/{self.pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            os.close(clear)
            raise
        try:   # read with the GIL held: on every take of a mark beyond the budget
            same = started_in(read_path(f"/proc/{self.pid}/stat", 1024)) == self.started
        except (OSError, ValueError, IndexError):
            same = False
        if not same:
            _close(clear, status)
            raise ProcessLookupError(errno.ESRCH, f"pid {self.pid} is gone", f"/proc/{self.pid}")
        return clear, status

    def _locked_board(self, wait_s: float) -> int:
        """A descriptor of the board, locked (-1 if its lock stayed held for
        ``wait_s``): the kept one, or one opened now (made if missing) of
        the file at its name -- not one its last reader removed meanwhile."""
        if self._fds is not None:
            return self._fds[2] if _lock(self._fds[2], wait_s) else -1
        deadline = time.monotonic() + wait_s
        while True:
            fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
            if not _lock(fd, max(0.0, deadline - time.monotonic())):
                os.close(fd)
                return -1
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                return fd
            os.close(fd)

    def _release(self, board: int) -> None:
        fcntl.flock(board, fcntl.LOCK_UN)
        if self._fds is None:
            os.close(board)

    def _join(self, board: int, clear: int, status: int) -> None:
        # Room first: the disk (tmpfs) may be full, and the board must
        # never be short of what is written into it.
        os.posix_fallocate(board, 0, _BOARD.size)
        words = _read(board)
        # What the mark holds now belongs to the readers already there.
        self._fold(words, _read_kb(clear, status))
        self._slot = self._claim(words)
        _write(board, words)

    @staticmethod
    def _slots(board: list[int]):
        return range(_HEADER, _HEADER + _SLOT * board[1], _SLOT)

    @staticmethod
    def _claim(board: list[int]) -> int:
        me = _self()
        for slot in range(SLOTS):
            base = _HEADER + _SLOT * slot
            if not (board[base] and (tuple(board[base:base + 2]) == me or alive(board[base], board[base + 1]))):
                board[base:base + 3] = [me[0], me[1], 0]
                board[1] = max(board[1], slot + 1)
                return base
        raise OSError(errno.EUSERS, f"more than {SLOTS} readers of one process's peak")

    def _fold(self, board: list[int], peak_kb: float) -> None:
        if peak_kb != peak_kb:
            return
        value = min(int(peak_kb), _MAX_KB)
        for base in self._slots(board):
            if board[base] and board[base + 2] < value:
                board[base + 2] = value

    def take_kb(self) -> float:
        if self._slot < 0:
            return float("nan")
        try:
            clear, status = self._fds[:2] if self._fds is not None else self._open_target()
        except OSError:  # the process is gone (or no descriptor is left now: the next take has it)
            return float("nan")
        try:
            board = self._locked_board(TAKE_WAIT_S)
        except OSError:
            board = -1
        if board < 0:
            if self._fds is None:
                _close(clear, status)
            return float("nan")
        try:
            words = _read(board)
            try:
                self._fold(words, _read_kb(clear, status))
            except OSError:  # the process is gone
                return float("nan")
            base = self._slot
            if tuple(words[base:base + 2]) != _self():  # the board was started over: join again
                self._slot = base = self._claim(words)
            peak = words[base + 2]
            words[base + 2] = 0
            _write(board, words)
        except OSError:
            return float("nan")
        finally:
            self._release(board)
            if self._fds is None:
                _close(clear, status)
        return float(peak) if peak else float("nan")

    def close(self) -> None:
        """Leave the board (removed with its last reader)."""
        if self._slot >= 0:
            try:
                board = self._locked_board(TAKE_WAIT_S)
            except OSError:
                board = -1
            if board >= 0:
                try:
                    words = _read(board)
                    if tuple(words[self._slot:self._slot + 2]) == _self():
                        words[self._slot:self._slot + 3] = [0, 0, 0]
                    if not any(words[b] and alive(words[b], words[b + 1]) for b in self._slots(words)):
                        os.unlink(self.path)
                    else:
                        _write(board, words)
                except OSError:
                    pass
                finally:
                    self._release(board)
        self.abandon()

    def abandon(self) -> None:
        """Drop this copy without touching the board (a forked child's copy:
        the slot is its parent's)."""
        self._slot = -1
        _open_marks.discard(self)
        fds, self._fds = self._fds, None
        if fds is not None:
            _close(*fds)
            BUDGET.give_back(3)


def _read(board: int) -> list[int]:
    """The board's words; a board that is not one (new, short, or garbage)
    starts over empty."""
    data = os.pread(board, _BOARD.size, 0)
    words = list(_BOARD.unpack(data)) if len(data) == _BOARD.size else []
    if not words or words[0] != _MAGIC or not 0 <= words[1] <= SLOTS \
            or any(not 0 <= w <= _MAX_KB for w in words[_HEADER + 2::_SLOT]):
        words = [_MAGIC, 0] + [0] * (_SLOT * SLOTS)
    return words


def _write(board: int, words: list[int]) -> None:
    os.pwrite(board, _BOARD.pack(*words), 0)


def _read_kb(clear: int, status: int) -> float:
    """The mark now, in KiB, and reset it. (Not getrusage's ru_maxrss for
    this process: it keeps the mark each exiting thread saw, for good.)"""
    text = pread(status, 4096)
    at = text.find(b"VmHWM:")
    if at < 0:  # exited (a zombie has no memory)
        return float("nan")
    peak = float(text[at + 6:text.index(b"kB", at)])
    os.write(clear, CLEAR_REFS_RESET_PEAK)
    return peak


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _close_all_at_exit() -> None:
    for mark in list(_open_marks):
        mark.close()


def _forget_all_in_child() -> None:
    for mark in list(_open_marks):
        mark.abandon()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)
