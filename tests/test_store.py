"""Store: exact window statistics against a plain numpy reference, bounded
memory, decimation that keeps peaks, cursors, rolling windows."""
from __future__ import annotations

import math
import threading
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbmon.sampling.store import BUCKET, FOLD_EVERY, Stats, Store
from nbmon.report.summary import summarize

NAN = math.nan


def small_max_bytes(k: int, rows: int = 8 * BUCKET) -> int:
    """The smallest store allowed for k columns: a ring of 96 and a coarse tier of 32."""
    return rows * 8 * (k + 2)


def reference(t: np.ndarray, rows: np.ndarray, t_open: float) -> dict:
    """Window statistics computed directly over all samples (k, m)."""
    m = t.shape[0]
    prev = t_open if t_open == t_open else (t[0] if m else NAN)
    dt = np.diff(t, prepend=prev) if m else t
    out = {k: [] for k in ("max", "min", "mean", "first", "last", "n")}
    for v in rows:
        ok = ~np.isnan(v)
        vals, w = v[ok], dt[ok]
        if vals.size == 0:
            for key in ("max", "min", "mean", "first", "last"):
                out[key].append(NAN)
            out["n"].append(0)
            continue
        out["max"].append(vals.max())
        out["min"].append(vals.min())
        out["mean"].append((vals * w).sum() / w.sum() if w.sum() > 0 else vals.mean())
        out["first"].append(vals[0])
        out["last"].append(vals[-1])
        out["n"].append(vals.size)
    out["count"] = m
    start = t_open if t_open == t_open else (t[0] if m else NAN)
    out["duration"] = max(0.0, t[-1] - start) if m else 0.0
    return out


def assert_matches(stats: Stats, ref: dict) -> None:
    assert stats.count == ref["count"]
    assert stats.duration == pytest.approx(ref["duration"], rel=1e-12, abs=1e-12)
    for key in ("max", "min", "first", "last"):  # no arithmetic: exact
        np.testing.assert_array_equal(getattr(stats, key), np.array(ref[key], dtype=float), err_msg=key)
    np.testing.assert_array_equal(stats.n, ref["n"])
    np.testing.assert_allclose(stats.mean(), np.array(ref["mean"], dtype=float), rtol=1e-9, atol=1e-9,
                               err_msg="mean")


# Resource figures are non-negative; NaN is "unknown"; steps may be 0 (two
# samples at one instant) or irregular.
value = st.one_of(st.just(NAN), st.floats(0, 1e6, allow_nan=False), st.sampled_from([0.0, 1.0, 1e6]))
step = st.one_of(st.just(0.0), st.floats(1e-6, 10.0), st.sampled_from([0.1, 0.25]))


def draw_column(draw, kind: str, m: int, value) -> list[float]:
    """``m`` values of one column of ``kind``: all NaN, one constant, or each drawn from ``value``."""
    if kind == "all-nan":
        return [NAN] * m
    if kind == "constant":
        return [draw(st.floats(0, 1e3))] * m
    return draw(st.lists(value, min_size=m, max_size=m))


@st.composite
def runs(draw, max_samples: int = 700):
    k = draw(st.integers(1, 3))
    m = draw(st.integers(0, max_samples))
    steps = draw(st.lists(step, min_size=m, max_size=m))
    t = 100.0 + np.cumsum(steps) if m else np.zeros(0)
    cols = []
    for _ in range(k):
        kind = draw(st.sampled_from(["mixed", "all-nan", "constant"]))
        cols.append(draw_column(draw, kind, m, value))
    rows = np.array(cols, dtype=float).reshape(k, m)
    t_open = draw(st.one_of(st.just(NAN), st.floats(0.0, 100.0)))
    late = draw(st.integers(0, m))  # a second window opens after this many samples
    return t, rows, t_open, late


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_window_stats_equal_a_plain_reference_through_eviction(run):
    t, rows, t_open, late = run
    k, m = rows.shape
    max_bytes = small_max_bytes(k)
    store = Store([f"c{j}" for j in range(k)], max_bytes=max_bytes)
    assert store.nbytes <= max_bytes
    whole = store.open_window(t_open)
    part = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy warnings from all-NaN columns either
        for i in range(m):
            if i == late:
                part = store.open_window(NAN)
            store.append(t[i], t[i] + 1e9, rows[:, i])
            if i in (m // 2, m - 1):  # mid-run reads fold only a copy
                assert_matches(whole.stats(), reference(t[:i + 1], rows[:, :i + 1], t_open))
        if part is None:
            part = store.open_window(NAN)
    assert_matches(whole.stats(), reference(t, rows, t_open))
    assert_matches(part.stats(), reference(t[late:], rows[:, late:], NAN))
    closed = whole.close()
    assert_matches(closed, reference(t, rows, t_open))
    store.append(t[-1] + 1 if m else 1.0, 0.0, np.zeros(k))  # after close: not counted
    assert whole.stats().count == m
    assert store.nbytes <= max_bytes
    assert len(store) <= store.capacity + store.coarse_capacity
    if m:
        assert whole.stats().wall_first == t[0] + 1e9 and closed.wall_last == t[-1] + 1e9


@pytest.mark.parametrize("max_bytes", [small_max_bytes(4), 100_000, 1 << 20])
def test_memory_stays_within_max_bytes(max_bytes):
    store = Store(["a", "b", "c", "d"], max_bytes=max_bytes)
    assert store.nbytes <= max_bytes
    for i in range(20 * store.capacity):
        store.append(float(i), float(i), (1.0, 2.0, 3.0, 4.0))
    assert store.nbytes <= max_bytes
    assert len(store) <= store.capacity + store.coarse_capacity
    assert store.seq == 20 * store.capacity


def test_too_small_or_duplicate_columns_are_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        Store(["a"], max_bytes=small_max_bytes(1) - 1)
    with pytest.raises(ValueError, match="duplicate"):
        Store(["a", "a"])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.data())
