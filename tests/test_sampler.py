"""Sampler: schedule, fault isolation, bounded stop, and its two threads of entry.

Schedules are driven by an injected fake clock whose event's ``wait(timeout)``
advances the clock by ``timeout`` instead of sleeping, so tick times are exact.
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from helpers import DEADLINE_S, FakeEvent, FakeTime, StubSource, wait_until
from nbmon.sampling.sampler import Sampler


def start(sampler: Sampler) -> None:
    """Open the sources, then start the thread (what Monitor.start() does)."""
    sampler.prime()
    sampler.launch()


class Recorder:
    def __init__(self):
        self.rows: list[tuple[float, float, np.ndarray]] = []

    def __call__(self, t: float, wall: float, row: np.ndarray) -> None:
        self.rows.append((t, wall, row.copy()))

    @property
    def times(self) -> list[float]:
        return [t for t, _, _ in self.rows]


class Counted:
    """Counts the rows handed to ``sink`` (even when it raises)."""

    def __init__(self, sink):
        self.sink = sink
        self.name = getattr(sink, "name", None) or type(sink).__name__
        self.n = 0

    def __call__(self, t, wall, row):
        self.n += 1
        self.sink(t, wall, row)


def run_fake(sources, ticks: int, interval: float = 0.25, t0: float = 1000.0, sink=None):
    """Run a sampler on the fake clock until ``ticks`` rows went to the sink;
    returns (sampler, recorder, fake time)."""
    ft = FakeTime(t0)
    rec = Recorder() if sink is None else sink
    counted = Counted(rec)
    sampler = Sampler(sources, counted, interval, clock=ft.clock, wall=ft.wall,
                      event=lambda: FakeEvent(ft), until=lambda: counted.n >= ticks)
    start(sampler)
    try:
        wait_until(lambda: not sampler._thread.is_alive(), timeout=DEADLINE_S, what="the fake-clock run to end")
    finally:
        assert sampler.stop() is True
    return sampler, rec, ft


# -- schedule ----------------------------------------------------------------

def test_ticks_land_exactly_on_the_grid():
    src = StubSource("src")
    sampler, rec, _ = run_fake([src], 40, interval=0.25, t0=1000.0)
    assert sampler.t_start == 1000.0 and src.started == 1000.0
    # The first row is the baseline, read at start: the run counts from it.
    assert rec.times == [1000.0 + 0.25 * k for k in range(0, 40)]
    assert [w for _, w, _ in rec.rows] == [t + FakeTime.WALL_OFFSET for t in rec.times]
    assert src.times == rec.times  # each source is sampled at the row's time


def test_no_drift_over_many_ticks_of_an_inexact_interval():
    src = StubSource("src")
    _, rec, _ = run_fake([src], 5000, interval=0.1, t0=12345.678)
    expected = 12345.678 + 0.1 * np.arange(0, 5000)
    assert np.max(np.abs(np.array(rec.times) - expected)) < 1e-9


def test_falling_behind_skips_ticks_instead_of_bursting():
    interval, t0 = 0.25, 1000.0
    ft_box = {}

    def behave(call):   # call 1 is the baseline at start
        if call == 4:    # a source stuck for 3.5 intervals
            ft_box["ft"].t += 3.5 * interval
        if call == 7:    # a suspended machine: 100.5 intervals
            ft_box["ft"].t += 100.5 * interval
        return {"a": 1.0, "b": 2.0}

    src = StubSource("src", behave=behave)
    ft = FakeTime(t0)
    ft_box["ft"] = ft
    rec = Recorder()
    sampler = Sampler([src], rec, interval, clock=ft.clock, wall=ft.wall,
                      event=lambda: FakeEvent(ft), until=lambda: len(rec.rows) >= 10)
    start(sampler)
    wait_until(lambda: not sampler._thread.is_alive(), timeout=DEADLINE_S, what="the run to end")
    assert sampler.stop()
    ks = [(t - t0) / interval for t in rec.times]
    # Ticks 4..6 fell inside the first stall (3 -> 6.5), 10..109 inside the
    # second (9 -> 109.5): skipped, and sampling resumes on the same grid.
    assert ks == [0, 1, 2, 3, 7, 8, 9, 110, 111, 112]


def test_real_clock_thread_name_daemon_and_running():
    src = StubSource("src")
    rec = Recorder()
    sampler = Sampler([src], rec, 0.01)
    assert not sampler.running
    start(sampler)
    try:
        thread = sampler._thread
        assert thread.name == "nbmon-sampler"
        assert thread.daemon
        assert sampler.running
        wait_until(lambda: len(rec.rows) >= 5, timeout=DEADLINE_S, what="five samples")
        assert sampler.fields == ("a", "b")
    finally:
        assert sampler.stop(timeout=DEADLINE_S) is True
    assert not sampler.running and not thread.is_alive()
    assert src.closed == 1
    times = rec.times
    assert times == sorted(times)
    assert all(np.array_equal(row, [1.0, 2.0]) for _, _, row in rec.rows)


def test_stop_before_start_and_twice():
    sampler = Sampler([StubSource("src")], Recorder(), 0.05)
    assert sampler.stop() is True
    sampler = Sampler([StubSource("src")], Recorder(), 0.05)
    start(sampler)
    assert sampler.stop(timeout=DEADLINE_S) is True
    assert sampler.stop() is True


def test_until_ends_the_run_closes_sources_and_calls_on_finish():
    """until() says the run is over (the watched process exited): the row
    read then describes an empty tree and is not stored; the thread ends.
    (The first row is the baseline, read at start.)"""
    a, b = StubSource("a"), StubSource("b", fields=("c",), values=(3.0,))
    finished = []
    ft = FakeTime()
    rec = Recorder()
    sampler = Sampler([a, b], rec, 0.5, clock=ft.clock, wall=ft.wall,
                      event=lambda: FakeEvent(ft), until=lambda: a.calls >= 3)
    sampler.on_finish = lambda: finished.append(True)
    start(sampler)
    wait_until(lambda: not sampler._thread.is_alive(), timeout=DEADLINE_S, what="the run to end by itself")
    assert not sampler.running
    assert finished == [True]
    assert (a.closed, b.closed) == (1, 1)
    assert a.calls == b.calls == 3
    assert rec.times == [1000.0, 1000.5]
    assert sampler.stop() is True
    assert sampler.sample_now() is False and len(rec.rows) == 2


def test_sample_now_after_the_watched_process_exited_stores_nothing():
    src = StubSource("src")
    state = {"exited": False}
    rec = Recorder()
    sampler = Sampler([src], rec, 5.0, until=lambda: state["exited"])
    start(sampler)
    try:
        assert sampler.sample_now() is True and len(rec.rows) == 2  # the baseline and this
        state["exited"] = True  # noticed by the next read, before the thread's own
        sampler.sample_now()
        assert len(rec.rows) == 2
    finally:
        assert sampler.stop(timeout=DEADLINE_S)


def test_prime_failure_closes_the_opened_sources_and_starts_no_thread():
    class Broken(StubSource):
        def start(self, now):
            raise ProcessLookupError("gone")

    ok, broken, later = StubSource("ok"), Broken("broken"), StubSource("later")
    sampler = Sampler([ok, broken, later], Recorder(), 0.05)
    threads = threading.active_count()
    with pytest.raises(ProcessLookupError):
        sampler.prime()
    assert ok.closed == 1 and later.closed == 0 and later.started is None
    assert sampler._thread is None and threading.active_count() == threads


# -- faults ------------------------------------------------------------------

def fault_run(bad: StubSource, ticks: int = 12):
    good = StubSource("good", fields=("g1", "g2"), values=(5.0, 6.0))
    sampler, rec, _ = run_fake([good, bad], ticks)
    assert len(rec.rows) == ticks  # the thread went on to the end
    rows = np.array([row for _, _, row in rec.rows])
    assert sampler.fields[:2] == ("g1", "g2")
    assert np.all(rows[:, 0] == 5.0) and np.all(rows[:, 1] == 6.0)  # the others keep values
    return sampler, rows[:, 2:]


def test_source_raising_every_call():
    def behave(call):
        raise RuntimeError("sensor unplugged")

    sampler, bad = fault_run(StubSource("bad", behave=behave))
    assert np.isnan(bad).all()
    fault = sampler.faults["bad"]
    assert fault.count == 12
    assert "RuntimeError: sensor unplugged" in fault.first_error
    assert "good" not in sampler.faults


def test_source_raising_every_third_call():
    def behave(call):
        if call % 3 == 0:
            raise OSError("flaky")
        return {"a": 7.0, "b": 8.0}

    sampler, bad = fault_run(StubSource("bad", behave=behave))
    for i, row in enumerate(bad, start=1):
        if i % 3 == 0:
            assert np.isnan(row).all(), i
        else:
            assert list(row) == [7.0, 8.0], i
    assert sampler.faults["bad"].count == 4


@pytest.mark.parametrize("got", [None, (1.0, 2.0), "ab"], ids=["none", "tuple", "text"])
def test_source_returning_no_dict(got):
    """A source answers {field: value}: None, a bare tuple of the values (the
    old protocol) or text are faults."""
    sampler, bad = fault_run(StubSource("bad", behave=lambda call: got))
    assert np.isnan(bad).all()
    assert sampler.faults["bad"].count == 12


@pytest.mark.parametrize("value", ["abc", "12", b"3", "nan", None, (1.0,), 1 + 2j],
                         ids=["text", "numeric-text", "bytes", "nan-text", "none", "tuple", "complex"])
def test_source_returning_a_non_number(value):
    """Only the bad value is NaN; text is never parsed as a number."""
    sampler, bad = fault_run(StubSource("bad", behave=lambda call: {"a": value, "b": 4.0}))
    assert np.isnan(bad[:, 0]).all()
    assert np.all(bad[:, 1] == 4.0)
    assert sampler.faults["bad"].count == 12
    assert "a" in sampler.faults["bad"].first_error  # names the field


def test_source_returning_negative_values():
    sampler, bad = fault_run(StubSource("bad", behave=lambda call: {"a": -1.0, "b": 4.0}))
    assert np.isnan(bad[:, 0]).all() and np.all(bad[:, 1] == 4.0)
    fault = sampler.faults["bad"]
    assert fault.count == 12 and "negative value for a" in fault.first_error


@pytest.mark.parametrize("got, missing", [({"a": 1.0}, "b"), ({"a": 1.0, "c": 2.0}, "b"), ({}, "a")],
                         ids=["short", "misnamed", "empty"])
def test_source_leaving_out_a_field(got, missing):
    sampler, bad = fault_run(StubSource("bad", behave=lambda call: got))
    assert np.isnan(bad).all()
    assert sampler.faults["bad"].count == 12
    assert f"gave no value for {missing!r}" in sampler.faults["bad"].first_error


@pytest.mark.parametrize("got", [dict(zip("ab", np.array([1.5, 2.5]))), {"a": 1, "b": 2},
                                 {"a": np.float32(1.5), "b": np.int64(2)}, {"a": math.inf, "b": math.nan},
                                 {"b": 2.0, "a": 1.0, "extra": 3.0}],
                         ids=["ndarray-items", "ints", "numpy-scalars", "inf-nan", "other-order-and-extra"])
def test_plain_numbers_of_any_kind_are_no_fault(got):
    sampler, bad = fault_run(StubSource("fine", behave=lambda call: got))
    assert "fine" not in sampler.faults
    expected = np.asarray([got["a"], got["b"]], dtype=float)
    assert np.array_equal(bad[0], expected, equal_nan=True)


def test_failing_sink_never_ends_sampling():
    calls = []

    class Sink:
        name = "sink"

        def __call__(self, t, wall, row):
            calls.append(t)
            raise RuntimeError("disk full")

    src = StubSource("src")
    sampler, _, _ = run_fake([src], 10, sink=Sink())
    assert len(calls) == 10
    assert sampler.faults["sink"].count == 10


def test_failing_close_is_counted_not_raised():
    class BadClose(StubSource):
        def close(self):
            super().close()
            raise OSError("already closed")

    src, bad = StubSource("src"), BadClose("bad")
    sampler, rec, _ = run_fake([src, bad], 3)
    assert bad.closed == 1 and src.closed == 1
    assert sampler.faults["bad"].count == 1


# -- stop with a stuck source ---------------------------------------------------

@pytest.mark.allow_stuck_thread
def test_stop_is_bounded_when_a_source_is_stuck_and_the_thread_never_writes_again():
    # Its third call "sleeps 10 s", but the test can cut it short.
    stuck, other = StubSource("stuck", stuck_on=3), StubSource("other", fields=("c",), values=(3.0,))
    rec = Recorder()
    sampler = Sampler([other, stuck], rec, 0.02)
    start(sampler)
    thread = sampler._thread
    try:
        assert stuck.entered.wait(DEADLINE_S)
        written = len(rec.rows)
        assert sampler.stop() is False  # returned although the thread is stuck
        assert not sampler.running
        assert thread.is_alive()
    finally:
        stuck.release.set()
    wait_until(lambda: not thread.is_alive(), timeout=DEADLINE_S, what="the abandoned thread to exit once unstuck")
    assert len(rec.rows) == written
    assert stuck.closed == 1 and other.closed == 1


# -- sample_now() from another thread ---------------------------------------------

def test_rows_stay_in_time_order_when_sample_now_races_the_thread():
    """The thread reads its clock, then a sample_now() from the main thread
    gets the sources first: the main thread's later row must not be stored
    before the thread's earlier one."""
    armed = threading.Event()
    thread_has_now = threading.Event()
    main_done = threading.Event()
    state = {"next_clock_is_now": False}

    class HookedEvent(threading.Event):
        def wait(self, timeout=None):
            got = super().wait(timeout)
            if armed.is_set():
                armed.clear()
                state["next_clock_is_now"] = True  # the thread's next clock() is its `now`
            return got

    def clock():
        t = time.monotonic()
        if state["next_clock_is_now"] and threading.current_thread().name == "nbmon-sampler":
            state["next_clock_is_now"] = False
            thread_has_now.set()
            main_done.wait(DEADLINE_S)
        return t

    rec = Recorder()
    sampler = Sampler([StubSource("src")], rec, 0.05, clock=clock, event=HookedEvent)
    start(sampler)
    try:
        wait_until(lambda: len(rec.rows) >= 2, timeout=DEADLINE_S, what="two samples")
        armed.set()
        assert thread_has_now.wait(DEADLINE_S)
        sampler.sample_now()
        main_done.set()
        n = len(rec.rows)
        wait_until(lambda: len(rec.rows) >= n + 3, timeout=DEADLINE_S, what="three more samples")
        assert sampler.sample_now() is True  # an uncontended one works
        wait_until(lambda: len(rec.rows) >= n + 5, timeout=DEADLINE_S, what="two more samples")
    finally:
        main_done.set()
        assert sampler.stop(timeout=DEADLINE_S)
    assert rec.times == sorted(rec.times)


