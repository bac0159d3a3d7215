"""scaffold's ``scaffold.system_monitor`` API, as nbmon offers it."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

import nbmon
from helpers import gone_pid, nbmon_threads, wait_until
from nbmon import AbstractBackendSender, SystemMonitor
from test_compat_scaffold import KEYS, Collect, publish_n

MACHINE_KEYS = set(KEYS)


@pytest.fixture(autouse=True)
def no_gpu(fake_gpu):
    """The stand-in NVML with no device: the real machine's GPUs change nothing here."""
    return fake_gpu


@pytest.fixture
def sender():
    return Collect()


# -- the documented surface ---------------------------------------------------


def test_signature_and_defaults(sender):
    params = inspect.signature(SystemMonitor).parameters
    assert list(params) == ["pid", "backend_sender", "sample_rate_seconds", "rank", "tree"]
    assert params["sample_rate_seconds"].default == 2
    assert params["rank"].default is None
    # nbmon's addition: keyword-only, off by default.
    assert params["tree"].kind is inspect.Parameter.KEYWORD_ONLY and params["tree"].default is False
    sm = SystemMonitor(os.getpid(), sender)
    assert sm.sample_rate_seconds == 2 and sm.rank is None
    assert SystemMonitor(os.getpid(), sender, 0.5).sample_rate_seconds == 0.5  # float accepted
    assert SystemMonitor(os.getpid(), sender, sample_rate_seconds=1, rank=3).rank == 3
    assert not nbmon_threads()  # constructing starts nothing


def test_attributes_before_start(sender):
    sm = SystemMonitor(os.getpid(), sender)
    assert isinstance(sm.proc, psutil.Process) and sm.proc.pid == os.getpid()
    assert sm.sampler == {}
    sm.flush()     # before start: nothing to publish, no error
    sm.shutdown()  # before start: nothing to stop
    assert sender.events == [] and not nbmon_threads()
    assert nbmon.SystemMonitor is SystemMonitor
    assert nbmon.AbstractBackendSender is AbstractBackendSender


def test_abstract_sender_needs_publish():
    with pytest.raises(TypeError):
        AbstractBackendSender()

    class NoPublish(AbstractBackendSender):
        pass

    with pytest.raises(TypeError):
        NoPublish()


def test_published_keys_are_wandbs_names(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.3)
    event = publish_n(sm, sender, 1)[0]
    assert set(event) == MACHINE_KEYS
    assert 0 <= event["cpu"] <= 100 and 0 < event["memory"] <= 100
    assert 0 < event["disk"] <= 100
    assert event["proc.memory.rssMB"] > 0 and event["proc.memory.availableMB"] > 0
    assert 0 < event["proc.memory.percent"] < 100
    assert event["proc.cpu.threads"] >= 1
    assert event["network"]["sent"] >= 0 and event["network"]["recv"] >= 0


def test_restart_after_shutdown(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.3)
    publish_n(sm, sender, 1)
    first = sender.count()
    publish_n(sm, sender, first + 1)
    assert not sm.monitor.running and not nbmon_threads()
    assert set(sender.events[first]) == MACHINE_KEYS  # the second run's first dict
    assert set(sender.events[-1]) == MACHINE_KEYS
    assert sm.published == sender.count()


def test_sender_that_raises_keeps_the_monitor_running():
    class Broken(AbstractBackendSender):
        calls = 0

        def publish(self, event, **kwargs):
            type(self).calls += 1
            raise ConnectionError("backend is down")

    sm = SystemMonitor(os.getpid(), Broken(), sample_rate_seconds=0.3)
    sm.start()
    try:
        wait_until(lambda: Broken.calls >= 3, timeout=20.0, what="3 publish attempts")
        seq = sm.monitor.store.seq
        wait_until(lambda: sm.monitor.store.seq > seq, timeout=20.0, what="sampling after the failures")
        assert sm.monitor.running
        (fault,) = sm.monitor.faults.values()
        assert fault.count >= 2
        assert fault.first_error == "ConnectionError: backend is down"
    finally:
        sm.shutdown()
    assert sm.published == 0
    assert not nbmon_threads()