def test_a_single_sample_spike_survives_decimation(evictions, data):
    store = Store(["x", "y"], max_bytes=small_max_bytes(2))
    n = evictions * store.capacity // 2 + store.capacity
    spike_at = data.draw(st.integers(0, n - 1))
    dip_at = data.draw(st.integers(0, n - 1).filter(lambda i: i != spike_at))
    for i in range(n):
        x = 1000.0 if i == spike_at else (0.5 if i == dip_at else 1.0)
        store.append(float(i), float(i), (x, NAN))
    t, wall, values = store.series()
    assert values["x"].max() == 1000.0
    assert values["x"].min() == 0.5
    assert np.isnan(values["y"]).all()
    assert np.all(np.diff(t) >= 0) and t[-1] == n - 1
    assert len(t) == len(store) <= store.capacity + store.coarse_capacity
    # The newest raw samples are all there, in order.
    assert np.array_equal(t[-store.capacity // 2:], np.arange(n - store.capacity // 2, n, dtype=float))
    later_t, _, later = store.series(["x"], t_from=float(n - 10))
    assert list(later_t) == [float(i) for i in range(n - 10, n)] and list(later) == ["x"]


def test_decimating_an_all_nan_column_warns_nothing():
    store = Store(["gpu_util_percent"], max_bytes=small_max_bytes(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(10 * store.capacity):
            store.append(float(i), float(i), (NAN,))
        _, _, values = store.series()
    assert np.isnan(values["gpu_util_percent"]).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 150), st.booleans()), min_size=1, max_size=40))
def test_rows_since_returns_every_sample_once_and_counts_lost(plan):
    store = Store(["v"], max_bytes=small_max_bytes(1))
    cursor, seen, lost, total = 0, [], 0, 0
    for appended, read in plan:
        for _ in range(appended):
            store.append(float(total), float(total), (float(total),))
            total += 1
        if read:
            t, wall, rows, cursor_next, gone = store.rows_since(cursor)
            assert rows.shape == (1, t.shape[0])
            assert np.array_equal(t, rows[0]) and np.array_equal(t, wall)
            assert list(t) == list(range(cursor + gone, cursor_next))
            seen.extend(t.tolist())
            lost += gone
            cursor = cursor_next
    t, _, _, cursor, gone = store.rows_since(cursor)
    seen.extend(t.tolist())
    lost += gone
    assert cursor == total
    assert len(seen) == len(set(seen))  # exactly once
    assert len(seen) + lost == total
    assert seen == sorted(seen)
    # The copies are safe to keep: later appends do not change them.
    t, *_ = store.rows_since(max(0, total - 3))
    before = t.copy()
    for i in range(store.capacity):
        store.append(1e9 + i, 0.0, (0.0,))
    assert np.array_equal(t, before)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 800), st.lists(st.integers(0, 800), max_size=12), st.data())
