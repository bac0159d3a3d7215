"""Sampler -> Store -> Window end to end: a property test and a soak.

Both drive a real :class:`~nbmon.sampling.sampler.Sampler` thread on an injected
clock: its event's ``wait(timeout)`` advances the fake clock instead of
sleeping, so a million samples take seconds and every sample time is known.
tests/test_store.py proves the store alone against a numpy reference; here
the rows and times come out of the sampler's own schedule (ticks skipped
after a stall, late wake-ups, NaN and rejected negative values) and go into
the store through its sink, as in a real run.
"""
from __future__ import annotations

import dataclasses
import math
import threading

import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import FakeEvent, FakeTime
from nbmon.views.frames import MAX_FRAME_BYTES, build_frame, frame_bytes
from nbmon.sampling.sampler import Sampler
from nbmon.sampling.store import Store
from nbmon.report.summary import ResourceSummary, summarize
from test_store import assert_matches, draw_column, reference, small_max_bytes

NAN = math.nan
COLUMNS = ("proc_rss_mb", "proc_cpu_percent", "gpu_util_percent", "gpu_mem_used_mb")
RUN_DEADLINE_S = 120.0  # only a hang would reach it


class LateEvent(FakeEvent):
    """Advances the fake clock by ``timeout`` plus the next of ``late`` (a
    wake-up that comes late: a loaded machine, a suspended laptop)."""

    def __init__(self, clock: FakeTime, late):
        super().__init__(clock)
        self.late = iter(late)

    def wait(self, timeout=None) -> bool:
        if self.flag:
            return True
        self.clock.t += timeout + next(self.late, 0.0)
        return False


class Script:
    """A source that gives ``rows[i]`` at its i-th sample and then holds the
    clock for ``stalls[i]`` seconds (a slow read); it records when it was
    asked and the wall time the sampler will read right after."""

    name = "script"
    fields = COLUMNS
    caller_safe = True  # its first row is the run's baseline

    def __init__(self, rows, stalls, ft: FakeTime):
        self.rows, self.stalls, self.ft = rows, stalls, ft
        self.times: list[float] = []
        self.walls: list[float] = []
        self.closed = 0

    def start(self, now: float) -> None:
        pass

    def sample(self, now: float):
        i = len(self.times)
        self.times.append(now)
        self.ft.t += self.stalls[i]
        self.walls.append(self.ft.wall())  # the sampler reads the wall clock after the sources
        return dict(zip(COLUMNS, self.rows[i]))

    def close(self) -> None:
        self.closed += 1


class Sink:
    """store.append, opening a second window (a cell, say) before sample ``late``."""

    def __init__(self, store: Store, late: int, t_open: float):
        self.store, self.late, self.prev_t = store, late, t_open
        self.part = None

    def __call__(self, t, wall, row) -> None:
        if self.store.seq == self.late:
            self.part = self.store.open_window(self.prev_t)
        self.store.append(t, wall, row)
        self.prev_t = t


def prepare(source, interval: float, ft: FakeTime, event, n: int, max_bytes: int, make_sink):
    """A primed Sampler on ``source`` that ends after ``n`` samples, its store
    and the run's window (as Monitor.start() opens them), and the sink made by
    ``make_sink(store, t_open)``. The caller launches it; ``done`` is set as
    the thread ends."""
    sampler = Sampler([source], None, interval, clock=ft.clock, wall=ft.wall, event=event)
    sampler.prime()
    store = Store(sampler.fields, max_bytes=max_bytes)
    sampler.until = lambda: store.seq >= n
    window = store.open_window(sampler.t_start)
    sampler.sink = sink = make_sink(store, sampler.t_start)
    done = threading.Event()
    sampler.on_finish = done.set
    return sampler, store, window, sink, done


def expected_summary(t, walls, rows, t_open) -> ResourceSummary:
    """ResourceSummary straight from numpy over every sample (rows (k, m), NaN unknown)."""
    ref = reference(t, rows, t_open)

    def known(x):
        return None if x != x else float(x)

    rss, cpu, gpu_util, gpu_mem = range(4)
    mean_cpu = known(ref["mean"][cpu])
    return ResourceSummary(
        peak_rss_mb=known(ref["max"][rss]) or 0.0,
        mean_rss_mb=known(ref["mean"][rss]) or 0.0,
        peak_gpu_mem_mb=known(ref["max"][gpu_mem]),
        mean_gpu_util=known(ref["mean"][gpu_util]),
        memory_growth_mb=known(ref["last"][rss] - ref["first"][rss]) or 0.0,
        num_samples=len(t),
        duration_sec=ref["duration"],
        mean_cpu_percent=mean_cpu,
        # The busiest interval is never below the mean (a span shorter than one interval).
        peak_cpu_percent=None if mean_cpu is None else max(known(ref["max"][cpu]) or 0.0, mean_cpu),
        cpu_time_sec=None,  # read from proc_cpu_time_s (the clocks), which these rows lack
        peak_rss_exact=False,
        peak_mem_kind="sampled",  # no high-water marks in these rows
        start_time=walls[0] - (t[0] - t_open),
        end_time=walls[-1],
    )