@pytest.mark.allow_stuck_thread
def test_sender_that_blocks_forever_does_not_delay_shutdown():
    entered, release = threading.Event(), threading.Event()

    class Stuck(AbstractBackendSender):
        def publish(self, event, **kwargs):
            entered.set()
            release.wait()  # forever, until the test ends

    sm = SystemMonitor(os.getpid(), Stuck(), sample_rate_seconds=0.3)
    sm.start()
    try:
        assert entered.wait(20), "publish was never called"
        bound = sm.monitor.interval + 0.1
        t0 = time.monotonic()
        sm.shutdown()
        took = time.monotonic() - t0
        assert took <= bound + 1.5, f"shutdown took {took:.2f} s with a stuck sender"
        assert not sm.monitor.running
        assert not any(t.name == "nbmon-sampler" for t in nbmon_threads())
        seq = sm.monitor.store.seq
    finally:
        release.set()
    # Released, the sender thread finishes on its own; no sample was added after shutdown.
    wait_until(lambda: not nbmon_threads(), timeout=20.0, what="the sender thread to end")
    assert sm.monitor.store.seq == seq


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(pid=-1), ValueError, "pid must be a positive process id, got -1"),
    (dict(pid=0), ValueError, "pid must be a positive process id, got 0"),
    (dict(pid="1"), ValueError, "pid must be a whole number, got '1'"),
    (dict(rank=-1), ValueError, "rank must be a non-negative whole number or None, got -1"),
    (dict(rank=1.5), ValueError, "rank must be a non-negative whole number or None, got 1.5"),
    (dict(sample_rate_seconds=0), ValueError,
     "sample_rate_seconds must be a positive number of seconds, got 0"),
    (dict(sample_rate_seconds=-2), ValueError,
     "sample_rate_seconds must be a positive number of seconds, got -2"),
])
def test_bad_arguments(sender, kwargs, error, message):
    args = dict(pid=os.getpid(), backend_sender=sender) | kwargs
    with pytest.raises(error) as err:
        SystemMonitor(**args)
    assert str(err.value) == message
    assert not nbmon_threads()


def test_nonexistent_pid(sender):
    pid = gone_pid()
    with pytest.raises(ValueError) as err:
        SystemMonitor(pid, sender)
    assert str(err.value) == f"no process with pid {pid} exists"
    assert not nbmon_threads()


def test_sender_without_publish():
    bad = object()
    with pytest.raises(TypeError) as err:
        SystemMonitor(os.getpid(), bad)
    assert str(err.value) == f"backend_sender {bad!r} has no publish(event) method"
    assert not nbmon_threads()


# -- a watched process that exits ---------------------------------------------------


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(20)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_child_that_exits_gets_a_final_dict_and_the_monitor_stops(sender, child, reaped):
    sm = SystemMonitor(child.pid, sender, sample_rate_seconds=0.3)
    assert sm.proc.pid == child.pid
    sm.start()
    try:
        wait_until(lambda: sender.count() >= 1, timeout=20.0, what="a first period")
        assert sender.events[0]["proc.cpu.threads"] >= 1
        child.stdin.close()
        if reaped:
            child.wait(20)  # exits and is reaped, as its parent would
        # else it stays a zombie until the fixture reaps it: exited all the same
        # The monitor notices, publishes what is left and stops by itself.
        wait_until(lambda: not sm.monitor.running and not nbmon_threads(), timeout=20.0, what="the monitor to stop")
        seq, published = sm.monitor.store.seq, sender.count()
        sm.flush()  # the latest dict again, as scaffold's flush() does
        assert sender.count() == published + 1 and sender.events[-1] == sender.events[-2]
    finally:
        sm.shutdown()
    assert sm.monitor.store.seq == seq
    assert sm.published == sender.count()
    assert set(sender.events[-1]) == MACHINE_KEYS


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_child_that_exits_leaves_no_empty_tree_sample(sender, child, reaped):
    # The sample that finds the root gone is not stored: no proc_rss_mb=0 of an
    # empty tree dragging the last period's mean and the growth towards 0.
    sm = SystemMonitor(child.pid, sender, sample_rate_seconds=0.3)
    sm.start()
    try:
        wait_until(lambda: sm.monitor.store.seq >= 3, timeout=20.0, what="3 samples")
        child.stdin.close()
        if reaped:
            child.wait(20)
        wait_until(lambda: not sm.monitor.running and not nbmon_threads(), timeout=20.0, what="the monitor to stop")
    finally:
        sm.shutdown()
    _, _, cols = sm.monitor.store.series(["proc_rss_mb", "proc_count"])
    assert cols["proc_count"].min() >= 1
    # The last sample may (rarely) catch the child mid-exit with its memory
    # already released: reported against nbmon/sources/tree/, not asserted here.
    assert cols["proc_rss_mb"][:-1].min() > 0