def test_roll_window_splits_a_run_into_consecutive_periods(n, cuts, data):
    store = Store(["v"], max_bytes=small_max_bytes(1))
    steps = data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.3, 2.0]), min_size=n, max_size=n))
    t = 10.0 + np.cumsum(steps)
    values = data.draw(st.lists(value, min_size=n, max_size=n))
    whole = store.open_window(9.0)
    window = store.open_window(9.0)
    cuts = sorted({c for c in cuts if c < n})
    periods = []
    for i in range(n):
        if cuts and i == cuts[0]:
            cuts.pop(0)
            closed, window = store.roll_window(window, t[i - 1] if i else 9.0)
            periods.append(closed)
        store.append(t[i], t[i], (values[i],))
    periods.append(window.close())
    assert sum(p.count for p in periods) == n
    assert whole.stats().count == n
    v = np.array(values)
    at = 0
    for p in periods:
        # Each period continues where the previous one stopped: its first
        # sample stands for the time since the previous period's last.
        prev = t[at - 1] if at else 9.0
        ref = reference(t[at:at + p.count], v[at:at + p.count][None, :], prev)
        assert_matches(p, ref)
        at += p.count
    # The periods' time-weighted sums add up to the run's.
    assert sum(float(p.wsum[0]) for p in periods) == pytest.approx(float(whole.stats().wsum[0]), rel=1e-9)
    assert sum(float(p.wtime[0]) for p in periods) == pytest.approx(float(whole.stats().wtime[0]), rel=1e-9)


def test_baseline_window_counts_growth_from_the_latest_sample():
    store = Store(["proc_rss_mb"], max_bytes=small_max_bytes(1))
    for i in range(5):
        store.append(float(i), float(i), (100.0 + i,))
    window = store.open_window(99.0, baseline=True)
    store.append(5.5, 5.5, (300.0,))
    store.append(6.0, 6.0, (250.0,))
    stats = window.close()
    assert stats.count == 2
    assert stats.first[0] == 104.0 and stats.last[0] == 250.0  # growth from the baseline
    assert stats.max[0] == 300.0 and stats.min[0] == 250.0     # the baseline itself is not a sample
    assert stats.t_open == 4.0 and stats.duration == 2.0
    assert stats.mean()[0] == pytest.approx((300.0 * 1.5 + 250.0 * 0.5) / 2.0)


def test_latest_and_len():
    store = Store(["a", "b"], max_bytes=small_max_bytes(2))
    assert store.latest() == {} and len(store) == 0
    store.append(1.0, 2.0, (3.0, NAN))
    latest = store.latest()
    assert latest["a"] == 3.0 and math.isnan(latest["b"]) and latest["t"] == 1.0 and latest["wall"] == 2.0
    assert len(store) == 1


def test_summary_over_a_million_samples_is_exact():
    n = 1_000_000
    cols = ["proc_rss_mb", "proc_rss_peak_mb", "proc_cpu_percent"]
    store = Store(cols, max_bytes=1 << 20)
    window = store.open_window(-0.25)
    i = np.arange(n)
    # Small integers at a 0.25 s step: every sum is exact in float64, so the
    # means must be equal, not close.
    rss = (i % 1000).astype(float) + 100.0
    rss[123_457] = 5000.0
    cpu = (i % 7).astype(float) * 10.0
    cpu[::11] = NAN
    append = store.append
    for j in range(n):
        append(j * 0.25, 1e9 + j * 0.25, (rss[j], rss[j], cpu[j]))
    stats = window.stats()
    assert stats.count == n
    assert stats.duration == (n - 1) * 0.25 + 0.25
    assert stats.max[0] == 5000.0 and stats.min[0] == 100.0
    assert stats.mean()[0] == rss.sum() / n
    ok = ~np.isnan(cpu)
    assert stats.mean()[2] == cpu[ok].sum() / ok.sum()
    assert stats.first[0] == 100.0 and stats.last[0] == rss[-1]
    summary = summarize(stats)
    assert summary.num_samples == n
    assert summary.peak_rss_mb == 5000.0
    assert summary.mean_rss_mb == rss.sum() / n
    assert summary.memory_growth_mb == rss[-1] - rss[0]
    assert summary.duration_sec == n * 0.25
    assert summary.peak_cpu_percent == 60.0
    assert len(store) <= store.capacity + store.coarse_capacity


def test_concurrent_appends_and_reads_stay_consistent():
    store = Store(["v"], max_bytes=small_max_bytes(1))
    window = store.open_window(NAN)
    n = 20 * FOLD_EVERY * 10
    errors = []

    def writer():
        try:
            for i in range(n):
                store.append(float(i), float(i), (float(i),))
        except Exception as err:  # surfaced below
            errors.append(err)

    thread = threading.Thread(target=writer)
    thread.start()
    counts = []
    while thread.is_alive():
        stats = window.stats()
        counts.append(stats.count)
        if stats.count:
            assert stats.max[0] == stats.count - 1 and stats.last[0] == stats.count - 1
        store.series()
    thread.join()
    assert not errors
    assert counts == sorted(counts)
    assert window.stats().count == n
