"""The session in its helper process (nbmon.kernel.remote / serve): the
pipe's frames, a real helper answering, the widgets' comm traffic relayed
byte for byte, and a helper that dies or stops answering, which never
reaches the user's cell."""
from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from IPython.utils.capture import capture_output

import nbmon
from helpers import in_forked_child, wait_until
from nbmon import launch
from nbmon.kernel import remote
from nbmon.helper.protocol import CALLS, NOTES, Reader, pack, unpack
from nbmon.kernel.remote import RemoteHost
from nbmon.kernel.session import SESSION, Outlet


def test_frames_carry_json_and_buffers_byte_for_byte():
    x = np.arange(5, dtype=np.float64)
    y = np.linspace(0, 1, 7, dtype=np.float32)
    big = os.urandom(5 << 20)   # plotly's bundle is ~5 MB
    buffers = [memoryview(x), memoryview(y), b"", big]   # numpy's count items, not bytes
    frame = pack(b"M", {"comm_id": "c", "data": {"n": 1.5, "nan": float("nan")}}, buffers)
    kind, size = launch.FRAME.unpack_from(frame)
    head, got = unpack(frame[launch.FRAME.size:])
    assert kind == b"M" and size == len(frame) - launch.FRAME.size
    assert head["comm_id"] == "c" and head["data"]["n"] == 1.5 and head["data"]["nan"] != head["data"]["nan"]
    assert got == [x.tobytes(), y.tobytes(), b"", big]


def test_a_reader_joins_frames_split_anyhow_and_stops_at_a_broken_one():
    frames = pack(b"R", {"id": 1, "value": 2}) + pack(b"P", {"text": "hi"}, [b"abc"])
    r, w = os.pipe()
    try:
        reader = Reader(r)
        for k in range(0, len(frames), 3):   # three bytes at a time
            os.write(w, frames[k:k + 3])
        assert reader.read() == (b"R", {"id": 1, "value": 2}, [])
        assert reader.buffered() and reader.read() == (b"P", {"text": "hi"}, [b"abc"])
        os.write(w, launch.FRAME.pack(b"M", launch.MAX_FRAME + 1))   # no sender of ours makes this
        assert reader.read() is None
        os.close(w)
        w = None
        assert Reader(r).read() is None   # the pipe's end
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


class Recorder(Outlet):
    def __init__(self):
        self.updates, self.said = [], []

    def update(self, display_id, bundle):
        self.updates.append((display_id, bundle))

    def say(self, text):
        self.said.append(text)


