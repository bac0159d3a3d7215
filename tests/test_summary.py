"""ResourceSummary / ResourceSample: calibrax's records, round trips, and
summaries of real store windows."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from nbmon.sampling.store import Store
from nbmon.report.summary import ResourceSample, ResourceSummary, summarize

CALIBRAX_FIELDS = ["peak_rss_mb", "mean_rss_mb", "peak_gpu_mem_mb", "mean_gpu_util", "memory_growth_mb",
                   "num_samples", "duration_sec", "mean_gpu_clock_mhz", "mean_gpu_power_w"]
REQUIRED = dict(peak_rss_mb=512.0, mean_rss_mb=300.5, peak_gpu_mem_mb=None, mean_gpu_util=None,
                memory_growth_mb=-12.25, num_samples=42, duration_sec=4.2)


def full() -> ResourceSummary:
    return ResourceSummary(peak_rss_mb=2048.0, mean_rss_mb=1500.0, peak_gpu_mem_mb=10240.0, mean_gpu_util=55.5,
                           memory_growth_mb=100.0, num_samples=1000, duration_sec=100.0,
                           mean_gpu_clock_mhz=1800.0, mean_gpu_power_w=250.0, mean_cpu_percent=80.0,
                           peak_cpu_percent=199.0, cpu_time_sec=80.0, peak_rss_exact=True,
                           peak_proc_gpu_mem_mb=4096.0, start_time=1.7e9, end_time=1.7e9 + 100.0)


# -- the record ------------------------------------------------------------------

def test_calibrax_fields_come_first_in_order_with_their_defaults():
    fields = dataclasses.fields(ResourceSummary)
    assert [f.name for f in fields][:9] == CALIBRAX_FIELDS
    for f in fields[:7]:
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
    for f in fields[7:]:
        # nbmon's additions are None when unknown; figures (every metric's statistics) is empty then.
        assert f.default is None or (f.name == "figures" and f.default_factory is dict), f.name
    assert [f.name for f in dataclasses.fields(ResourceSample)] == [
        "timestamp", "cpu_percent", "rss_mb", "gpu_util", "gpu_mem_mb", "gpu_clock_mhz", "gpu_power_w"]


def test_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        ResourceSummary(512.0, 300.5, None, None, 0.0, 1, 1.0)
    s = ResourceSummary(**REQUIRED)
    assert s.mean_gpu_clock_mhz is None and s.mean_gpu_power_w is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.peak_rss_mb = 1.0
    sample = ResourceSample(timestamp=1.0, cpu_percent=50.0, rss_mb=10.0, gpu_util=None, gpu_mem_mb=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.rss_mb = 2.0
    assert sample.gpu_clock_mhz is None and sample.gpu_power_w is None


def test_zeroed():
    z = ResourceSummary.zeroed()
    assert (z.peak_rss_mb, z.mean_rss_mb, z.memory_growth_mb, z.num_samples, z.duration_sec) == (0.0, 0.0, 0.0, 0, 0.0)
    assert z.peak_gpu_mem_mb is None and z.mean_gpu_util is None
    assert ResourceSummary.from_dict(z.to_dict()) == z


# -- to_dict / from_dict ------------------------------------------------------------

def test_to_dict_writes_the_gpu_fields_always_and_the_other_optionals_when_known():
    # calibrax's dict: peak_gpu_mem_mb and mean_gpu_util null when unknown.
    d = ResourceSummary(**REQUIRED).to_dict()
    assert d == {"peak_rss_mb": 512.0, "mean_rss_mb": 300.5, "peak_gpu_mem_mb": None, "mean_gpu_util": None,
                 "memory_growth_mb": -12.25, "num_samples": 42, "duration_sec": 4.2}
    assert list(d) == CALIBRAX_FIELDS[:7]
    assert list(full().to_dict()) == [f.name for f in dataclasses.fields(ResourceSummary)
                                      if getattr(full(), f.name) not in (None, {})]
    # from_dict reads it, and the form without them that nbmon wrote before.
    without = {k: v for k, v in d.items() if v is not None}
    assert ResourceSummary.from_dict(d) == ResourceSummary.from_dict(without) == ResourceSummary(**REQUIRED)


def test_to_dict_gives_python_primitives_from_numpy_scalars():
    s = ResourceSummary(peak_rss_mb=np.float32(1.5), mean_rss_mb=np.float64(1.25), peak_gpu_mem_mb=np.float64(3.0),
                        mean_gpu_util=np.int64(7), memory_growth_mb=np.float16(0.5), num_samples=np.int64(3),
                        duration_sec=np.float64(2.0), mean_gpu_clock_mhz=np.int32(1500),
                        peak_rss_exact=np.bool_(True), start_time=np.float64(1.7e9))
    d = s.to_dict()
    for key, value in d.items():
        expected = {"num_samples": int, "peak_rss_exact": bool}.get(key, float)
        assert type(value) is expected, (key, type(value))
    assert d["num_samples"] == 3 and d["peak_rss_exact"] is True and d["mean_gpu_util"] == 7.0
    json.dumps(d)  # plain JSON
    assert ResourceSummary.from_dict(d) == s


@pytest.mark.parametrize("summary", [ResourceSummary(**REQUIRED), full(), ResourceSummary.zeroed()],
                         ids=["required", "full", "zeroed"])
def test_round_trip(summary):
    d = summary.to_dict()
    assert ResourceSummary.from_dict(d) == summary
    assert ResourceSummary.from_dict(json.loads(json.dumps(d))) == summary


@pytest.mark.parametrize("missing", ["peak_rss_mb", "mean_rss_mb", "memory_growth_mb", "num_samples", "duration_sec"])
def test_from_dict_missing_key_is_named(missing):
    d = full().to_dict()
    del d[missing]
    with pytest.raises(ValueError, match=missing):
        ResourceSummary.from_dict(d)


def test_from_dict_ignores_unknown_keys():
    # A file written by a newer version, with fields this one does not know (calibrax ignores them too).
    d = full().to_dict() | {"peak_vram_gb": 1.0, "host": {"name": "gpu-7"}}
    assert ResourceSummary.from_dict(d) == full()


@pytest.mark.parametrize("key,value", [
    ("peak_rss_mb", "512"), ("mean_rss_mb", True), ("duration_sec", [1.0]), ("mean_gpu_util", "high"),
    ("num_samples", 1.5), ("num_samples", "3"), ("num_samples", math.inf), ("num_samples", math.nan),
    ("num_samples", False), ("peak_rss_exact", 1), ("peak_rss_exact", "yes"), ("start_time", 1j),
    ("peak_rss_mb", None),
])
def test_from_dict_mistyped_value_is_named(key, value):
    d = full().to_dict()
    d[key] = value
    with pytest.raises(ValueError, match=key):
        ResourceSummary.from_dict(d)


def test_from_dict_accepts_whole_floats_and_none_optionals():
    d = ResourceSummary(**REQUIRED).to_dict()
    d["num_samples"] = 42.0
    d["mean_gpu_power_w"] = None
    d["peak_rss_mb"] = 512  # an int for a float
    s = ResourceSummary.from_dict(d)
    assert s.num_samples == 42 and type(s.num_samples) is int
    assert type(s.peak_rss_mb) is float
    assert s == ResourceSummary(**REQUIRED)


def test_from_dict_needs_a_dict():
    with pytest.raises(ValueError, match="dict"):
        ResourceSummary.from_dict([("peak_rss_mb", 1.0)])


# -- for humans ----------------------------------------------------------------------

def test_str_has_human_units():
    # nbmon.format's rules (tests/format_cases.json has the whole table).
    text = str(full())
    assert "2.0 GiB" in text           # peak RSS
    assert "1.5 GiB" in text           # mean RSS 1500 MiB
    assert "+100 MiB" in text          # growth
    assert "1:40" in text              # duration
    assert "80.0 %" in text and "199 %" in text
    assert "(exact)" in text and "1000" in text
    small = str(ResourceSummary(**REQUIRED))
    assert "512 MiB" in small and "-12.3 MiB" in small and "4.20 s" in small
    assert "GPU" not in small


def test_html_is_a_table():
    html = full()._repr_html_()
    assert "<table" in html and "</table>" in html
    assert html.count("<tr") == len(full().rows())
    assert "2.0 GiB" in html


# -- summarize() over store windows -------------------------------------------------------

def window_stats(columns, rows, dt=0.5, t_open=0.0):
    store = Store(columns)
    window = store.open_window(t_open)
    for i, row in enumerate(rows, start=1):
        store.append(t_open + i * dt, 1.7e9 + t_open + i * dt, row)
    return window.close()


def test_cpu_time_is_read_from_the_clocks_and_the_mean_follows_it():
    """CPU time is the clocks' column's growth over the window (from its
    baseline), not a mean of rates times the duration: CPU counted but shown
    in no % (a process found late) is in it, and the mean CPU % is it."""
    store = Store(["proc_cpu_percent", "proc_cpu_time_s"])
    store.append(10.0, 1.7e9, [math.nan, 2.0])          # the run's baseline
    window = store.open_window(10.0, baseline=True)
    for i, (pct, cum) in enumerate([(100.0, 2.5), (50.0, 3.5), (0.0, 3.5)], start=1):
        store.append(10.0 + 0.5 * i, 1.7e9 + 0.5 * i, [pct, cum])  # 0.5 s more than 50 % shows
    s = summarize(window.close())
    assert s.cpu_time_sec == pytest.approx(1.5) and s.duration_sec == pytest.approx(1.5)
    assert s.mean_cpu_percent == pytest.approx(100.0) and s.peak_cpu_percent == 100.0


def test_summarize_a_cpu_only_window():
    cols = ["proc_cpu_percent", "proc_rss_mb", "proc_rss_peak_mb", "gpu_util_percent", "gpu_mem_used_mb"]
    nan = math.nan
    rows = [(100.0, 100.0, 150.0, nan, nan), (50.0, 200.0, 200.0, nan, nan), (0.0, 120.0, 400.0, nan, nan)]
    s = summarize(window_stats(cols, rows))
    assert s.num_samples == 3 and s.duration_sec == 1.5
    assert s.peak_rss_mb == 400.0                    # the exact peak column, not the sampled RSS
    assert s.mean_rss_mb == pytest.approx(140.0)
    assert s.memory_growth_mb == 20.0
    assert s.mean_cpu_percent == pytest.approx(50.0) and s.peak_cpu_percent == 100.0
    assert s.cpu_time_sec is None   # read from the CPU clocks' column only, which this window lacks
    assert s.peak_gpu_mem_mb is None and s.mean_gpu_util is None   # no GPU: None, never NaN
    assert s.peak_rss_kind == "sampled"   # no upper end (proc_pss_peak_bound_mb): not known to be exact
    assert s.start_time == pytest.approx(1.7e9) and s.end_time == pytest.approx(1.7e9 + 1.5)
    assert s.peak_rss_mb >= s.mean_rss_mb
    assert ResourceSummary.from_dict(s.to_dict()) == s


def test_summarize_falls_back_to_sampled_rss_and_empty_is_zeroed():
    cols = ["proc_rss_mb", "proc_rss_peak_mb"]
    s = summarize(window_stats(cols, [(10.0, math.nan), (30.0, math.nan)]))
    assert s.peak_rss_mb == 30.0 and s.peak_rss_exact is False
    assert summarize(window_stats(cols, [])) == ResourceSummary.zeroed()


def test_summarize_with_gpu_columns():
    cols = ["proc_rss_mb", "gpu_util_percent", "gpu_mem_used_mb", "gpu_proc_mem_mb", "gpu_power_w",
            "gpu_sm_clock_mhz"]
    rows = [(1.0, 20.0, 1000.0, 100.0, 100.0, 1500.0), (1.0, 40.0, 3000.0, 300.0, 200.0, 1700.0)]
    s = summarize(window_stats(cols, rows))
    assert s.mean_gpu_util == pytest.approx(30.0) and s.peak_gpu_mem_mb == 3000.0
    assert s.peak_proc_gpu_mem_mb == 300.0
    assert s.mean_gpu_power_w == pytest.approx(150.0) and s.mean_gpu_clock_mhz == pytest.approx(1600.0)
    assert "GPU" in str(s)
    assert ResourceSummary.from_dict(s.to_dict()) == s
