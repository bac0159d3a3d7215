"""calibrax's ``calibrax.profiling.resources`` API, as nbmon offers it."""
from __future__ import annotations

import dataclasses
import inspect
import math
import time

import pytest

import nbmon
from helpers import nbmon_threads, wait_until
from nbmon import GPUProfilerProtocol, ResourceMonitor, ResourceSample, ResourceSummary


GPU_FIELDS = ("gpu_util", "gpu_mem_mb", "gpu_clock_mhz", "gpu_power_w")


class GoodProfiler:
    def get_utilization(self) -> float:
        return 50.0

    def get_memory_usage(self) -> dict[str, float]:
        return {"gpu_memory_used_mb": 1000.0, "gpu_memory_total_mb": 8000.0}

    def get_clock_info(self) -> dict[str, float]:
        return {"gpu_clock_mhz": 1500.0, "mem_clock_mhz": 5000.0}

    def get_power_info(self) -> dict[str, float]:
        return {"power_draw_w": 200.0, "power_limit_w": 300.0}


# -- the seed's own usage ----------------------------------------------------


def test_seed_usage_runs_unchanged():
    def run_benchmark(mon):
        block = bytearray(32 << 20)  # some memory, touched
        wait_until(lambda: len(mon.samples) >= 3, timeout=20.0, what="3 samples")
        return len(block)

    t0 = time.perf_counter()
    with ResourceMonitor() as mon:
        run_benchmark(mon)
    summary = mon.summary
    t1 = time.perf_counter()

    assert isinstance(summary, ResourceSummary)
    assert summary.num_samples == len(mon.samples) >= 3
    assert summary.peak_rss_mb >= summary.mean_rss_mb > 0
    assert 0 < summary.duration_sec <= t1 - t0
    assert summary.peak_gpu_mem_mb is None and summary.mean_gpu_util is None  # no gpu_profiler
    assert not nbmon_threads()


def test_summary_without_gpu_round_trips():
    with ResourceMonitor(sample_interval_sec=0.02) as mon:
        wait_until(lambda: len(mon.samples) >= 2, timeout=20.0, what="2 samples")
    summary = mon.summary
    assert ResourceSummary.from_dict(summary.to_dict()) == summary


def test_zeroed_summary_round_trips():
    summary = ResourceMonitor().summary
    assert ResourceSummary.from_dict(summary.to_dict()) == summary


def test_summary_with_gpu_round_trips():
    with ResourceMonitor(sample_interval_sec=0.02, gpu_profiler=GoodProfiler()) as mon:
        wait_until(lambda: len(mon.samples) >= 2, timeout=20.0, what="2 samples")
    summary = mon.summary
    assert ResourceSummary.from_dict(summary.to_dict()) == summary


def test_defaults():
    params = inspect.signature(ResourceMonitor).parameters
    assert list(params) == ["sample_interval_sec", "gpu_profiler"]
    assert params["sample_interval_sec"].default == 0.1
    assert params["gpu_profiler"].default is None
    mon = ResourceMonitor()
    assert mon.sample_interval_sec == 0.1 and mon.gpu_profiler is None
    assert mon.monitor.interval == 0.1
    assert not nbmon_threads()  # constructing starts nothing


def test_protocol_is_runtime_checkable():
    assert isinstance(GoodProfiler(), GPUProfilerProtocol)
    assert not isinstance(object(), GPUProfilerProtocol)
    assert nbmon.GPUProfilerProtocol is GPUProfilerProtocol


# -- samples -------------------------------------------------------------------


def test_resource_sample_fields():
    names = [(f.name, f.default) for f in dataclasses.fields(ResourceSample)]
    assert names == [("timestamp", dataclasses.MISSING), ("cpu_percent", dataclasses.MISSING),
                     ("rss_mb", dataclasses.MISSING), ("gpu_util", dataclasses.MISSING),
                     ("gpu_mem_mb", dataclasses.MISSING), ("gpu_clock_mhz", None),
                     ("gpu_power_w", None)]
    s = ResourceSample(timestamp=1.0, cpu_percent=2.0, rss_mb=3.0, gpu_util=None, gpu_mem_mb=None)
    assert s.gpu_clock_mhz is None and s.gpu_power_w is None
    with pytest.raises(TypeError):
        ResourceSample(1.0, 2.0, 3.0, None, None)  # keyword-only, as in the seed