@pytest.fixture
def relayed(monkeypatch):
    """What the relay opens and sends as the kernel's comms (here: recorded)."""
    import comm
    from comm.base_comm import BaseComm

    got: dict[str, list] = {}

    class Recording(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            got.setdefault(self.comm_id, []).append((msg_type, data, [bytes(b) for b in buffers or ()]))

    monkeypatch.setattr(comm, "create_comm", lambda *args, **kwargs: Recording(*args, **kwargs))
    return got


@pytest.fixture
def host():
    made = RemoteHost(os.getpid(), Recorder(), kernel=True)
    yield made
    made.bye()
    wait_until(lambda: made.gone and not made._thread.is_alive(), what="the helper to end")


def test_both_ends_take_exactly_the_protocols_calls_and_notes(host):
    """The kernel's calls to the host are an interface (protocol.HostCalls,
    HostNotes): the host implements each with its signature, the kernel's
    handle forwards each with the same one, and a call or note that does
    not fit is refused at either end, never run."""
    from nbmon.helper.host import SessionHost

    for table in (CALLS, NOTES):
        for name, signature in table.items():
            assert inspect.signature(getattr(SessionHost, name)) == signature, name
    assert {name: inspect.signature(getattr(RemoteHost, name)) for name in CALLS} == CALLS
    with pytest.raises(TypeError):
        host.info(1)   # refused here, before the pipe
    with pytest.raises(TypeError):
        host.note("cell_started", 1)
    with pytest.raises(remote.HostError, match="not a call the host takes"):
        host.call("close")   # the host has it, the protocol does not: refused there
    assert host.info()["running"] is False


def test_a_live_view_in_the_helper_reaches_the_page_through_the_kernels_comms(host, relayed):
    """The chart's widget lives in the helper; its comm is opened here with
    the same id, its frames arrive with their buffers whole (x float64, one
    float32 y per stream), and a page's message goes back to the widget."""
    view = host.view_open({"interval": 0.05, "gpu": False}, 60.0)
    host.view_start()
    chart = wait_until(lambda: next((cid for cid, msgs in relayed.items()
                                     if msgs[0][1]["state"].get("_nbmon", {}).get("streams")), None),
                       what="the chart's comm")
    state = relayed[chart][0][1]["state"]
    assert state["_nbmon"]["id"] in view["table"]["data"]["text/html"]   # it mounts into the record shown
    appended = wait_until(lambda: [m for m in relayed[chart] if m[0] == "comm_msg"
                                   and m[1].get("content", {}).get("type") == "nbmon:append"], what="a frame")
    _, data, buffers = appended[0]
    (group,) = data["content"]["groups"]
    n = len(buffers[0]) // 8
    assert n >= 1 and [len(b) for b in buffers] == [8 * n] + [4 * n] * len(group["ids"])
    assert np.all(np.diff(np.frombuffer(buffers[0])) > 0)   # seconds, increasing
    # The page missed plotly's bundle and asks the chart for it: the helper's widget answers.
    before = len(relayed[chart])
    host._send(b"m", {"comm_id": chart, "data": {"method": "custom", "content": {"type": "nbmon:bundle"}}})
    wait_until(lambda: any(m[1].get("content", {}).get("type") == "nbmon:bundle" and len(m[2][0]) > 1 << 20
                           for m in relayed[chart][before:]), what="the bundle, asked for")
    finals = host.stop()["views"]
    assert [f["ids"] for f in finals] == [view["ids"]]
    wait_until(lambda: relayed[chart][-1][0] == "comm_close", what="the chart's comm to close")


def test_a_helper_that_dies_is_one_sentence_and_the_next_monitored_cell_starts_another(ip):
    """The helper killed (the OOM killer may pick it): what the user reads
    says so in one line and reads empty, nothing raised, nothing hung; the
    next %%resmon cell starts a new helper, says so, and is monitored."""
    with capture_output():
        ip.run_cell_magic("resmon", "--quiet", "rm_k = 1")
    old = SESSION.host.pid
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: SESSION.host.gone, what="the relay to see the helper's end")
    with capture_output() as cap:
        assert nbmon.history().empty and nbmon.last_summary() is None and nbmon.samples().empty
    assert cap.stderr.strip().splitlines() == ["nbmon: the helper process ended"] * 3
    with capture_output() as cap:
        assert ip.run_cell_magic("resmon", "--label again", "rm_k = 6 * 7\nrm_k") == 42
    assert cap.stderr.strip().splitlines() == [
        "nbmon: the helper process ended; a new helper process watches from here (what the old one held is gone)"]
    assert SESSION.host.pid != old and list(nbmon.history()["label"]) == ["again"]


def test_a_helper_that_stops_answering_never_hangs_the_cell(ip, monkeypatch):
    monkeypatch.setattr(remote, "CALL_TIMEOUT_S", 1.0)
    helper = SESSION.host.pid
    os.kill(helper, signal.SIGSTOP)
    try:
        began = time.monotonic()
        with capture_output() as cap:
            assert ip.run_cell_magic("resmon", "", "rm_h = 1\nrm_h + 1") == 2
        took = time.monotonic() - began
    finally:
        try:
            os.kill(helper, signal.SIGCONT)
        except ProcessLookupError:   # ended already, as it should be
            pass
    assert took < 5.0
    assert cap.stderr.startswith("nbmon: the helper process did not answer cell_open within 1 s")
    # Ended, not waited for again: the next monitored cell has a new helper, and says why.
    why = SESSION.host.gone
    wait_until(lambda: _gone(helper), what="the stopped helper to be ended")
    with capture_output() as cap:
        assert ip.run_cell_magic("resmon", "", "rm_h + 2") == 3
    assert cap.stderr.strip().splitlines() == [
        f"nbmon: {why}; a new helper process watches from here (what the old one held is gone)"]
    assert SESSION.host.pid != helper and not SESSION.host.gone


def test_notes_to_a_helper_that_takes_nothing_never_block(ip, monkeypatch):
    """The cell hooks' one-way notes fill the pipe of a stopped helper: the
    write is bounded, and the helper ended."""
    monkeypatch.setattr(remote, "CALL_TIMEOUT_S", 1.0)
    host, helper = SESSION.host, SESSION.host.pid
    os.kill(helper, signal.SIGSTOP)
    try:
        noting = threading.Thread(target=lambda: [host.note("cell_started", 1, "x" * 60_000) for _ in range(8)])
        noting.start()
        noting.join(10.0)
        blocked = noting.is_alive()
    finally:
        try:
            os.kill(helper, signal.SIGCONT)   # lets a blocked write end
        except ProcessLookupError:   # ended already, as it should be
            pass
        noting.join(10.0)
    assert not blocked
    assert host.gone and "took no message for 1 s" in host.gone, host.gone
    wait_until(lambda: _gone(helper), what="the stopped helper to be ended")