def assert_same_summary(got: ResourceSummary, want: ResourceSummary) -> None:
    floats = {}
    for name in ResourceSummary.__dataclass_fields__:
        if name == "figures":
            continue
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, float):
            assert a == pytest.approx(b, rel=1e-9, abs=1e-9), name
            floats[name] = a
        else:
            assert a == b, name
    # The figures behind the fields (the catalog's statistics) show the same record. Compared
    # at the fields' own values: a mean summed in another order may round the other way.
    assert got.rows() == dataclasses.replace(want, **floats).rows()


# -- property ------------------------------------------------------------------------------

# A resource figure: NaN (unknown), a plain value, or a negative one the sampler must reject.
value = st.one_of(st.just(NAN), st.floats(0, 1e6), st.sampled_from([0.0, 1.0, 1e6]), st.floats(-1e3, -1e-3))


@st.composite
def schedules(draw):
    interval = draw(st.sampled_from([0.001, 0.1, 0.25, 1.0, 0.3]))
    m = draw(st.integers(1, 800))
    delay = st.one_of(st.just(0.0), st.floats(0.0, interval), st.floats(0.0, 20 * interval))
    late = draw(st.lists(delay, min_size=m, max_size=m))
    stalls = draw(st.lists(delay, min_size=m, max_size=m))
    kinds = [draw(st.sampled_from(["mixed", "all-nan", "constant"])) for _ in COLUMNS]
    cols = [draw_column(draw, kind, m, value) for kind in kinds]
    rows = [tuple(c[i] for c in cols) for i in range(m)]
    t0 = draw(st.floats(0.0, 1e6))
    return interval, t0, rows, late, stalls, draw(st.integers(0, m - 1))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_sampled_window_equals_a_numpy_reference_over_every_sample(schedule):
    interval, t0, rows, late, stalls, cell_at = schedule
    m = len(rows)
    max_bytes = small_max_bytes(len(COLUMNS))  # a ring of 96 samples: 800 evict it many times
    ft = FakeTime(t0)
    source = Script(rows, stalls, ft)

    sampler, store, window, sink, done = prepare(source, interval, ft, lambda: LateEvent(ft, late), m, max_bytes,
                                                 lambda store, t_open: Sink(store, cell_at, t_open))
    sampler.launch()
    try:
        assert done.wait(RUN_DEADLINE_S), "the fake-clock run did not end"
    finally:
        assert sampler.stop() is True
    assert source.closed == 1 and len(source.times) == m

    t = np.array(source.times)
    walls = np.array(source.walls)
    # What the sampler must have stored: the source's values, negatives rejected as NaN.
    values = np.array(rows, dtype=float).T.reshape(len(COLUMNS), m)
    negative = values < 0
    clean = np.where(negative, NAN, values)
    rejected = int(negative.any(axis=0).sum())  # one fault per row with a negative value
    assert {name: f.count for name, f in sampler.faults.items()} == ({"script": rejected} if rejected else {})

    # The schedule: the first sample (the baseline) at the start, time never going back.
    # (Never two at one instant either, but that fails: see the test below.)
    assert np.all(np.diff(t) >= 0) and t[0] == sampler.t_start
    assert store.seq == m and store.nbytes <= max_bytes
    assert len(store) <= store.capacity + store.coarse_capacity

    whole = window.close()
    assert_matches(whole, reference(t, clean, sampler.t_start))
    assert whole.t_first == t[0] and whole.wall_first == walls[0] and whole.wall_last == walls[-1]
    assert_same_summary(summarize(whole), expected_summary(t, walls, clean, sampler.t_start))

    # The cell's window: from sample cell_at on, its first sample standing for the time since the one before.
    t_before = t[cell_at - 1] if cell_at else sampler.t_start
    part = sink.part.stats()
    assert_matches(part, reference(t[cell_at:], clean[:, cell_at:], t_before))
    assert_same_summary(summarize(part),
                        expected_summary(t[cell_at:], walls[cell_at:], clean[:, cell_at:], t_before))