def test_samples_are_a_copy_with_perf_counter_timestamps():
    t0 = time.perf_counter()
    with ResourceMonitor(sample_interval_sec=0.02) as mon:
        wait_until(lambda: len(mon.samples) >= 3, timeout=20.0, what="3 samples")
    t1 = time.perf_counter()
    samples = mon.samples
    n = len(samples)
    assert n == mon.summary.num_samples
    samples.clear()
    samples.append("junk")
    assert len(mon.samples) == n and all(isinstance(s, ResourceSample) for s in mon.samples)
    assert mon.samples is not mon.samples

    stamps = [s.timestamp for s in mon.samples]
    assert stamps == sorted(stamps) and t0 <= stamps[0] and stamps[-1] <= t1
    for s in mon.samples:
        assert s.rss_mb > 0 and s.cpu_percent >= 0
        assert all(getattr(s, f) is None for f in GPU_FIELDS)


def test_exception_in_the_body_stops_the_monitor():
    with pytest.raises(KeyError):
        with ResourceMonitor(sample_interval_sec=0.01) as mon:
            wait_until(lambda: len(mon.samples) >= 2, timeout=20.0, what="2 samples")
            raise KeyError("benchmark failed")
    assert not mon.monitor.running and not nbmon_threads()
    assert mon.summary.num_samples == len(mon.samples) >= 2


def test_samples_before_start_is_empty():
    assert ResourceMonitor().samples == []


# -- zeroed summaries ------------------------------------------------------------


def assert_zeroed(summary: ResourceSummary) -> None:
    assert (summary.peak_rss_mb, summary.mean_rss_mb, summary.memory_growth_mb,
            summary.num_samples, summary.duration_sec) == (0.0, 0.0, 0.0, 0, 0.0)
    assert summary.peak_gpu_mem_mb is None and summary.mean_gpu_util is None
    assert summary.mean_gpu_clock_mhz is None and summary.mean_gpu_power_w is None


def test_summary_never_started_is_zeroed():
    mon = ResourceMonitor()
    assert_zeroed(mon.summary)
    assert mon.samples == []


def test_stopped_before_the_first_tick_has_the_baseline_and_the_final_sample():
    # The engine starts every run with a baseline sample and ends it with one of
    # its final state, so a run shorter than an interval is measured, not zeroed.
    with ResourceMonitor(sample_interval_sec=60) as mon:
        assert mon.monitor.running
        block = bytearray(64 << 20)  # touched: growth counts from the baseline
    assert not mon.monitor.running
    assert not nbmon_threads()
    first, last = mon.samples
    assert first.cpu_percent == 0.0 and last.rss_mb > first.rss_mb + 60
    summary = mon.summary
    assert summary.num_samples == 2 and summary.peak_rss_mb >= last.rss_mb
    assert summary.memory_growth_mb == last.rss_mb - first.rss_mb
    del block


# -- GPU profilers -------------------------------------------------------------------


def test_good_profiler_fills_the_gpu_fields():
    with ResourceMonitor(sample_interval_sec=0.02, gpu_profiler=GoodProfiler()) as mon:
        wait_until(lambda: len(mon.samples) >= 3, timeout=20.0, what="3 samples")
    for s in mon.samples:
        assert (s.gpu_util, s.gpu_mem_mb, s.gpu_clock_mhz, s.gpu_power_w) == (50.0, 1000.0, 1500.0, 200.0)
    summary = mon.summary
    assert summary.mean_gpu_util == 50.0 and summary.peak_gpu_mem_mb == 1000.0
    assert summary.mean_gpu_clock_mhz == 1500.0 and summary.mean_gpu_power_w == 200.0
    # The profiler replaces NVML: no per-device NVML columns.
    assert not any(c.startswith("gpu0_") for c in mon.monitor.fields)


