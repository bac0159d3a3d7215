"""The kernel's side of the session host in a helper process
(:mod:`nbmon.helper.serve`): :class:`RemoteHost`, and the pipe's frames.

The kernel keeps only this: three pipes and one relay thread
(``nbmon-relay``). A call (:meth:`RemoteHost.call`) is a request frame on
the helper's stdin, and its caller reads the answer, bounded, from a pipe
of answers alone (no thread to wake on the way); the cell hooks' notes go
one way. On its stdout the helper sends, in order, what the host does on
its own, which the relay thread carries out: a widget's comm traffic
(opened, sent to, closed: the relay makes each a comm of the kernel's with
the same id, and sends the page's messages back), outputs shown or updated
by display id, and lines for the running cell. Nothing the helper sends is
executed: a frame is data for a comm, a display or a print.

The frames and what the kernel may call and note are
:mod:`nbmon.helper.protocol`'s. The helper exits when its stdin closes: told to by ``bye`` (the kernel exits
normally: the black box goes), or not (the kernel died: the box stays for
the post-mortem), and when its parent is gone.
"""
from __future__ import annotations

import atexit
import os
import select
import signal
import threading
import time
import weakref

from ..helper.protocol import CALLS, NOTES, HostCalls, Reader, check, pack
from ..launch import EXCLUDED, spawn, write_all

START_TIMEOUT_S = 30.0        # the helper's imports, on a loaded machine
CALL_TIMEOUT_S = 10.0
# What the helper imports: found where this process finds them (nbmon.launch).
IMPORTS = ("nbmon", "numpy", "psutil", "pynvml", "traitlets", "comm", "ipywidgets", "anywidget", "plotly",
           "_plotly_utils", "IPython", "pandas")
_hosts: "weakref.WeakSet[RemoteHost]" = weakref.WeakSet()


class HostError(RuntimeError):
    """The session host did not answer (gone, stuck), or its call failed: one sentence."""


