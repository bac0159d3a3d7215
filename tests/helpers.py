"""Plain helpers shared by the test modules (fixtures live in conftest.py).

tests/ has no __init__.py: pytest puts it on sys.path, so a test module does
``from helpers import wait_until, burn_cpu, fd_count, nbmon_threads``."""
from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
from comm.base_comm import BaseComm

DEADLINE_S = 30.0  # the bound of every poll: generous for a loaded 2-core machine


def wait_until(predicate, timeout: float = DEADLINE_S, what="condition"):
    """Bounded poll: the predicate's value once truthy, else fail naming
    ``what`` (a string, or a callable that gives one, read at the failure)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(0.01)


def nbmon_threads() -> list[threading.Thread]:
    """nbmon's own threads (all named ``nbmon-*``) that are still alive."""
    return [t for t in threading.enumerate() if t.name.startswith("nbmon-") and t.is_alive()]


def burn_cpu(seconds: float) -> None:
    """Spin until this process has used ``seconds`` more of CPU time."""
    c0 = time.process_time()
    while time.process_time() - c0 < seconds:
        pass


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def free_pid(timeout: float | None = None) -> int:
    """The pid of a process that was spawned and reaped: no process has it
    (unless the system reused it since)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout)
    return p.pid


def gone_pid() -> int:
    """``free_pid()``, skipping the test if the pid was already reused."""
    pid = free_pid(timeout=20)
    if psutil.pid_exists(pid):
        pytest.skip("the pid was reused at once")
    return pid


def venv_over_this_environment(path, *, pip: bool = False) -> str:
    """A new virtual environment at ``path`` that sees this interpreter's
    packages (nbmon among them) after its own, and has the user's
    site-packages enabled; its python. ``--system-site-packages`` alone
    gives the base installation's packages, not those of a virtual
    environment the tests run in: a .pth adds this one's."""
    import site

    args = [sys.executable, "-m", "venv", "--system-site-packages", str(path)]
    subprocess.run(args if pip else [*args, "--without-pip"], check=True, timeout=120)
    python = os.path.join(str(path), "bin", "python")
    if sys.prefix != sys.base_prefix:
        purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
        with open(os.path.join(purelib, "_outer_environment.pth"), "w") as f:
            f.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
    return python