def test_a_late_wake_up_onto_the_grid_takes_one_sample_not_two():
    ft = FakeTime(57.0)
    source = Script([(1.0, 1.0, 1.0, 1.0)] * 5, [0.0] * 5, ft)
    # The third wait wakes one interval late: 57.3 is skipped, 57.4 is due next.
    sampler, store, window, _, done = prepare(source, 0.1, ft, lambda: LateEvent(ft, [0.0, 0.0, 0.1]), 5,
                                              small_max_bytes(len(COLUMNS)), lambda store, _: store.append)
    sampler.launch()
    try:
        assert done.wait(RUN_DEADLINE_S)
    finally:
        assert sampler.stop() is True
    assert source.times[:3] == [57.0, 57.1, 57.2] and source.times[3] == pytest.approx(57.4)
    assert np.all(np.diff(source.times) > 0), source.times  # got [57.1, 57.2, 57.4, 57.4, 57.5]


# -- soak ------------------------------------------------------------------------------------

N = 1_000_000
INTERVAL = 0.25            # with small integer values every sum is exact: means compare equal
PERIOD = 1000
SPIKE_AT = 777_777
SOAK_COLUMNS = ("proc_rss_mb", "proc_rss_peak_mb", "proc_cpu_percent", "gpu_util_percent", "gpu_mem_used_mb",
                "sys_cpu_percent")
SOAK_MAX_BYTES = 4 << 20   # a ring of ~49k samples: a million evict it ~40 times
CHECK_EVERY = 125_000
SLACK_BYTES = 12 << 20     # interpreter and numpy temporaries, beyond the store's own bound


class Precomputed:
    """A cheap source: the i-th sample is row ``i % PERIOD`` of a precomputed
    table (a one-sample RSS spike at SPIKE_AT). The running reference is
    ``hits``: how often each row was given, so far."""

    name = "precomputed"
    fields = SOAK_COLUMNS   # not caller_safe: the run's baseline row is NaN, weighs nothing

    def __init__(self):
        j = np.arange(PERIOD, dtype=float)
        table = np.stack([100.0 + j, 100.0 + j, (j % 7) * 10.0, np.where(j % 11 == 0, NAN, j % 100),
                          np.full(PERIOD, NAN), 50.0 + (j % 3)])
        self.table = table                                     # (k, PERIOD)
        self.rows = [tuple(r) for r in table.T.tolist()]
        spike = list(self.rows[SPIKE_AT % PERIOD])
        spike[0] = spike[1] = 5000.0
        self.spike = tuple(spike)
        # What sample() answers: the same rows as {field: value}, made once.
        self.answers = [dict(zip(SOAK_COLUMNS, r)) for r in self.rows]
        self.spike_answer = dict(zip(SOAK_COLUMNS, self.spike))
        self.hits = [0] * PERIOD
        self.i = 0

    def start(self, now: float) -> None:
        pass

    def sample(self, now: float):
        i = self.i
        self.i = i + 1
        self.hits[i % PERIOD] += 1
        return self.spike_answer if i == SPIKE_AT else self.answers[i % PERIOD]

    def close(self) -> None:
        pass

    def reference(self, n: int) -> dict:
        """Exact aggregates of the first n samples, from the hit counts."""
        hits = np.array(self.hits, dtype=float)
        assert hits.sum() == n
        table = self.table.copy()
        valid = ~np.isnan(table)
        count = valid.astype(float) @ hits
        total = np.where(valid, table, 0.0) @ hits
        peak = np.where(valid & (hits > 0), table, -np.inf).max(axis=1)
        if n > SPIKE_AT:  # the spike replaced one hit of its row
            j = SPIKE_AT % PERIOD
            total[:2] += 5000.0 - table[:2, j]
            peak[:2] = np.maximum(peak[:2], 5000.0)
        with np.errstate(all="ignore"):
            mean = np.where(count > 0, total / count, NAN)
        peak[np.isinf(peak)] = NAN
        first, last = np.full(len(SOAK_COLUMNS), NAN), np.full(len(SOAK_COLUMNS), NAN)
        for c in range(len(SOAK_COLUMNS)):  # the earliest and the latest known value
            for i in range(min(n, PERIOD)):
                if self.row_at(i)[c] == self.row_at(i)[c]:
                    first[c] = self.row_at(i)[c]
                    break
            for i in range(n - 1, max(-1, n - 1 - PERIOD), -1):
                if self.row_at(i)[c] == self.row_at(i)[c]:
                    last[c] = self.row_at(i)[c]
                    break
        return {"n": count, "mean": mean, "max": peak, "first": first, "last": last}

    def row_at(self, i: int) -> tuple:
        return self.spike if i == SPIKE_AT else self.rows[i % PERIOD]


