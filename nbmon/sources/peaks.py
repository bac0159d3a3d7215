"""The peak RSS of a process, shared by every nbmon reader of it.

The kernel keeps one high-water mark per process (VmHWM). Resetting it
(writing 5 to /proc/<pid>/clear_refs, proc(5)) resets it for everybody, so
two monitors that each reset it steal each other's peaks: a dashboard's
helper process and a ``ResourceMonitor`` in the kernel, say. Every nbmon
reader of a process therefore goes through one shared *board* per target
process: a small file (in /dev/shm) with a slot per reader. Whoever reads
and resets the mark folds the value it read into every reader's slot,
under a file lock; each reader takes the largest value collected in its
own slot since its previous take. Readers in this process and in other
processes (of the same user) share it alike.

A board is named by the target's pid *and* start time, so a reused pid
never shares a dead process's board; it is removed when its last reader
closes it (boards of readers that were killed are swept on the next open).
"""
from __future__ import annotations

import fcntl
import mmap
import os
import tempfile

from .procfs import pread

CLEAR_REFS_RESET_PEAK = b"5"   # proc(5): resets the peak RSS (VmHWM) to the current RSS
SLOTS = 32                     # readers of one process at a time
_MAGIC = 0x6E626D6F6E504B31    # "nbmonPK1"
# The board, as int64: magic, slots in use (high-water index), then per
# slot: reader pid (0 = free), reader token, peak kB collected for it.
_HEADER, _SLOT = 2, 3
_BOARD_BYTES = 8 * (_HEADER + _SLOT * SLOTS)
_tokens = iter(range(1, 1 << 62))


def _board_dir() -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def start_time_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks after boot."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _taken(owner: int) -> bool:
    """Whether a slot's reader (a pid, 0 for none) still lives: a reader
    killed without closing leaves its slot to be taken over."""
    if not owner or owner == os.getpid():
        return bool(owner)
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class PeakMark:
    """One reader's share of one process's high-water mark.

    :meth:`open` returns False when the mark cannot be reset here (another
    user's process, no clear_refs): peaks are then sampled. :meth:`take_kb`
    returns the process's peak RSS in KiB since this reader's previous take
    (or since open), and resets the mark; NaN if the process has no memory
    left to read (exited).
    """

    def __init__(self, pid: int):
        self.pid = pid
        self._status_fd = self._clear_fd = self._board_fd = -1
        self._view = None
        self._map: mmap.mmap | None = None
        self._slot = -1
        self.path = ""
        self.joined_kb = float("nan")  # the mark when we joined: the process's peak until then

    def open(self) -> bool:
        started = start_time_ticks(self.pid)
        if started is None:
            return False
        try:
            self._clear_fd = os.open(f"/proc/{self.pid}/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
            self._status_fd = os.open(f"/proc/{self.pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # another user's process, or a kernel without clear_refs
            self._close_fds()
            return False
        self.path = os.path.join(_board_dir(), f"nbmon-peak-{os.getuid()}-{self.pid}-{started}")
        try:
            self._join_board()
        except OSError:
            self._close_fds()
            return False
        return True

    def _join_board(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A last reader may have removed the board between our open and
            # our lock: then this is a dead file nobody else will find.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._board_fd = fd
        try:
            if os.fstat(fd).st_size < _BOARD_BYTES:
                os.ftruncate(fd, _BOARD_BYTES)
            self._map = mmap.mmap(fd, _BOARD_BYTES)
            self._view = view = memoryview(self._map).cast("q")
            if view[0] != _MAGIC:
                view[0], view[1] = _MAGIC, 0
            # What the mark holds now belongs to the readers already there.
            self.joined_kb = self._read_kb()
            self._fold(self.joined_kb)
            self._slot = self._claim_slot(view)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    @staticmethod
    def _claim_slot(view) -> int:
        for slot in range(SLOTS):
            base = _HEADER + _SLOT * slot
            if not _taken(view[base]):
                view[base], view[base + 1], view[base + 2] = os.getpid(), next(_tokens), 0
                view[1] = max(view[1], slot + 1)
                return base
        raise OSError(f"more than {SLOTS} readers of one process's peak")

    def _read_kb(self) -> float:
        """The mark now, in KiB, and reset it. (Not getrusage's ru_maxrss for
        this process: it keeps the mark each exiting thread saw, for good.)"""
        status = pread(self._status_fd, 4096)
        at = status.find(b"VmHWM:")
        if at < 0:  # exited (a zombie has no memory)
            return float("nan")
        peak = float(status[at + 6:status.index(b"kB", at)])
        os.write(self._clear_fd, CLEAR_REFS_RESET_PEAK)
        return peak

    def _fold(self, peak_kb: float) -> None:
        if peak_kb != peak_kb:
            return
        view, value = self._view, int(peak_kb)
        for base in range(_HEADER, _HEADER + _SLOT * view[1], _SLOT):
            if view[base] and view[base + 2] < value:
                view[base + 2] = value

    def take_kb(self) -> float:
        fd = self._board_fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            try:
                self._fold(self._read_kb())
            except OSError:  # the process is gone
                return float("nan")
            view, base = self._view, self._slot
            peak = view[base + 2]
            view[base + 2] = 0
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return float(peak) if peak else float("nan")

    def close(self) -> None:
        """Leave the board (removed with its last reader)."""
        if self._board_fd >= 0 and self._slot >= 0:
            fcntl.flock(self._board_fd, fcntl.LOCK_EX)
            try:
                view = self._view
                view[self._slot] = view[self._slot + 1] = view[self._slot + 2] = 0
                if not any(_taken(view[b]) for b in range(_HEADER, _HEADER + _SLOT * view[1], _SLOT)):
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
            finally:
                fcntl.flock(self._board_fd, fcntl.LOCK_UN)
        self.abandon()

    def abandon(self) -> None:
        """Drop this copy without touching the board (a forked child's copy:
        the slot is its parent's)."""
        self._slot = -1
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._map is not None:
            self._map.close()
            self._map = None
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in (self._status_fd, self._clear_fd, self._board_fd):
            if fd >= 0:
                os.close(fd)
        self._status_fd = self._clear_fd = self._board_fd = -1
