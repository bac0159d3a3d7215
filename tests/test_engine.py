"""Monitor end to end: real runs on this process and on children, spans,
restarts, argument checks, and no leaked threads or descriptors."""
from __future__ import annotations

import math
import subprocess
import sys
import threading

import numpy as np
import pytest

from helpers import DEADLINE_S, StubSource, burn_cpu, fd_count, free_pid, nbmon_threads, wait_until
from nbmon.engine import Monitor
from nbmon.report.summary import ResourceSummary

MIB = 1024 * 1024


def samples_after(monitor: Monitor, n: int):
    seq = monitor.store.seq
    wait_until(lambda: monitor.store.seq >= seq + n, timeout=DEADLINE_S, what=f"{n} more samples")


def test_real_run_gives_a_consistent_summary():
    m = Monitor(interval=0.05)
    assert m.summary() == ResourceSummary.zeroed()
    with pytest.raises(RuntimeError):
        m.window()
    m.start()
    try:
        assert m.running and m.peaks == "high-water marks"
        samples_after(m, 3)
        base_rss = m.latest()["proc_rss_mb"]
        block = np.ones(150 * MIB // 8)
        burn_cpu(0.3)
        samples_after(m, 3)
        del block
        samples_after(m, 3)
    finally:
        assert m.stop(timeout=DEADLINE_S) is True
    assert not m.running
    s = m.summary()
    store = m.store
    assert s.num_samples == store.seq  # every sample of the run, none evicted from the stats
    assert s.duration_sec == pytest.approx(store.latest()["t"] - m._sampler.t_start, abs=1e-9)
    assert s.peak_rss_mb >= s.mean_rss_mb > 0
    assert s.peak_rss_mb >= base_rss + 145
    assert s.peak_mem_mb >= s.mean_mem_mb > 0 and s.peak_mem_kind in ("exact", "upper bound", "sampled")
    assert s.peak_rss_exact is (s.peak_mem_kind != "sampled")
    assert s.peak_cpu_percent >= s.mean_cpu_percent > 0
    # CPU %, time-weighted over the run, integrates to the tree's CPU time.
    assert s.cpu_time_sec >= 0.3 * 0.9
    assert s.cpu_time_sec == pytest.approx(store.latest()["proc_cpu_time_s"], abs=0.05)
    assert s.start_time <= s.end_time
    assert s.end_time - s.start_time == pytest.approx(s.duration_sec, abs=0.5)
    assert "sys_cpu_percent" in m.fields and "proc_rss_mb" in m.fields
    assert m.faults == {}
    assert ResourceSummary.from_dict(s.to_dict()) == s


def test_spans_cover_only_their_part():
    m = Monitor(interval=0.05, gpu=False).start()
    try:
        samples_after(m, 3)
        quiet = m.window()
        samples_after(m, 3)
        q = quiet.close()
        busy = m.window()
        spike = np.ones(200 * MIB // 8)
        del spike
        samples_after(m, 2)
        b = busy.close()
        last = m.window()
        samples_after(m, 2)
    finally:
        assert m.stop(timeout=DEADLINE_S) is True
    tail = last.close()  # after stop: covers exactly the samples since it opened
    run = m.summary()
    assert tail.num_samples == m.store.seq - last.window.seq_open
    assert q.num_samples >= 3 and b.num_samples >= 2
    assert q.num_samples + b.num_samples + tail.num_samples < run.num_samples
    assert b.peak_rss_mb >= q.peak_rss_mb + 190   # the spike is in its own span only
    assert q.peak_rss_mb < q.mean_rss_mb + 50
    assert run.peak_rss_mb >= b.peak_rss_mb
    assert q.duration_sec < run.duration_sec and b.duration_sec < run.duration_sec
    assert run.start_time <= q.start_time <= q.end_time <= b.start_time <= b.end_time <= run.end_time
    assert quiet.close() == q  # closing twice changes nothing


def test_restart_begins_a_new_run():
    m = Monitor(interval=0.05, gpu=False)
    with m:
        samples_after(m, 3)
    first_store, first = m.store, m.summary()
    assert not m.running
    with m:
        assert m.store is not first_store
        samples_after(m, 2)
    second = m.summary()
    assert second.num_samples == m.store.seq
    assert second.start_time >= first.end_time
    assert first_store.seq == first.num_samples  # the old run is still readable and unchanged


def test_start_stop_cycles_leak_no_thread_and_no_descriptor():
    m = Monitor(interval=0.5, gpu=False)
    m.start()
    assert m.stop(timeout=DEADLINE_S)  # imports and one-time setup out of the way
    fds, threads = fd_count(), threading.active_count()
    for _ in range(50):
        m.start()
        assert m.running
        assert m.stop(timeout=DEADLINE_S) is True
        assert not m.running
    for _ in range(5):
        other = Monitor(interval=0.01)  # default sources, GPU included
        other.start()
        assert other.stop(timeout=DEADLINE_S) is True
    assert nbmon_threads() == []
    assert threading.active_count() == threads
    assert fd_count() == fds


def test_run_on_a_child_that_exits_ends_by_itself():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        m = Monitor(pid=p.pid, interval=0.05, gpu=False).start()
        samples_after(m, 3)
        assert m.running and m.sources.tree.root_alive
        p.stdin.close()  # it exits; nobody reaps it yet
        wait_until(lambda: not m.running, timeout=DEADLINE_S, what="the run to end when its process exited")
        s = m.summary()
        assert s.num_samples >= 3 and s.num_samples == m.store.seq
        assert s.peak_rss_mb > 0 and s.duration_sec > 0
        assert m.stop(timeout=DEADLINE_S) is True
        assert m.summary() == s  # nothing more after the end
        assert not [t for t in nbmon_threads() if t.name == "nbmon-sampler"]
    finally:
        p.wait()


@pytest.mark.parametrize("reaped_first", [True, False], ids=["reaped-before-stop", "zombie-noticed"])
def test_no_sample_of_the_empty_tree_once_the_process_exited(reaped_first):
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        m = Monitor(pid=p.pid, interval=0.05, gpu=False, system=False).start()
        samples_after(m, 3)
        p.stdin.close()
        if reaped_first:
            p.wait()  # gone before the monitor looks again, or before stop()'s last sample
        else:
            wait_until(lambda: not m.running, timeout=DEADLINE_S, what="the run to end when its process exited")
        assert m.stop(timeout=DEADLINE_S) is True
    finally:
        p.wait()
    _, _, rows, _, _ = m.store.rows_since(0)
    fields = m.fields
    assert rows[fields.index("proc_count")].min() >= 1
    assert rows[fields.index("proc_rss_mb")].min() > 0
    s = m.summary()
    assert s.memory_growth_mb > -1 and s.mean_rss_mb > 0
    assert s.num_samples == rows.shape[1]


@pytest.mark.parametrize("interval", [0, -1, math.nan, math.inf, -math.inf, "abc", None, 86401])
def test_bad_interval_raises_naming_it_and_starts_nothing(interval):
    threads = threading.active_count()
    with pytest.raises(ValueError) as err:
        Monitor(interval=interval)
    assert repr(interval) in str(err.value) or str(interval) in str(err.value)
    assert "interval" in str(err.value)
    assert threading.active_count() == threads


@pytest.mark.parametrize("pid", [-1, 0, "12", 1.5, True])
def test_bad_pid_raises_naming_it(pid):
    threads = threading.active_count()
    with pytest.raises(ValueError) as err:
        Monitor(pid=pid)
    assert repr(pid) in str(err.value)
    assert threading.active_count() == threads


def test_pid_of_no_process_raises_naming_it():
    pid = free_pid()
    threads = threading.active_count()
    with pytest.raises(ValueError, match=rf"\b{pid}\b"):
        Monitor(pid=pid)
    assert threading.active_count() == threads


@pytest.mark.parametrize("max_bytes", [0, -5, 1.5, True, 100])
def test_bad_max_bytes_raises_and_starts_nothing(max_bytes):
    threads, fds = threading.active_count(), fd_count()
    with pytest.raises(ValueError, match="max_bytes"):
        Monitor(max_bytes=max_bytes, gpu=False).start()
    assert threading.active_count() == threads and fd_count() == fds


def fails_on_odd_calls(call):
    if call % 2:
        raise RuntimeError("odd call")
    return {"flaky_value": float(call)}


def test_a_failing_extra_source_is_isolated():
    flaky = StubSource("flaky", ("flaky_value",), behave=fails_on_odd_calls)
    m = Monitor(interval=0.02, gpu=False, extra_sources=[flaky]).start()
    try:
        wait_until(lambda: flaky.calls >= 6, timeout=DEADLINE_S, what="six calls")
    finally:
        with pytest.warns(RuntimeWarning, match=r"flaky failed \d+ time\(s\) in this run"):  # said once, at stop
            assert m.stop(timeout=DEADLINE_S)
    assert m.faults["flaky"].count >= 3
    assert "RuntimeError: odd call" in m.faults["flaky"].first_error
    assert flaky.closed == 1
    s = m.summary()
    assert s.peak_rss_mb > 0 and s.num_samples >= 6


@pytest.mark.allow_stuck_thread
def test_stop_is_bounded_with_a_stuck_source():
    stuck = StubSource("stuck", ("stuck_value",), stuck_on=3)
    m = Monitor(interval=0.05, gpu=False, system=False, extra_sources=[stuck]).start()
    thread = m._sampler._thread
    try:
        assert stuck.entered.wait(DEADLINE_S)
        seq = m.store.seq
        assert m.stop() is False  # returns, leaving the stuck thread behind
        assert not m.running
    finally:
        stuck.release.set()
    wait_until(lambda: not thread.is_alive(), timeout=DEADLINE_S, what="the abandoned thread to exit")
    assert m.store.seq == seq  # it never wrote again
    assert stuck.closed == 1