def test_a_fork_while_another_thread_sends_never_deadlocks_the_child(host):
    """A DataLoader worker forked while a thread of the kernel holds the
    lock on the helper's pipe: in the child, nbmon's calls answer at once."""
    with host._send_lock:   # as another thread, mid-send
        answer = in_forked_child(lambda: (host.note("cell_started", 1, "x"), str(host.gone))[1], timeout=10.0)
    assert answer == "this is a forked child of the kernel"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return _zombie(pid)


def _kernel_script(tmp_path, then: str, seconds: float) -> tuple[str, dict]:
    """A kernel stand-in's code (its session's helper started, ``then`` run,
    the helper's pid printed, then ``seconds`` of sleep) and its environment
    (its private directory in ``tmp_path``)."""
    code = ("import time\n"
            "from nbmon.kernel.session import SESSION\n"
            "SESSION.connect(kernel=False)\n"
            f"{then}"
            "print(SESSION.host.pid, flush=True)\n"
            f"time.sleep({seconds})\n")
    os.chmod(tmp_path, 0o700)
    return code, {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}


def test_the_helper_goes_with_the_kernel_and_keeps_nothing_open(tmp_path):
    """A kernel that exits normally says bye: its helper ends, with its monitor
    and its black box; the pipes are the helper's only link."""
    code, env = _kernel_script(tmp_path, "SESSION.host.start({'interval': 0.05, 'gpu': False})\n", 0.5)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    helper = int(done.stdout.split()[0])
    wait_until(lambda: not os.path.exists(f"/proc/{helper}") or _zombie(helper), what="the helper to end")
    assert not os.listdir(tmp_path / "nbmon" / "boxes")   # a normal exit leaves no box


def test_a_stopped_helper_ends_with_its_killed_kernel(tmp_path):
    """The kernel SIGKILLed (no bye) while its helper is stopped: the helper
    does not stay behind, stopped for good."""
    code, env = _kernel_script(tmp_path, "", 120)
    kernel = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        helper = int(kernel.stdout.readline())
        os.kill(helper, signal.SIGSTOP)
        wait_until(lambda: open(f"/proc/{helper}/stat").read().rsplit(")", 1)[1].split()[0] == "T",
                   what="the helper stopped")
    finally:
        kernel.kill()
        kernel.wait(30)
        kernel.stdout.close()
    try:
        wait_until(lambda: _gone(helper), what="the stopped helper to end")
    finally:
        if not _gone(helper):
            os.kill(helper, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):   # gone (reaped between the open and the read)
        return True


def test_nbmon_monitor_from_a_script_is_the_helpers(session):
    monitor = nbmon.monitor(interval=0.05, gpu=False)
    assert session.remote and monitor.running and monitor.interval == 0.05
    assert threading.main_thread().is_alive()
    wait_until(lambda: session.host.info()["samples"] >= 2, what="samples")
    summary = session.stop()
    assert summary.num_samples >= 2 and not monitor.running


def test_a_fork_after_the_helper_ended_leaves_the_childs_descriptors_alone():
    """The helper gone and its pipes closed, their numbers are reused by the
    user's own files; a process forked then (a DataLoader worker) keeps
    every one of them: nbmon's fork hook closes only what nbmon still holds."""
    made = RemoteHost(os.getpid(), Recorder(), kernel=True)
    numbers = {made.proc.stdin.fileno(), made.proc.stdout.fileno(), made._replies.fd}
    made.bye()
    wait_until(lambda: made.gone and not made._thread.is_alive(), what="the helper to end")
    held = []
    while not numbers <= set(held):   # the lowest free numbers first: the helper's old ones
        held.append(os.open(os.devnull, os.O_RDONLY))
    try:
        def child():
            return {fd: _open(fd) for fd in numbers}

        assert all(in_forked_child(child).values())
    finally:
        for fd in held:
            os.close(fd)


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("setup, cell", [("", "%%resmon --quiet\nx = 1"), ("%resmon auto on", "x = 1")])
def test_a_quiet_or_auto_cell_reaches_the_helper_in_two_writes(ip, monkeypatch, setup, cell):
    """A cell's notes at each end go out together (each write wakes the
    helper): a quiet %%resmon cell or auto mode's short one is two writes
    to the helper's pipe, its start and its end, and the helper hears them."""
    if setup:
        ip.run_line_magic(*setup[1:].split(" ", 1))
    ip.run_cell(cell)   # the first: it may start a monitor, with a call
    host = SESSION.host
    writes, write = [], os.write

    def counted(fd, data):
        if fd == host._out:
            writes.append(bytes(data).count(b"cell_"))   # the notes in this write
        return write(fd, data)

    monkeypatch.setattr(os, "write", counted)
    ip.run_cell(cell)
    monkeypatch.undo()
    assert len(writes) == 2 and sum(writes) == 4, writes   # started+open, close+finished
    assert host.info()["open_cells"] == 0   # both ends arrived (a call goes after the notes before it)
    if not setup:
        assert len(host.history()) == 2   # the quiet cells' records
