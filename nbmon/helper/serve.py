"""The helper process that hosts a kernel's session
(:class:`nbmon.helper.host.SessionHost`): ``python -I -c ... nbmon.helper.serve:main
KERNEL_PID PARENT_PID KERNEL``, started by :class:`nbmon.kernel.remote.RemoteHost`.

Its main thread answers the kernel's calls one at a time, in order, and
hands the page's comm messages to the widgets; the host's own threads (the
sampler, the consumers, a live view's refresher, a meter's feed) send their
frames through the same locked pipe. Widgets are the usual ones
(ipywidgets, anywidget): ``comm.create_comm`` makes a
:class:`PipeComm`, whose traffic the kernel relays to the page.
"""
from __future__ import annotations

import functools
import importlib
import os
import queue
import select
import signal
import sys
import threading

from ..launch import StartError, write_all
from .protocol import CALLS, NOTES, Reader, check, pack

PARENT_CHECK_S = 1.0


def _import_pynvml() -> None:
    from ..sources.gpus import nvml

    nvml.library()   # pynvml, where the machine has NVML's library


# What the helper imports in the background as it starts.
WARMED = (functools.partial(importlib.import_module, "psutil"), _import_pynvml,
          functools.partial(importlib.import_module, "nbmon.views.meter"))


class Pipe:
    """Frames to the kernel, from any thread."""

    def __init__(self, fd: int):
        self.fd, self.lock = fd, threading.Lock()

    def send(self, kind: bytes, head, buffers=()) -> None:
        data = pack(kind, head, buffers)
        with self.lock:
            write_all(self.fd, data)


class Queued:
    """Frames sent on a thread of their own, started at need: whoever sends
    one (the consumers' thread, which writes the black box: a memory
    warning, the memory guard's stop) never waits for the kernel to read it
    (its pipe full while a C call holds its GIL). At most :data:`KEPT` wait,
    later ones are dropped; the thread ends once :data:`IDLE_S` pass without one."""

    KEPT = 8
    IDLE_S = 1.0

    def __init__(self, pipe: Pipe):
        self.pipe = pipe
        self._frames: queue.Queue[tuple[bytes, dict]] = queue.Queue(self.KEPT)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, kind: bytes, head: dict) -> None:
        try:
            self._frames.put_nowait((kind, head))
        except queue.Full:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nbmon-queued", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                kind, head = self._frames.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._frames.empty():   # else a frame came meanwhile: this thread takes it
                        self._thread = None
                        return
                continue
            try:
                self.pipe.send(kind, head)
            except OSError:   # the kernel is gone, and whom the frame was for
                pass


class Outlet:
    """What the host sends on its own: outputs shown or updated by display id;
    lines for the running cell and the memory guard's stops (:class:`Queued`)."""

    def __init__(self, pipe: Pipe):
        self.pipe = pipe
        self.queued = Queued(pipe)

    def update(self, display_id: str, bundle: dict) -> None:
        self.pipe.send(b"U", {"display_id": display_id, "bundle": bundle})

    def say(self, text: str) -> None:
        self.queued.put(b"P", {"text": text})

    def stop_cell(self, number: int | None, text: str) -> None:
        self.queued.put(b"G", {"cell": number, "text": text})

    def show(self, display_id: str, bundle: dict) -> None:
        self.pipe.send(b"D", {"display_id": display_id, "bundle": bundle})


# The header of the page's message the main thread is handing to a widget:
# what the widget sends meanwhile answers it (see PipeComm).
_answering = threading.local()


def pipe_comm_class(pipe: Pipe):
    from comm.base_comm import BaseComm

    class PipeComm(BaseComm):
        """A widget's comm whose far end is the kernel's relay. What it
        sends while handling one of the page's messages carries that
        message's header: the kernel sends it as the answer to that message
        (a page waits for its request_state's own answer), not to the one its
        shell handled last."""

        _kinds = {"comm_open": b"O", "comm_msg": b"M", "comm_close": b"C"}

        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys) -> None:
            head = {"comm_id": self.comm_id, "data": data, "metadata": metadata}
            if msg_type == "comm_open":
                head["target_name"] = keys.get("target_name") or self.target_name
            answered = getattr(_answering, "header", None)
            if answered is not None:
                head["parent"] = answered
            pipe.send(self._kinds[msg_type], head, buffers or ())

    return PipeComm


