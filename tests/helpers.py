"""Plain helpers shared by the test modules (fixtures live in conftest.py).

tests/ has no __init__.py: pytest puts it on sys.path, so a test module does
``from helpers import wait_until, burn_cpu, fd_count, nbmon_threads``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    """Bounded poll: the predicate's value once truthy, else fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
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