def figure(scenario: str, **values) -> None:
    """Print a measured figure (run with -s to see them) for benchmarks/RELIABILITY.md."""
    print(f"\nFIGURE {scenario}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


def in_forked_child(body, timeout: float = 30.0):
    """Run ``body()`` (returns something JSON-able) in a forked child; the answer
    comes back through a pipe. Bounded: a child that hangs is killed and the
    test fails. The child never returns into pytest."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            try:
                answer = body()
                code = 0
            except BaseException as err:  # reported, not raised into pytest's copy
                import traceback
                answer = {"error": "".join(traceback.format_exception(err))}
            os.write(w, json.dumps(answer).encode())
        finally:
            os._exit(code)
    os.close(w)
    try:
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung (deadlock?)")
            time.sleep(0.01)
        with os.fdopen(r, "rb") as f:
            answer = json.loads(f.read().decode() or "{}")
    finally:
        try:
            os.close(r)
        except OSError:
            pass
    assert not (isinstance(answer, dict) and "error" in answer), answer["error"]
    assert os.waitstatus_to_exitcode(status) == 0, answer
    return answer


# -- sources and clocks for the sampler ------------------------------------------------


class StubSource:
    """A sampler source that answers ``values`` ({field: value}) every call.

    ``behave(call)`` (calls count from 1) replaces that answer: it may return
    anything (a malformed answer is the point of some tests) or raise.
    ``faulty(call)`` says whether a call is a fault by design; those are
    counted in ``faults``, so a monitor's count can be checked exactly. The
    ``stuck_on``-th call, and every call once ``stick_from_now`` is set,
    blocks until ``release`` is set (10 s at most), setting ``entered``
    first. Records each call's time and thread, when it was started and how
    often closed. ``caller_safe``: the sampler may read it from the caller's
    thread for the run's baseline (a source that can get stuck must say no)."""

    def __init__(self, name: str = "stub", fields=("a", "b"), values=None, *, behave=None,
                 faulty=None, stuck_on: int | None = None, release: threading.Event | None = None,
                 caller_safe: bool = True):
        self.name = name
        self.caller_safe = caller_safe
        self.fields = tuple(fields)
        self.values = dict(zip(self.fields, values if values is not None else
                               [float(k) for k in range(1, len(self.fields) + 1)]))
        self.behave = behave
        self.faulty = faulty
        self.stuck_on = stuck_on
        self.release = release if release is not None else threading.Event()
        self.entered = threading.Event()
        self.stick_from_now = threading.Event()
        self.calls = 0
        self.faults = 0
        self.times: list[float] = []
        self.calls_by_thread: dict[int, list[int]] = {}
        self.started: float | None = None
        self.closed = 0

    def start(self, now: float) -> None:
        self.started = now

    def sample(self, now: float):
        self.calls += 1
        call = self.calls
        self.times.append(now)
        self.calls_by_thread.setdefault(threading.get_ident(), []).append(call)
        if self.faulty is not None:
            self.faults += bool(self.faulty(call))
        if call == self.stuck_on or self.stick_from_now.is_set():
            self.entered.set()
            self.release.wait(10)
        if self.behave is not None:
            return self.behave(call)
        return dict(self.values)

    def close(self) -> None:
        self.closed += 1


class FakeTime:
    """A clock the test moves: ``clock()`` (monotonic) and ``wall()`` (epoch,
    ``WALL_OFFSET`` ahead)."""

    WALL_OFFSET = 1.7e9

    def __init__(self, t0: float = 1000.0):
        self.t = t0

    def clock(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + self.WALL_OFFSET


class FakeEvent:
    """A sampler's stop event on a FakeTime: ``wait(timeout)`` advances the
    clock by ``timeout`` and returns False (True once set), without sleeping."""

    def __init__(self, clock: FakeTime):
        self.clock = clock
        self.flag = False

    def wait(self, timeout=None) -> bool:
        if self.flag:
            return True
        self.clock.t += timeout
        return False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag


# -- files that senders write -------------------------------------------------------------


def csv_rows(path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV file that must consist of whole lines only,
    every cell a number or empty."""
    text = open(path, encoding="utf-8", newline="").read()
    assert text == "" or text.endswith("\n"), f"half a line at the end: {text[-80:]!r}"
    if not text:
        return [], []
    header, *rows = list(csv.reader(io.StringIO(text)))
    for row in rows:
        assert len(row) == len(header), row
        for cell in row:
            if cell:
                float(cell)
    return header, rows


_WRITER_CHILD = """
    import sys, time
    from nbmon.sinks.consumers import SampleForwarder
    from nbmon.engine import Monitor
    from nbmon.sinks import senders
    sender = getattr(senders, sys.argv[2])(sys.argv[1])
    Monitor(interval=0.005, gpu=False, consumers=[SampleForwarder(sender, every_s=0.01)]).start()
    while True:
        time.sleep(1)
"""


def sigkill_mid_write(path, sender: str, lines: int) -> str:
    """Run a monitor in a child process that streams every sample to
    ``path`` through ``nbmon.sinks.senders.<sender>``; SIGKILL it once the file has
    ``lines`` lines. Returns the file's text; fails if the child ended any
    other way."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER_CHILD), str(path), sender],
                            stderr=subprocess.PIPE, text=True)
    try:
        def enough():
            assert proc.poll() is None, proc.stderr.read()
            return os.path.exists(path) and open(path, "rb").read().count(b"\n") >= lines

        wait_until(enough, what=f"{lines} lines in {path}")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(20)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return open(path, encoding="utf-8", newline="").read()


_DISK_FULL_CHILD = """
    import json, resource, sys, time
    from nbmon.sinks import senders
    from nbmon.sinks.consumers import SampleForwarder
    from nbmon.engine import Monitor

    path, sender, limit, failures, more = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # SIGXFSZ is ignored: EFBIG
    base = getattr(senders, sender)
    counts = {"calls": 0, "failures": 0}

    def publish_many(self, events):  # the real sender's, counting its failed writes
        counts["calls"] += 1
        try:
            base.publish_many(self, events)
        except OSError:
            counts["failures"] += 1
            raise

    # Named as the sender it counts for: a forwarder's fault is named after its sender's class.
    counting = type(sender, (base,), {"publish_many": publish_many})
    forward = SampleForwarder(counting(path), every_s=0.02)
    mon = Monitor(interval=0.005, gpu=False, consumers=[forward]).start()
    deadline = time.monotonic() + 30
    while counts["failures"] < failures and time.monotonic() < deadline:
        time.sleep(0.005)
    seq = mon.store.seq
    while mon.store.seq < seq + more and time.monotonic() < deadline:
        time.sleep(0.005)
    result = dict(running=mon.running, seq_at_failure=seq, seq=mon.store.seq)
    result.update(clean=mon.stop(timeout=10), sent=forward.sent, **counts,
                  faults={k: [f.count, f.first_error] for k, f in mon.faults.items()})
    print(json.dumps(result))
"""


def disk_full_run(path, sender: str, limit: int, *, failures: int, more: int) -> dict:
    """Run a monitor in a child process whose files may not grow past
    ``limit`` bytes (RLIMIT_FSIZE: a full disk), forwarding every sample to
    ``path`` through ``nbmon.sinks.senders.<sender>``. Once the sender's writes
    failed ``failures`` times and ``more`` samples were taken after that,
    the monitor is stopped. Fails if the child printed anything to stderr.
    Returns what the child saw: running (just before the stop), clean (the
    stop's answer), seq_at_failure, seq, calls and failures (the sender's
    writes), sent (events the forwarder delivered) and faults ({name:
    [count, first error]})."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_DISK_FULL_CHILD), str(path), sender,
                           str(limit), str(failures), str(more)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # nothing printed from the threads
    return json.loads(done.stdout)


# -- widgets ------------------------------------------------------------------------------


class RecordingComm(BaseComm):
    """A widget comm that keeps what it would publish, standing in for the
    kernel: ``published`` is [(msg_type, data, buffers)], the data through
    JSON as the kernel sends it (NaN must not survive)."""

    def __init__(self, **kwargs):
        self.published = []
        super().__init__(**kwargs)

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        self.published.append((msg_type, json.loads(json.dumps(data, allow_nan=False)),
                               [bytes(b) for b in buffers or ()]))

    def update_messages(self) -> list[tuple[dict, list, list[bytes]]]:
        """(state, buffer_paths, buffers) of every update message."""
        return [(data["state"], data.get("buffer_paths", []), buffers)
                for kind, data, buffers in self.published
                if kind == "comm_msg" and data.get("method") == "update"]

    def updates(self) -> list[dict]:
        """The state of every update message."""
        return [state for state, _, _ in self.update_messages()]

    def customs(self, kind: str) -> list[tuple[dict, list[bytes]]]:
        """(content, buffers) of every custom message of ``kind`` (its "type")."""
        return [(data["content"], buffers) for msg, data, buffers in self.published
                if msg == "comm_msg" and data.get("method") == "custom" and data["content"].get("type") == kind]


class FrontEnd:
    """What the front end holds of a cluster view (nbmon/views/js/dashboard/
    live.js: declare and message): each stream's points, read from the frames the view sent
    through its widget's comm, the title of the last, and the streams and
    layout patch of the widget's state."""

    def __init__(self, view):
        self.view, self.points, self.title = view, {}, None
        view.widget.comm = self.comm = RecordingComm(target_name="jupyter.widget")

    def read(self) -> "FrontEnd":
        for content, buffers in self.comm.customs("nbmon:append"):
            at = 0
            for group in content["groups"]:
                x = np.frombuffer(buffers[at], dtype=np.float64)
                at += 1
                for stream in group["ids"]:
                    y = np.frombuffer(buffers[at], dtype=np.float32)
                    at += 1
                    old = self.points.get(stream) if not group["replace"] else None
                    self.points[stream] = (x, y) if old is None else (np.r_[old[0], x], np.r_[old[1], y])
            self.title = content["title"]
        self.comm.published.clear()
        return self

    @property
    def streams(self) -> list[dict]:
        return self.view.widget._nbmon["streams"]

    @property
    def layout(self) -> dict:
        return self.view.widget._nbmon["layout"]

    def workers(self) -> set[str]:
        return {s["id"].rsplit(" ", 1)[0] for s in self.streams if s["id"].startswith("tcp://")}
