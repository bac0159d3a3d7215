"""A sampler in a helper process, so that no GIL can stall the timeline.

A Python thread inside the kernel cannot run while C code holds the GIL:
``sum(range(10**9))`` leaves a one-second hole in its timeline. The helper
process started here reads the same sources for the kernel's pid on its own
schedule and writes the samples to a pipe; a reader thread in the kernel
appends them to the store whenever the kernel lets it run. Samples are
delayed then, never lost (the pipe is enlarged to hold minutes of them).

The helper exits on EOF of its stdin and as soon as its parent is gone
(checked every flush), is reaped by ``stop()``, and is reparented to init
(which reaps it) if the kernel is killed. (Not PR_SET_PDEATHSIG: it fires
when the *thread* that started the helper ends, which would kill a monitor
started from a short-lived thread.)

Wire format, helper -> kernel, each message ``kind (1 byte) + length (u32) +
payload``: ``H`` header JSON (fields, t_start, peaks, gpu_state,
gpu_devices), ``S`` float64 records ``[tag, t, wall, *values]`` (tag > 0
answers a boundary request), ``F`` faults JSON, ``E`` a start error in
words. Kernel -> helper, lines on stdin: ``b <tag>`` takes a boundary sample
now; EOF stops.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from .faults import FaultLog
from ..launch import EXCLUDED, Frames, frame, spawn, write_all
from ..options import Options
from .sampler import STOP_GRACE_S, Sampler
from ..sources import gpus

START_TIMEOUT_S = 5.0
FLUSH_EVERY_S = 0.25  # the helper sends what it sampled at least this often


# -- the helper process ------------------------------------------------------

def _write(kind: bytes, payload: bytes) -> None:
    write_all(1, frame(kind, payload))


def helper_main(argv: list[str]) -> int:
    """``python -m nbmon.sampling.process PID PARENT_PID OPTIONS_JSON``"""
    from ..sources import Sources

    pid, parent, options = int(argv[0]), int(argv[1]), Options.from_json(argv[2])
    EXCLUDED.add(os.getpid())  # a child of the kernel it watches, never part of its tree
    if os.getppid() != parent:  # the parent died while we started
        return 0
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the kernel

    sources = Sources(pid, options)
    tree = sources.tree
    flush_every_s = min(FLUSH_EVERY_S, options.interval)
    records: list[np.ndarray] = []
    lock = threading.Lock()
    tag = [0.0]

    def sink(t, wall, row):
        with lock:
            records.append(np.concatenate(([tag[0], t, wall], row)))

    sampler = Sampler(sources.all, sink, options.interval, until=lambda: not tree.alive)
    try:
        sampler.prime()
    except Exception as err:
        _write(b"E", f"{type(err).__name__}: {err}".encode())
        return 1
    _write(b"H", json.dumps({"fields": sampler.fields, "t_start": sampler.t_start,
                             **sources.info()}).encode())
    sampler.launch()
    sent_faults: dict = {}

    def flush():
        with lock:
            batch = records[:]
            records.clear()
        if batch:
            _write(b"S", np.vstack(batch).tobytes())
        faults = {k: [f.count, f.first_error] for k, f in sampler.faults.items()}
        if faults != sent_faults:
            _write(b"F", json.dumps(faults).encode())
            sent_faults.clear()
            sent_faults.update(faults)

    stdin = sys.stdin.buffer.raw
    pending = b""
    try:
        while sampler.running and os.getppid() == parent:
            ready, _, _ = select.select([stdin], [], [], flush_every_s)
            if ready:
                chunk = os.read(stdin.fileno(), 4096)
                if not chunk:  # the kernel closed our stdin: stop
                    break
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.startswith(b"b "):
                        with sampler._step_lock:
                            tag[0] = float(line[2:])
                            sampler.sample_now()
                            tag[0] = 0.0
            flush()
    finally:
        sampler.stop(timeout=options.interval + STOP_GRACE_S, final=True)  # the run ends with its final state
        flush()
    return 0


# -- the kernel side ---------------------------------------------------------

HELPER_IMPORTS = ("nbmon", "numpy", "psutil")   # and the GPU vendors', found where the kernel finds them (nbmon.launch)


class ProcessSampler:
    """A :class:`~nbmon.sampling.sampler.Sampling`, as the thread's Sampler is, whose
    sampling happens in the helper process."""

    name = "nbmon-reader"

    def __init__(self, pid: int, options: Options):
        self.pid, self.options, self.interval = pid, options, options.interval
        self.sink = None
        self.until = None        # the helper ends by itself when the pid exits
        self.on_finish = None
        self.fields: tuple[str, ...] = ()
        self.t_start = math.nan
        self.info: dict = {}
        self.faults = FaultLog()
        self.proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._frames: Frames | None = None
        self._next_tag = 0
        self._answered = 0
        self._answer = threading.Condition()
        self._send_lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def prime(self) -> None:
        """Start the helper and read its header; raises RuntimeError if it
        does not come up within START_TIMEOUT_S."""
        self.proc = spawn("nbmon.sampling.process:helper_main", [str(self.pid), str(os.getpid()), self.options.to_json()],
                          HELPER_IMPORTS + gpus.imports())
        EXCLUDED.add(self.proc.pid)  # nbmon's own: no monitor of this process counts it
        self._frames = Frames(self.proc.stdout.fileno())
        try:
            fd = self.proc.stdout.fileno()
            try:  # minutes of samples fit while the kernel holds the GIL
                fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
            except OSError:
                pass
            kind, payload = self._read_message(time.monotonic() + START_TIMEOUT_S)
            if kind == b"E":
                raise RuntimeError(payload.decode())
            if kind != b"H":
                raise RuntimeError("the sampler process sent no header")
            self.info = json.loads(payload)
            self.fields = tuple(self.info["fields"])
            self.t_start = float(self.info["t_start"])
        except BaseException:
            self._kill()
            raise

    def _read_message(self, deadline: float | None):
        try:
            got = self._frames.read(deadline)   # blocks without the GIL: the helper keeps its rhythm
        except TimeoutError:
            raise RuntimeError(f"the sampler process did not start within {START_TIMEOUT_S:g} s") from None
        return got if got is not None else (None, b"")

    def launch(self) -> None:
        thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        try:
            thread.start()
        except BaseException:   # no thread to read it: the helper must not run on
            self._kill()
            raise
        self._thread = thread

    def _run(self) -> None:
        width = 3 + len(self.fields)
        try:
            while True:
                kind, payload = self._read_message(None)
                if kind is None:
                    break
                if kind == b"S":
                    rows = np.frombuffer(payload).reshape(-1, width)
                    for row in rows:
                        self.sink(float(row[1]), float(row[2]), row[3:])
                    tags = rows[:, 0]
                    if tags.any():
                        with self._answer:
                            self._answered = max(self._answered, int(tags.max()))
                            self._answer.notify_all()
                elif kind == b"F":
                    for name, (count, first) in json.loads(payload).items():
                        self.faults.set_count(name, count, first)
        except Exception as err:  # never a traceback from a thread: count it
            self.faults.record("sampler process", err)
        finally:
            with self._answer:
                self._answer.notify_all()
            if self.on_finish is not None:
                self.on_finish()

    def sample_now(self) -> bool:
        """Ask the helper for a sample now and wait (up to an interval) until it is stored."""
        if not self.running:
            return False
        with self._send_lock:
            self._next_tag += 1
            tag = self._next_tag
            try:
                os.write(self.proc.stdin.fileno(), f"b {tag}\n".encode())
            except OSError:
                return False
        deadline = time.monotonic() + self.interval + FLUSH_EVERY_S
        with self._answer:
            while self._answered < tag and self.running:
                left = deadline - time.monotonic()
                if left <= 0 or not self._answer.wait(left):
                    return False
        return self._answered >= tag

    def stop(self, timeout: float | None = None, *, final: bool = True) -> bool:
        """Close the helper's stdin (it takes a final sample, flushes and
        exits), drain, reap. Bounded. (``final`` is the Sampler's keyword:
        the helper always ends its run with a final sample.)"""
        proc = self.proc
        if proc is None:
            return True
        deadline = time.monotonic() + (self.interval + STOP_GRACE_S if timeout is None else timeout)
        try:
            proc.stdin.close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        clean = self._thread is None or not self._thread.is_alive()
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            clean = False
            self._kill()
        EXCLUDED.discard(proc.pid)  # reaped: the pid may be reused by anything
        self._close_stdout()
        return clean

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            EXCLUDED.discard(self.proc.pid)
        self._close_stdout()

    def _close_stdout(self) -> None:
        # Not while the reader thread may still read it (its fd number could be reused).
        if self.proc is not None and not self.running:
            try:
                self.proc.stdout.close()
            except OSError:
                pass

    def after_fork_in_child(self) -> None:
        """In a forked child: drop its copies of the pipes, so that the helper
        still sees EOF when the parent stops it."""
        for pipe in (self.proc.stdin, self.proc.stdout) if self.proc is not None else ():
            try:
                pipe.close()
            except (OSError, ValueError):
                pass
        self._thread = None

    def close_sources(self) -> None:
        self._kill()


if __name__ == "__main__":
    sys.exit(helper_main(sys.argv[1:]))