class RemoteHost(HostCalls):
    """The session host (:class:`nbmon.helper.host.SessionHost`) of kernel
    ``pid``, run in a helper process; its methods are called by name
    (``host.cell_open(...)``) and answer plain data, or raise
    :class:`HostError`. ``outlet`` shows what the host sends on its own
    (``update(display_id, bundle)``, ``say(text)``)."""

    REMOTE = True

    def __init__(self, pid: int, outlet, *, kernel: bool):
        self.outlet = outlet
        replies, answer = os.pipe()   # answers come on a pipe of their own, read by the caller
        try:
            self.proc = spawn("nbmon.helper.serve:main",
                              [str(pid), str(os.getpid()), "1" if kernel else "0", str(answer)], IMPORTS, (answer,))
        except BaseException:
            os.close(replies)
            raise
        finally:
            os.close(answer)
        EXCLUDED.add(self.proc.pid)
        self.pid = self.proc.pid
        self._out = self.proc.stdin.fileno()
        os.set_blocking(self._out, False)   # a helper that takes nothing (stopped, stuck) never holds a cell
        self._reader = Reader(self.proc.stdout.fileno())
        self._replies = Reader(replies)
        # Closed through these objects only: once closed they know it, where a
        # number may already be another file of the user's (after a fork too).
        self._pipes = (self.proc.stdin.raw, self.proc.stdout.raw, os.fdopen(replies, "rb", buffering=0))
        self._send_lock = threading.Lock()
        self._held: list[bytes] | None = None   # notes held since hold(), sent at release() or the next call
        self._call_lock = threading.Lock()   # one call at a time: its answer is the next on the pipe
        self._next = 0
        self._comms: dict[str, object] = {}
        self.gone: str | None = None   # why the helper can no longer be asked, once it cannot
        self._thread = threading.Thread(target=self._relay, name="nbmon-relay", daemon=True)
        self._thread.start()
        _hosts.add(self)

    # -- calls ----------------------------------------------------------------------
    def call(self, method: str, *args, timeout: float | None = None, **kwargs):
        """``method(*args, **kwargs)`` on the host; its value, or HostError
        (at most ``timeout`` seconds, :data:`CALL_TIMEOUT_S` by default)."""
        timeout = CALL_TIMEOUT_S if timeout is None else timeout
        with self._call_lock:
            with self._send_lock:
                if self.gone:
                    raise HostError(self.gone)
                self._next += 1
                ident = self._next
                deadline = time.monotonic() + timeout
                held, self._held = self._held, [] if self._held is not None else None   # notes before it go first
                try:
                    write_all(self._out, b"".join(held or ()) + pack(b"Q", {"id": ident, "method": method,
                                                                          "args": args, "kwargs": kwargs}), deadline)
                except TimeoutError:
                    raise HostError(self._stuck(f"the helper process took no {method} within {timeout:g} s")) from None
                except OSError as err:
                    raise HostError(f"the helper process cannot be reached ({err.strerror})") from None
            head, buffers = self._answer(ident, method, deadline, timeout)
        if "error" in head:
            raise HostError(head["error"])
        value = head["value"]
        if buffers:
            value["buffers"] = buffers
        return value

    def _answer(self, ident: int, method: str, deadline: float, timeout: float):
        """The answer to call ``ident``, read here (no thread to wake); the
        late answers of calls that gave up waiting are passed over."""
        while True:
            if not self._replies.buffered():
                ready, _, _ = select.select([self._replies.fd], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise HostError(self._stuck(f"the helper process did not answer {method} within {timeout:g} s"))
            frame = self._replies.read()
            if frame is None:
                self.gone = self.gone or "the helper process ended"
                raise HostError(self.gone)
            _, head, buffers = frame
            if head.get("id") == ident:
                return head, buffers

    def note(self, method: str, *args) -> None:
        """``method(*args)`` on the host, without waiting (the cell hooks: a
        frame each way of a cell would be a round trip each)."""
        check(method, args, {}, NOTES)
        self._send(b"N", {"method": method, "args": args})

    def hold(self) -> None:
        """Keep the notes sent from now on until :meth:`release` (or the next
        call) sends them in one write: a cell's start or end sends two or
        three, and each write wakes the helper."""
        with self._send_lock:
            if self._held is None:
                self._held = []

    def release(self) -> None:
        """Send the notes held, and hold no more."""
        with self._send_lock:
            held, self._held = self._held, None
            if held and not self.gone:
                self._write(b"".join(held))

    def _send(self, kind: bytes, head, buffers=()) -> None:
        with self._send_lock:
            if self.gone:
                return
            if kind == b"N" and self._held is not None:
                self._held.append(pack(kind, head, buffers))
                return
            self._write(pack(kind, head, buffers))

    def _write(self, data: bytes) -> None:
        """``data`` down the pipe (the send lock held), by the calls' deadline."""
        try:
            write_all(self._out, data, time.monotonic() + CALL_TIMEOUT_S)
        except TimeoutError:
            self._stuck(f"the helper process took no message for {CALL_TIMEOUT_S:g} s")
        except OSError:
            pass   # the relay thread sees the pipe's end and says why

    def _stuck(self, why: str) -> str:
        """The helper missed a deadline (stopped, stuck, swapped out): it
        is ended, and every later call says so at once; why, in words."""
        self.gone = self.gone or f"{why}; nbmon ended it"
        try:
            self.proc.kill()   # stopped processes too
        except OSError:
            pass
        return self.gone

    def bye(self) -> None:
        """The kernel exits normally, or unloads nbmon: the host stops what it
        runs (the black box goes with the run) and the helper exits."""
        self._send(b"B", {})
        with self._send_lock:
            self.gone = self.gone or "nbmon was unloaded"
            try:
                self.proc.stdin.close()
                self.proc.send_signal(signal.SIGCONT)   # a stopped helper wakes to its end: never left behind
            except OSError:
                pass

    # -- what the helper sends ----------------------------------------------------------
    def _relay(self) -> None:
        try:
            while True:
                frame = self._reader.read()
                if frame is None:
                    break
                kind, head, buffers = frame
                try:
                    self._dispatch(kind, head, buffers)
                except Exception as err:  # never a traceback from this thread
                    self.outlet.say(f"nbmon: a message from the helper process failed ({type(err).__name__}: {err})")
        finally:
            with self._send_lock:
                self.gone = self.gone or "the helper process ended"
            for comm in self._comms.values():
                comm.close()
            self._comms.clear()
            self._reap()

    def _dispatch(self, kind: bytes, head, buffers: list[bytes]) -> None:
        if kind == b"O":
            self._open_comm(head, buffers)
        elif kind == b"M":
            comm = self._comms.get(head["comm_id"])
            if comm is not None and head.get("parent"):
                _answer_page(comm, head, buffers)
            elif comm is not None:
                comm.send(head.get("data"), head.get("metadata"), buffers)
        elif kind == b"C":
            comm = self._comms.pop(head["comm_id"], None)
            if comm is not None:
                comm.close(head.get("data"), head.get("metadata"))
        elif kind == b"U":
            self.outlet.update(head["display_id"], head["bundle"])
        elif kind == b"D":
            self.outlet.show(head["display_id"], head["bundle"])
        elif kind == b"P":
            self.outlet.say(head["text"])
        elif kind == b"G":
            self.outlet.stop_cell(head["cell"], head["text"])

    def _open_comm(self, head, buffers) -> None:
        """The helper opened a widget's comm: open one of the kernel's with
        the same id (the page knows the model by it); the page's messages
        and close go back to the helper."""
        import comm

        ident = head["comm_id"]
        kernel_comm = comm.create_comm(target_name=head["target_name"], data=head.get("data"),
                                       metadata=head.get("metadata"), buffers=buffers, comm_id=ident)
        self._comms[ident] = kernel_comm

        def forward(msg) -> None:
            self._send(b"m", {"comm_id": ident, "data": msg["content"].get("data"), "parent": _plain(msg["header"])},
                       msg.get("buffers") or ())

        def closed(msg) -> None:
            self._comms.pop(ident, None)
            self._send(b"c", {"comm_id": ident, "data": msg["content"].get("data")})

        kernel_comm.on_msg(forward)
        kernel_comm.on_close(closed)

    def _reap(self) -> None:
        try:
            self.proc.wait(5.0)
        except Exception:  # noqa: BLE001 - left to init, which reaps it
            return
        EXCLUDED.discard(self.proc.pid)
        with self._call_lock:   # not while a call still reads its answer
            self._close_pipes()

    def after_fork_in_child(self) -> None:
        """In a forked child (a DataLoader worker): not the kernel. Its copies
        of the pipes go, so that the helper still sees the kernel's end."""
        self.gone = "this is a forked child of the kernel"
        self._call_lock = threading.Lock()   # either may have been held by another thread at the fork
        self._send_lock = threading.Lock()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.close()
            except OSError:
                pass


def _plain(header: dict) -> dict:
    """A message's header as plain data (its date is parsed)."""
    return {key: value.isoformat() if hasattr(value, "isoformat") else value for key, value in header.items()}


def _answer_page(kernel_comm, head, buffers) -> None:
    """The helper's widget answering one of the page's messages (``head``'s
    parent: its header): sent as ipykernel's comm sends, with that message
    as its parent, not the one the kernel's shell handled last. Voila's page
    asks every model's state at once and waits for each its own answer: with
    the shell's parent, a model waited for good, and no widget showed."""
    from ipykernel.jsonutil import json_clean
    from ipykernel.kernelbase import Kernel

    kernel = kernel_comm.kernel or Kernel.instance()
    kernel.session.send(kernel.iopub_socket, "comm_msg",
                        json_clean({"data": head.get("data") or {}, "comm_id": kernel_comm.comm_id}),
                        metadata=json_clean(head.get("metadata") or {}), parent={"header": head["parent"]},
                        ident=kernel_comm.topic, buffers=buffers)


@atexit.register
def _bye_at_exit() -> None:
    for host in list(_hosts):
        host.bye()


def _forwarded(method: str):
    """RemoteHost's ``method``: the protocol's signature, checked here, then the call over the pipe."""
    signature = CALLS[method]

    def forward(self, *args, **kwargs):
        check(method, args, kwargs, CALLS)
        return self.call(method, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = method
    forward.__signature__ = signature
    return forward


for _method in CALLS:
    setattr(RemoteHost, _method, _forwarded(_method))


def _forget_in_child() -> None:
    for host in list(_hosts):
        host.after_fork_in_child()
    _hosts.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