PR_SET_PDEATHSIG = 1


def _wake_when_orphaned() -> None:
    """A helper stopped (SIGSTOP, a debugger's stop) when its kernel is
    killed would stay stopped for good: Linux sends it SIGCONT as the
    kernel (the thread that started it) ends, and it then sees it is gone."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGCONT))
    except (OSError, AttributeError):   # not Linux: a stopped helper waits for its SIGCONT
        pass


def main(argv: list[str]) -> int:
    from ..launch import EXCLUDED

    pid, parent, kernel, answers = int(argv[0]), int(argv[1]), argv[2] == "1", Pipe(int(argv[3]))
    EXCLUDED.add(os.getpid())   # a child of the kernel it watches, never part of its tree
    _wake_when_orphaned()
    if os.getppid() != parent:   # the parent died while we started
        return 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C in a terminal is for the kernel
    import comm

    from .host import SessionHost

    pipe = Pipe(sys.stdout.fileno())
    comm_class = pipe_comm_class(pipe)
    comm.create_comm = lambda *args, **kwargs: comm_class(*args, **kwargs)
    host = SessionHost(pid, Outlet(pipe), kernel=kernel)
    host.pending = []   # a cell's summary is made once its kernel has its answer
    # What the first %%resmon cell's wait would import (its monitor's psutil and
    # pynvml, its meter's widgets): imported now, here, while the kernel runs on.
    threading.Thread(target=_warm, name="nbmon-warmup", daemon=True).start()
    reader = Reader(sys.stdin.fileno())
    while True:
        if not reader.buffered():
            ready, _, _ = select.select([reader.fd], [], [], PARENT_CHECK_S)
            if os.getppid() != parent:
                break
            if not ready:
                continue
        frame = reader.read()   # a whole frame: the kernel writes each in one go
        if frame is None:
            break
        kind, head, buffers = frame
        if kind == b"B":
            host.close()
            return 0
        if kind == b"Q":
            answers.send(b"R", *_answer(host, head))
            try:
                host.after()
            except Exception:  # noqa: BLE001 - the call that needs that work does it again, and says why
                pass
        elif kind == b"N":
            _noted(host, head)
        elif kind in (b"m", b"c"):
            _from_page(kind, head, buffers)
    # The kernel is gone without a word (killed): what it leaves, the black
    # box above all, stays for the post-mortem; nothing is cleaned up.
    os._exit(0)


def _warm() -> None:
    try:   # the user's first cells come first: on Linux a thread has a nice value of its own
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
    for warm in WARMED:
        try:
            warm()
        except Exception:  # noqa: BLE001 - its own import, where used, will say why
            pass


def _answer(host, head) -> tuple[dict, list]:
    """The reply to a call: its value (a dict's "buffers" go as the frame's), or its error in one line."""
    method, args, kwargs = head.get("method"), head.get("args", ()), head.get("kwargs", {})
    try:
        check(method, args, kwargs, CALLS)
    except TypeError as err:
        return {"id": head.get("id"), "error": f"not a call the host takes: {err}"}, []
    try:
        value = getattr(host, method)(*args, **kwargs)
    except (StartError, ValueError) as err:   # nbmon's own sentences
        return {"id": head["id"], "error": str(err)}, []
    except Exception as err:  # noqa: BLE001 - said in the kernel, in one line
        return {"id": head["id"], "error": f"{type(err).__name__}: {err}" if str(err) else type(err).__name__}, []
    buffers = value.pop("buffers", []) if isinstance(value, dict) else []
    return {"id": head["id"], "value": value}, buffers


def _noted(host, head) -> None:
    try:
        check(head.get("method"), head.get("args", ()), {}, NOTES)
        getattr(host, head["method"])(*head.get("args", ()))
    except Exception:  # noqa: BLE001 - a note has no one to answer; the next call will say
        pass


def _from_page(kind: bytes, head, buffers) -> None:
    import comm

    target = comm.get_comm_manager().comms.get(head.get("comm_id"))
    if target is None:
        return
    msg = {"content": {"comm_id": head["comm_id"], "data": head.get("data")}, "buffers": buffers}
    _answering.header = head.get("parent")
    try:
        if kind == b"m":
            target.handle_msg(msg)
        else:
            target.handle_close(msg)
    except Exception:  # noqa: BLE001 - a widget's handler must not end the host
        pass
    finally:
        _answering.header = None