def rss() -> int:
    return psutil.Process().memory_info().rss


def frames_fit(store) -> int:
    """The live chart's frames, over the default 10 minutes and over all of it,
    stay within their byte budget; returns the larger."""
    sizes = [frame_bytes(build_frame(store, SOAK_COLUMNS, w)) for w in (600.0, math.inf)]
    assert max(sizes) <= MAX_FRAME_BYTES == 64 * 1024, sizes
    return max(sizes)


def test_a_million_samples_at_full_speed_stay_bounded_and_exact():
    # Warm up: imports, numpy's first calls and a frame, so that RSS growth is the soak's own.
    warm = Store(SOAK_COLUMNS, max_bytes=small_max_bytes(len(SOAK_COLUMNS)))
    for i in range(1000):
        warm.append(float(i), float(i), (1.0,) * len(SOAK_COLUMNS))
    frames_fit(warm)
    del warm
    rss_before = rss()

    ft = FakeTime(1000.0)
    source = Precomputed()
    checkpoints = []

    class Checked:
        """store.append, with an exactness check every CHECK_EVERY samples (on the sampler's thread,
        so the source's running reference is at the same sample)."""

        def __init__(self, store, t_open):
            self.store, self.append = store, store.append

        def __call__(self, t, wall, row):
            self.append(t, wall, row)
            if self.store.seq % CHECK_EVERY == 0:
                stats = self.window.stats()
                checkpoints.append((self.store.seq, stats, source.reference(self.store.seq - 1),
                                    self.store.nbytes, len(self.store), frames_fit(self.store)))

    sampler, store, window, sink, done = prepare(source, INTERVAL, ft, lambda: FakeEvent(ft), N, SOAK_MAX_BYTES,
                                                 Checked)
    sink.window = window
    sampler.launch()

    # Meanwhile, what the live dashboard does: frames and a summary from another thread.
    reads, counts = 0, []
    try:
        while not done.wait(0.02):
            frames_fit(store)
            counts.append(window.stats().count)
            reads += 1
            assert reads < RUN_DEADLINE_S / 0.02, "the soak did not end"
    finally:
        assert sampler.stop() is True
    rss_after = rss()

    assert sampler.faults == {}, sampler.faults  # every checkpoint passed its own asserts too
    assert store.seq == N and source.i == N - 1  # and the baseline
    assert counts == sorted(counts)
    assert [c[0] for c in checkpoints] == list(range(CHECK_EVERY, N + 1, CHECK_EVERY))
    for seq, stats, ref, nbytes, held, _ in checkpoints:
        assert stats.count == seq
        assert stats.duration == (seq - 1) * INTERVAL  # the first sample is the baseline, at start
        np.testing.assert_array_equal(stats.n, ref["n"])
        np.testing.assert_array_equal(stats.mean(), ref["mean"])  # exact, not close
        np.testing.assert_array_equal(stats.max, ref["max"])
        np.testing.assert_array_equal(stats.first, ref["first"])
        np.testing.assert_array_equal(stats.last, ref["last"])
        assert nbytes <= SOAK_MAX_BYTES and held <= store.capacity + store.coarse_capacity

    stats = window.close()
    ref = source.reference(N - 1)
    np.testing.assert_array_equal(stats.mean(), ref["mean"])
    summary = summarize(stats)
    assert summary.num_samples == N and summary.duration_sec == (N - 1) * INTERVAL  # the first is at start
    assert summary.peak_rss_mb == 5000.0  # one sample in a million, long since decimated
    assert summary.mean_rss_mb == ref["mean"][0] and summary.mean_cpu_percent == ref["mean"][2]
    assert summary.memory_growth_mb == ref["last"][0] - ref["first"][0]
    assert summary.peak_gpu_mem_mb is None and summary.mean_gpu_util == ref["mean"][3]
    # The decimated timeline still shows the spike.
    _, _, series = store.series(["proc_rss_mb"])
    assert series["proc_rss_mb"].max() == 5000.0

    assert store.nbytes <= SOAK_MAX_BYTES
    growth = rss_after - rss_before
    assert growth <= SOAK_MAX_BYTES + SLACK_BYTES, f"RSS grew {growth / 2**20:.1f} MiB"
    print(f"soak: {N} samples, {len(checkpoints)} checkpoints, {reads} concurrent reads, "
          f"store {store.nbytes / 2**20:.2f} MiB <= {SOAK_MAX_BYTES / 2**20:.0f} MiB, "
          f"RSS growth {growth / 2**20:.1f} MiB, largest frame {max(c[5] for c in checkpoints)} B")