def test_sources_are_not_closed_while_sample_now_reads_them():
    """The run ends by itself (until) while the main thread is inside a
    sample_now(): the thread must wait before it closes the sources."""
    state = {"arm": False, "read_after_close": False}
    in_until, reading = threading.Event(), threading.Event()

    class Watched(StubSource):
        def sample(self, now):
            if threading.current_thread() is threading.main_thread():
                reading.set()
                deadline = time.monotonic() + 1.0  # time for a close to happen, if it can
                while not self.closed and time.monotonic() < deadline:
                    time.sleep(0.005)
                state["read_after_close"] = self.closed > 0
            return super().sample(now)

    def until():
        if state["arm"]:
            state["arm"] = False
            in_until.set()
            reading.wait(DEADLINE_S)
            return True
        return False

    src = Watched("src")
    rec = Recorder()
    sampler = Sampler([src], rec, 0.02, until=until)
    start(sampler)
    thread = sampler._thread
    try:
        wait_until(lambda: len(rec.rows) >= 2, timeout=DEADLINE_S, what="two samples")
        state["arm"] = True
        assert in_until.wait(DEADLINE_S)
        sampler.sample_now()
    finally:
        reading.set()
        sampler.stop(timeout=DEADLINE_S)
    wait_until(lambda: not thread.is_alive(), timeout=DEADLINE_S, what="the thread to end")
    assert state["read_after_close"] is False
    assert src.closed == 1


def test_sample_now_calls_boundary_and_is_refused_when_not_running():
    class WithBoundary(StubSource):
        boundaries = 0

        def boundary(self):
            self.boundaries += 1

    src = WithBoundary("src")
    rec = Recorder()
    sampler = Sampler([src], rec, 5.0)
    assert sampler.sample_now() is False
    start(sampler)
    try:
        assert sampler.sample_now() is True
        assert src.boundaries == 1 and len(rec.rows) == 2  # the baseline and this
    finally:
        assert sampler.stop(timeout=DEADLINE_S)
    assert sampler.sample_now() is False
    assert len(rec.rows) == 2
