"""Reading /proc files without giving up the GIL.

``os.pread`` releases the GIL around the system call; a sampler thread then
has to win the GIL back from a busy main thread, which takes up to a whole
switch interval (5 ms) per read: one psutil sample took 21 ms of wall time
and 8-11 context switches on a busy kernel. A /proc read takes microseconds,
so holding the GIL through it (libc ``pread`` called through
``ctypes.PyDLL``) costs the main thread far less than the hand-offs do.
"""
from __future__ import annotations

import ctypes
import os
import threading

BUFFER_SIZE = 65536  # a children list of a few thousand pids fits

try:
    _pread = ctypes.PyDLL(None, use_errno=True).pread  # PyDLL: the GIL stays held
    _pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
    _pread.restype = ctypes.c_ssize_t
except (OSError, AttributeError):  # no libc symbol table (not Linux): plain os.pread
    _pread = None

_local = threading.local()  # one buffer per thread: a thread switch may fall between read and copy
_string_at = ctypes.string_at


def pread(fd: int, size: int = BUFFER_SIZE) -> bytes:
    """The first ``size`` (at most BUFFER_SIZE) bytes of the file open on ``fd``."""
    if _pread is None:
        return os.pread(fd, size, 0)
    try:
        buf = _local.buf
    except AttributeError:
        buf = _local.buf = ctypes.create_string_buffer(BUFFER_SIZE)
    n = _pread(fd, buf, size, 0)
    if n < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return _string_at(buf, n)