class RaisingProfiler:
    calls = 0

    def _boom(self):
        type(self).calls += 1
        raise RuntimeError("the GPU profiler broke")

    get_utilization = get_memory_usage = get_clock_info = get_power_info = _boom


class MalformedProfiler:
    def __init__(self, util, memory, clock, power):
        self.answers = util, memory, clock, power

    def get_utilization(self):
        return self.answers[0]

    def get_memory_usage(self):
        return self.answers[1]

    def get_clock_info(self):
        return self.answers[2]

    def get_power_info(self):
        return self.answers[3]


@pytest.mark.parametrize("profiler", [
    RaisingProfiler(),
    MalformedProfiler(None, {}, None, {"power_limit_w": 300.0}),               # None, missing keys
    MalformedProfiler("abc", "gpu_memory_used_mb", "1500", {"power_draw_w": "200"}),  # strings
    MalformedProfiler(-5.0, {"gpu_memory_used_mb": -1.0}, {"gpu_clock_mhz": -1500},
                      {"power_draw_w": -200.0}),                                # negative
    MalformedProfiler(math.nan, {"gpu_memory_used_mb": math.inf}, {"gpu_clock_mhz": True},
                      [200.0]),                                                  # nan, inf, bool, list
], ids=["raises", "none-and-missing", "strings", "negative", "nan-inf-bool-list"])
def test_bad_profiler_gives_none_and_never_kills_the_thread(profiler):
    with ResourceMonitor(sample_interval_sec=0.01, gpu_profiler=profiler) as mon:
        wait_until(lambda: len(mon.samples) >= 5, timeout=20.0, what="5 samples")
        assert mon.monitor.running
    samples = mon.samples
    assert len(samples) >= 5
    for s in samples:
        assert all(getattr(s, f) is None for f in GPU_FIELDS), s
        assert s.rss_mb > 0  # the rest of the sample is unharmed
    summary = mon.summary
    assert summary.mean_gpu_util is None and summary.peak_gpu_mem_mb is None
    assert summary.mean_gpu_clock_mhz is None and summary.mean_gpu_power_w is None
    assert summary.peak_rss_mb > 0
    assert not nbmon_threads()


def test_one_bad_method_leaves_the_others_intact():
    profiler = MalformedProfiler(42.0, {"wrong_key": 1.0}, {"gpu_clock_mhz": 1200.0}, None)
    with ResourceMonitor(sample_interval_sec=0.01, gpu_profiler=profiler) as mon:
        wait_until(lambda: len(mon.samples) >= 3, timeout=20.0, what="3 samples")
    for s in mon.samples:
        assert (s.gpu_util, s.gpu_mem_mb, s.gpu_clock_mhz, s.gpu_power_w) == (42.0, None, 1200.0, None)
    assert mon.summary.mean_gpu_util == 42.0 and mon.summary.peak_gpu_mem_mb is None


def test_profiler_missing_methods_is_a_type_error_naming_them():
    class Partial:
        def get_utilization(self):
            return 1.0

        get_clock_info = "not callable"

    p = Partial()
    with pytest.raises(TypeError) as err:
        ResourceMonitor(gpu_profiler=p)
    assert str(err.value) == (f"gpu_profiler {p!r} does not satisfy GPUProfilerProtocol: "
                              f"missing get_memory_usage, get_clock_info, get_power_info")
    assert not nbmon_threads()


@pytest.mark.parametrize("value, message", [
    (0, "sample_interval_sec must be a positive number of seconds, got 0"),
    (-0.5, "sample_interval_sec must be a positive number of seconds, got -0.5"),
    (math.nan, "sample_interval_sec must be a positive number of seconds, got nan"),
    (math.inf, "sample_interval_sec must be a positive number of seconds, got inf"),
    ("fast", "sample_interval_sec must be a number of seconds, got 'fast'"),
    (None, "sample_interval_sec must be a number of seconds, got None"),
])
def test_bad_interval_is_a_value_error_naming_it(value, message):
    with pytest.raises(ValueError) as err:
        ResourceMonitor(sample_interval_sec=value)
    assert str(err.value) == message
    assert not nbmon_threads()
