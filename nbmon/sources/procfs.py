"""Reading /proc files without giving up the GIL, within an fd budget.

``os.pread`` releases the GIL around the system call; a sampler thread then
has to win the GIL back from a busy main thread, which takes up to a whole
switch interval (5 ms) per read: one psutil sample took 21 ms of wall time
and 8-11 context switches on a busy kernel. A /proc read takes microseconds,
so holding the GIL through it (libc ``pread``, and ``open``/``close`` for
files read by path, called through ``ctypes.PyDLL``) costs the main thread
far less than the hand-offs do. Long reads (``smaps_rollup`` of a big
process: milliseconds) go through :func:`read_path_released`, which lets
the kernel's threads run meanwhile.

Descriptors kept open between samples save an open and a close per read,
but each one is taken from the watched process's own ``RLIMIT_NOFILE``
when nbmon samples from a thread inside it: a pool of 200 workers read
through kept-open files once held 1,024 fds, and the user's own ``open()``
failed with EMFILE. :data:`BUDGET` caps what every nbmon source of this
process keeps open together (:func:`fd_budget`: 64 or 5 % of the soft
limit, whichever is smaller); beyond it files are read by path.
"""
from __future__ import annotations

import ctypes
import errno
import os
import resource
import threading

# nbmon's own helper processes (the process backend's sampler): never part of
# a watched tree, though they are children of the process they watch.
EXCLUDED: set[int] = set()

BUFFER_SIZE = 65536  # a children list of a few thousand pids fits
CHILDREN_SIZE = 1 << 20   # a children list: ~150,000 pids
MAX_KEPT_FDS = 64
KEPT_SHARE = 0.05

try:
    _libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held
    _pread = _libc.pread
    _pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
    _pread.restype = ctypes.c_ssize_t
    _open = _libc.open
    _open.argtypes = (ctypes.c_char_p, ctypes.c_int)
    _open.restype = ctypes.c_int
    _close = _libc.close
    _close.argtypes = (ctypes.c_int,)
    _close.restype = ctypes.c_int
except (OSError, AttributeError):  # no libc symbol table (not Linux): plain os calls
    _pread = _open = _close = None

_local = threading.local()  # one buffer per thread: a thread switch may fall between read and copy
_string_at = ctypes.string_at
_READ_ONLY = os.O_RDONLY | os.O_CLOEXEC
# A file that is gone: the process exited (ENOENT, ESRCH), or was never ours to read.
GONE = (errno.ENOENT, errno.ESRCH)


def _oserror(path: str | None = None) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err), path) if path else OSError(err, os.strerror(err))


def _buffer(size: int):
    """This thread's read buffer, at least ``size`` bytes (it only grows for
    a file that needs it: a children list of thousands)."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        grown = ctypes.create_string_buffer(max(size, BUFFER_SIZE))
        if buf is not None:
            ctypes.memmove(grown, buf, len(buf))
        buf = _local.buf = grown
    return buf


def pread(fd: int, size: int = BUFFER_SIZE) -> bytes:
    """The first ``size`` bytes of the file open on ``fd`` (all of it when
    shorter). A /proc file comes a page per read (seq_file): a children list
    of a pool of 1,000 is two pages, so reads go on until the file ends."""
    if _pread is None:
        data = b""
        while len(data) < size:
            chunk = os.pread(fd, size - len(data), len(data))
            if not chunk:
                break
            data += chunk
        return data
    buf = _buffer(min(size, BUFFER_SIZE))
    total = 0
    while total < size:
        if total == len(buf):
            buf = _buffer(min(size, 2 * len(buf)))
        n = _pread(fd, ctypes.addressof(buf) + total, min(size, len(buf)) - total, total)
        if n < 0:
            raise _oserror()
        if n == 0:
            break
        total += n
    return _string_at(buf, total)


def open_path(path: str) -> int:
    """``os.open(path, O_RDONLY | O_CLOEXEC)``, the GIL held."""
    if _open is None:
        return os.open(path, _READ_ONLY)
    fd = _open(path.encode(), _READ_ONLY)
    if fd < 0:
        raise _oserror(path)
    return fd


def close(fd: int) -> None:
    if _close is None:
        os.close(fd)
    elif _close(fd) < 0:
        raise _oserror()


def read_path(path: str, size: int = BUFFER_SIZE) -> bytes:
    """Open, read and close a (small) /proc file, the GIL held throughout."""
    fd = open_path(path)
    try:
        return pread(fd, size)
    finally:
        close(fd)


def read_path_released(path: str) -> bytes:
    """A whole file whose read may take milliseconds (``smaps_rollup``),
    with the GIL released, so the kernel's own threads run meanwhile."""
    fd = os.open(path, _READ_ONLY)
    try:
        data = b""
        while chunk := os.read(fd, BUFFER_SIZE):
            data += chunk
        return data
    finally:
        os.close(fd)


def fd_budget() -> int:
    """How many descriptors nbmon may keep open in this process:
    ``min(64, 5 % of the soft RLIMIT_NOFILE)``."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return MAX_KEPT_FDS
    return max(0, min(MAX_KEPT_FDS, int(soft * KEPT_SHARE)))


def free_fds() -> tuple[int, int]:
    """(how many descriptors this process may still open, its soft
    RLIMIT_NOFILE); (-1, -1) where that cannot be told (no limit, no fd
    listing), none free when even listing them fails (EMFILE)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return -1, -1
    if soft == resource.RLIM_INFINITY:
        return -1, -1
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, soft - len(os.listdir(listing))), soft
        except FileNotFoundError:
            continue
        except OSError:
            return 0, soft
    return -1, -1


class FdBudget:
    """Counts the descriptors nbmon's sources keep open in this process;
    ``take(n)`` grants all ``n`` or none. The limit is read again at each
    take, so a lowered ``ulimit -n`` is honoured from then on."""

    def __init__(self, limit=fd_budget):
        self._limit = limit
        self._lock = threading.Lock()
        self.held = 0

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self._limit():
                return False
            self.held += n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self.held = max(0, self.held - n)


BUDGET = FdBudget()


def _reset_after_fork() -> None:
    # A forked child starts with its parent's count but closes the copies it inherited.
    BUDGET._lock = threading.Lock()
    BUDGET.held = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class ProcFile:
    """A /proc file read again and again: through a descriptor kept open
    while :data:`BUDGET` grants one, by path otherwise. Opening raises
    OSError when the file is not there. A kept descriptor of
    ``/proc/<pid>/...`` stays bound to that process (reads fail once it
    exits, even if its pid is reused); a path does not, so callers that
    read by path check the process's start time."""

    __slots__ = ("path", "fd")

    def __init__(self, path: str, keep: bool = True):
        self.path = path
        self.fd = -1
        if keep and BUDGET.take(1):
            try:
                self.fd = open_path(path)
            except OSError:
                BUDGET.give_back(1)
                raise
        elif not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)

    @property
    def kept(self) -> bool:
        return self.fd >= 0

    def read(self, size: int = BUFFER_SIZE) -> bytes:
        if self.fd >= 0:
            return pread(self.fd, size)
        return read_path(self.path, size)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                close(fd)
            finally:
                BUDGET.give_back(1)
