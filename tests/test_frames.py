"""Min/max decimation and live-chart frames built from a real Store."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbmon.views.frames import MAX_FRAME_BYTES, build_frame, frame_bytes, minmax_indices
from nbmon.sampling.store import Store

COLUMNS = ("proc_cpu_percent", "sys_cpu_percent", "proc_rss_mb", "sys_mem_used_mb")
ALL_COLUMNS = COLUMNS + tuple(f"extra{i}" for i in range(26))  # ~30 columns, like a real run


def reference_indices(v, budget):
    """Per-bucket loop over the same bucket edges: what minmax_indices must equal."""
    n = len(v)
    if n <= budget:
        return None
    buckets = budget // 2
    size, longer = divmod(n, buckets)
    lengths = [size + 1] * longer + [size] * (buckets - longer)
    edges = np.concatenate([[0], np.cumsum(lengths)])
    idx = []
    for a, b in zip(edges[:-1], edges[1:]):
        chunk = v[a:b]
        if np.isnan(chunk).all():
            lo = hi = 0
        else:
            lo, hi = int(np.nanargmin(chunk)), int(np.nanargmax(chunk))
        idx += [a + min(lo, hi), a + max(lo, hi)]
    return np.array(idx)


# -- minmax_indices ----------------------------------------------------------


@pytest.mark.parametrize("where", [0, 1, 4_321, 99_998, 99_999])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_single_sample_spike_survives(where, sign):
    n = 100_000
    v = np.sin(np.arange(n) / 500.0)
    v[where] = 1000.0 * sign
    idx = minmax_indices(v, 2000)
    assert len(idx) <= 2000
    assert v[idx].max() == v.max()
    assert v[idx].min() == v.min()
    assert where in idx  # the spike keeps its own sample (and so its time)


@pytest.mark.parametrize("n", [3, 1_999, 2_000, 2_001, 2_999, 10_007, 123_457])
@pytest.mark.parametrize("budget", [2, 3, 10, 999, 2_000])
def test_budget_respected_time_order_kept_and_matches_reference(n, budget):
    rng = np.random.default_rng(n * 7 + budget)
    v = rng.normal(size=n)
    idx = minmax_indices(v, budget)
    ref = reference_indices(v, budget)
    if n <= budget:
        assert idx is None and ref is None
        return
    assert len(idx) == budget // 2 * 2 <= budget      # the whole budget is used
    assert np.all(np.diff(idx) >= 0)                  # time order
    np.testing.assert_array_equal(idx, ref)
    assert v[idx].max() == v.max() and v[idx].min() == v.min()


def test_short_series_needs_no_reduction():
    v = np.array([1.0, np.nan, 3.0, 2.0, 0.0])
    assert minmax_indices(v, 5) is None
    assert minmax_indices(v, 6) is None
    assert minmax_indices(v, 4) is not None


def test_all_nan_buckets_give_nan_and_partial_nan_buckets_ignore_it():
    n, budget = 10_000, 100                       # 50 buckets of 200
    v = np.ones(n)
    v[:200] = np.nan                              # bucket 0: all NaN
    v[200:399] = np.nan                           # bucket 1: NaN except its last sample
    v[399] = 7.0
    v[400] = np.nan                               # bucket 2 starts with NaN, has a dip
    v[450] = -3.0
    idx = minmax_indices(v, budget)
    v_out = v[idx]
    assert len(idx) == budget
    assert np.isnan(v_out[0]) and np.isnan(v_out[1])
    assert v_out[2] == v_out[3] == 7.0 and idx[2] == idx[3] == 399
    assert -3.0 in v_out[4:6] and 450 in idx[4:6]
    assert not np.isnan(v_out[2:]).any()
    np.testing.assert_array_equal(idx, reference_indices(v, budget))


def test_all_nan_series_and_infinities():
    v = np.full(5_000, np.nan)
    idx = minmax_indices(v, 10)
    assert len(idx) == 10 and np.isnan(v[idx]).all()
    v = np.zeros(5_000)
    v[10], v[20] = np.inf, -np.inf
    assert {10, 20} <= set(minmax_indices(v, 10).tolist())


@pytest.mark.parametrize("budget", [0, 1, -4, 2.5, True, None])
def test_bad_budget_is_refused(budget):
    with pytest.raises(ValueError, match="budget"):
        minmax_indices(np.arange(10.0), budget)


# -- build_frame -------------------------------------------------------------


def fill(store: Store, n: int, dt: float, *, t0: float = 1000.0, spike_at: int | None = None) -> None:
    k = len(store.columns)
    base = np.linspace(1.0, 2.0, k)
    wave = 1.0 + 0.5 * np.sin(np.arange(1024) / 40.0)
    for i in range(n):
        row = base * wave[i & 1023]
        if i == spike_at:
            row = row.copy()
            row[0] = 5000.0
        store.append(t0 + i * dt, 1.7e9 + i * dt, row)


@pytest.fixture(scope="module")
def big_raw_store():
    """1,000,000 samples, all held raw (~30 columns), 1 ms apart: the whole
    run is inside a 600 s window."""
    store = Store(ALL_COLUMNS, max_bytes=(len(ALL_COLUMNS) + 2) * 8 * 1_400_000)
    fill(store, 1_000_000, 0.0005, spike_at=654_321)
    assert store.seq == 1_000_000 and len(store) == 1_000_000
    return store


@pytest.fixture(scope="module")
def big_default_store():
    """1,000,000 samples in a store of the default size: a raw ring plus the coarse tier."""
    store = Store(ALL_COLUMNS)
    fill(store, 1_000_000, 0.0005, spike_at=999_000)
    assert len(store) < 1_000_000
    return store


def check_frame(frame, columns):
    assert list(frame) == list(columns)
    for x, y in frame.values():
        assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
        assert x.dtype == np.float32 and y.dtype == np.float32
        assert x.ndim == y.ndim == 1 and x.shape == y.shape
        assert x.flags.c_contiguous and y.flags.c_contiguous
        if len(x):
            assert np.all(np.diff(x) >= 0)
            assert x.max() <= 0.0
    assert frame_bytes(frame) <= MAX_FRAME_BYTES


@pytest.mark.parametrize("store_name", ["big_raw_store", "big_default_store"])
def test_frame_of_a_million_samples_is_small_float32_and_keeps_the_spike(store_name, request):
    store = request.getfixturevalue(store_name)
    frame = build_frame(store, COLUMNS, 600.0)
    check_frame(frame, COLUMNS)
    for x, _ in frame.values():
        assert len(x) == 2000
        assert x[-1] > -1.0                       # reaches (about) now
        assert x[0] >= -600.0
    assert frame_bytes(frame) == 4 * 2000 * 2 * 4 == 64_000
    # the one-sample spike in proc_cpu_percent is drawn
    assert frame["proc_cpu_percent"][1].max() == 5000.0
    assert frame["sys_cpu_percent"][1].max() < 5000.0


def test_frame_payload_stays_bounded_with_many_traces(big_default_store):
    frame = build_frame(big_default_store, ALL_COLUMNS, 600.0)
    check_frame(frame, ALL_COLUMNS)
    per_trace = {len(x) for x, _ in frame.values()}
    assert len(per_trace) == 1 and per_trace.pop() <= MAX_FRAME_BYTES // (8 * len(ALL_COLUMNS))
    assert frame["proc_cpu_percent"][1].max() == 5000.0


def test_frame_takes_only_the_window(big_raw_store):
    frame = build_frame(big_raw_store, ["proc_rss_mb"], 10.0, budget_per_trace=100_000, max_bytes=1 << 20)
    x, y = frame["proc_rss_mb"]
    # 10 s of 0.5 ms samples = 20,000 samples (plus the one on the edge), not decimated
    assert 20_000 <= len(x) <= 20_001
    assert x[0] >= -10.0 and x[-1] == 0.0
    np.testing.assert_allclose(np.diff(x), 0.0005, atol=1e-4)


def test_small_frame_is_exact_and_shares_x():
    store = Store(COLUMNS, max_bytes=1 << 20)
    fill(store, 50, 0.1)
    frame = build_frame(store, COLUMNS, 600.0)
    check_frame(frame, COLUMNS)
    x, y = frame["proc_rss_mb"]
    assert len(x) == 50 and x[-1] == 0.0
    np.testing.assert_allclose(x[0], -4.9, rtol=1e-6)
    t, _wall, values = store.series(["proc_rss_mb"])
    np.testing.assert_array_equal(y, values["proc_rss_mb"].astype(np.float32))
    assert frame["proc_cpu_percent"][0] is x      # undecimated traces share x


def test_missing_columns_are_left_out_and_empty_store_gives_empty_arrays():
    store = Store(("proc_cpu_percent", "proc_rss_mb"), max_bytes=1 << 20)
    frame = build_frame(store, COLUMNS + ("gpu0_util_percent",), 60.0)
    assert list(frame) == ["proc_cpu_percent", "proc_rss_mb"]
    for x, y in frame.values():
        assert len(x) == len(y) == 0 and x.dtype == y.dtype == np.float32
    assert frame_bytes(frame) == 0
    assert build_frame(store, ["gpu0_util_percent"], 60.0) == {}


def test_nan_columns_come_through_as_nan():
    store = Store(("proc_cpu_percent", "gpu_util_percent"), max_bytes=1 << 22)
    for i in range(20_000):
        store.append(i * 0.01, 0.0, (float(i % 7), math.nan if i < 15_000 else 50.0))
    frame = build_frame(store, ["gpu_util_percent"], 1e6, budget_per_trace=200)
    x, y = frame["gpu_util_percent"]
    assert len(y) == 200
    assert np.isnan(y[:150]).all()                # the 75 all-NaN buckets
    assert (y[150:] == 50.0).all()


@pytest.mark.parametrize("window_s", [0, -1.0, float("nan"), "60"])
def test_bad_window_is_refused(window_s):
    store = Store(COLUMNS, max_bytes=1 << 20)
    with pytest.raises(ValueError, match="window_s"):
        build_frame(store, COLUMNS, window_s)
