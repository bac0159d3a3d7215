"""The memory guard's hand in the kernel: the running cell stopped with
:class:`MemoryGuardError` when the session's guard asks
(:mod:`nbmon.postmortem.memguard` decides, in the helper).

The error is raised in the kernel's main thread as an asynchronous
exception (``PyThreadState_SetAsyncExc``): at the next Python instruction
the cell's code runs, so its frames unwind and free what they held, and a
user's ``except MemoryError:`` takes it (the traceback IPython keeps of an
uncaught one lets go of the frames' locals as the cell ends, and glibc's
heap gives the freed memory back: ``%debug`` then shows the stopped
cell's frames without them). Only while the cell it was asked
for runs its code (from ``pre_run_cell`` to ``post_execute``): a stop that
comes as the cell ends is dropped, and one still pending then is withdrawn,
so the next cell never gets it. It is withdrawn by one of ours, raised and
caught at once: ``PyThreadState_SetAsyncExc(id, NULL)`` leaves the
interpreter's signal for it set (CPython 3.11 and 3.12), and with a profiler
or tracer on (cProfile, ``%prun``, a debugger) 3.11 then loops forever at the
next function's start.
"""
from __future__ import annotations

import ctypes
import inspect
import sys
import threading

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
_set_async_exc.restype = ctypes.c_int
_MAIN_THREAD_ID = threading.main_thread().ident   # the kernel's, where cells run


try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim   # glibc's
except AttributeError:
    _malloc_trim = None


class MemoryGuardError(MemoryError):
    """nbmon stopped the running cell before the OOM killer would kill the
    kernel (``%resmon --memory-guard``); the kernel and its variables are kept."""

    def __init__(self, *args):
        super().__init__(*(args or (_said[0],)))


_said = ["nbmon stopped this cell before the OOM killer would kill the kernel; your variables are kept"]
_lock = threading.Lock()
_OPTIMIZED = inspect.CO_OPTIMIZED   # a function's frame: fast locals
_running: list = [None]   # [the number of the cell whose code runs], or [None]
_stopped = [False]        # the guard stopped the cell that runs


def cell_runs(number) -> None:
    """pre_run_cell: cell ``number``'s code runs from now on."""
    with _lock:
        _running[0] = number


class _Withdrawn(Exception):
    """Takes the place of a stop still pending as its cell ends, and is caught at once."""


def _delivered() -> None:
    """A Python function's start: where a pending asynchronous exception is raised."""


def cell_ran() -> None:
    """post_execute: its code ended; a stop still pending is withdrawn. A
    cell the guard stopped lets go of its frames' memory: the traceback
    IPython keeps of it (``sys.last_traceback``) no longer holds their locals."""
    with _lock:
        _running[0] = None
        stopped, _stopped[0] = _stopped[0], False
    if stopped:
        try:
            _set_async_exc(_MAIN_THREAD_ID, id(_Withdrawn))   # this thread: raised at its next call
            _delivered()
        except _Withdrawn:
            pass
        if isinstance(getattr(sys, "last_value", None), MemoryGuardError):
            _let_go(sys.last_traceback)
        if _malloc_trim is not None:   # what the frames held goes back to the container, not to malloc's heap
            _malloc_trim(0)


def _let_go(tb) -> None:
    """The finished frames of a traceback hold nothing any more: their
    locals, and the copy of them a traceback's formatting took (IPython
    keeps it until the next error), so what they held is freed now."""
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
        # A function's locals are a copy, its own; any other frame's are a namespace (the user's).
        copy = frame.f_locals if frame.f_code.co_flags & _OPTIMIZED else None
        try:
            frame.clear()
        except RuntimeError:   # still running (the shell's own): its locals are live
            continue
        if copy is not None:
            copy.clear()


def stop(number, text: str) -> bool:
    """Stop cell ``number`` if its code runs now (once); whether it was asked to."""
    with _lock:
        if _running[0] is None or _running[0] != number:
            return False
        _running[0] = None
        _said[0] = text
        _stopped[0] = _set_async_exc(_MAIN_THREAD_ID, id(MemoryGuardError)) == 1
        return _stopped[0]
