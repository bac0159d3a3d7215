"""calibrax's ResourceMonitor as its users' code sees it: the GPU fields
without a profiler, the summary's keys, the sampling thread, calibrax's
attribute names, and means that never pass peaks. (to_dict/from_dict:
test_summary.py.)"""
from __future__ import annotations

import os

import pytest

from helpers import nbmon_threads, wait_until
from nbmon import NVMLProfiler, ResourceMonitor
from nbmon.sampling.store import Store
from nbmon.report.summary import summarize

GIB = 1 << 30
MIB = 1 << 20
CALIBRAX_KEYS = ["peak_rss_mb", "mean_rss_mb", "peak_gpu_mem_mb", "mean_gpu_util", "memory_growth_mb",
                 "num_samples", "duration_sec", "mean_gpu_clock_mhz", "mean_gpu_power_w"]


# -- ResourceMonitor -------------------------------------------------------------------


def test_gpu_fields_are_none_without_a_profiler_even_with_a_gpu(fake_gpu):
    fake_gpu.set(devices=[dict(util_gpu=37, mem_total=80 * GIB, mem_used=1536 * MIB,
                               power_mw=123_456, sm_clock=1980)])
    with ResourceMonitor(sample_interval_sec=0.02) as mon:
        wait_until(lambda: len(mon.samples) >= 2, timeout=20.0, what="2 samples")
    for s in mon.samples:
        assert (s.gpu_util, s.gpu_mem_mb, s.gpu_clock_mhz, s.gpu_power_w) == (None,) * 4
    summary = mon.summary
    assert (summary.peak_gpu_mem_mb, summary.mean_gpu_util) == (None, None)
    assert (summary.mean_gpu_clock_mhz, summary.mean_gpu_power_w) == (None, None)
    assert not any(c.startswith("gpu") for c in mon.monitor.fields)  # NVML not read at all

    # Reading the GPU is one argument away.
    with ResourceMonitor(sample_interval_sec=0.02, gpu_profiler=NVMLProfiler()) as mon:
        wait_until(lambda: len(mon.samples) >= 2, timeout=20.0, what="2 samples")
    summary = mon.summary
    assert (summary.mean_gpu_util, summary.peak_gpu_mem_mb) == (37.0, 1536.0)
    assert (summary.mean_gpu_clock_mhz, summary.mean_gpu_power_w) == (1980.0, pytest.approx(123.456))


def test_summary_has_calibraxs_fields_only():
    with ResourceMonitor(sample_interval_sec=0.02) as mon:
        wait_until(lambda: len(mon.samples) >= 2, timeout=20.0, what="2 samples")
    assert list(mon.summary.to_dict()) == CALIBRAX_KEYS[:7]
    full = mon.monitor.summary()  # nbmon's own summary of the same run
    assert full.peak_rss_exact is not None and full.mean_cpu_percent is not None
    assert full.peak_rss_mb == mon.summary.peak_rss_mb


def test_sampling_thread_is_a_read_only_view():
    mon = ResourceMonitor(sample_interval_sec=0.05)
    assert mon._sampling_thread._thread is None  # before the first run
    with mon:
        thread = mon._sampling_thread._thread
        assert thread.is_alive() and thread.daemon is True and thread.name == "nbmon-sampler"
        with pytest.raises(AttributeError):
            thread.daemon = False
    assert not mon._sampling_thread._thread.is_alive()  # the last run's, stopped
    thread.join(1.0)  # joining a stopped thread returns at once
    with mon:  # a second run has a thread of its own
        assert mon._sampling_thread._thread.is_alive() and not thread.is_alive()
    assert not nbmon_threads()


def test_calibraxs_attribute_names():
    mon = ResourceMonitor(sample_interval_sec=0.05)
    assert mon._interval == 0.05 and mon._gpu_profiler is None
    assert mon._process.pid == os.getpid()
    assert mon._samples == []
    with mon:
        wait_until(lambda: len(mon._samples) >= 1, timeout=20.0, what="a sample")
    assert [s.timestamp for s in mon._samples] == [s.timestamp for s in mon.samples]


# -- means stay within their window's range -----------------------------------------------


@pytest.mark.parametrize("rss_mb, t_open, steps", [
    (12.3, 100.0, [0.1] * 3),
    (73.18359375, 1000.0, [0.05, 0.07, 0.11]),
    (100.1, 0.0, [0.3, 0.1, 0.7]),
])
def test_a_constant_rss_has_mean_equal_to_peak(rss_mb, t_open, steps):
    # Time-weighted sums of a constant can round an ulp above it.
    store = Store(["proc_rss_mb"])
    window = store.open_window(t_open)
    t = t_open
    for step in steps:
        t += step
        store.append(t, t, [rss_mb])
    summary = summarize(window.stats())
    assert summary.mean_rss_mb == summary.peak_rss_mb == rss_mb
