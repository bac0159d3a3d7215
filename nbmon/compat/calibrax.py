"""calibrax's ``calibrax.profiling.resources`` API on nbmon's engine.

Code written for calibrax runs unchanged::

    with ResourceMonitor() as mon:
        run_benchmark()
    summary = mon.summary

Underneath: the whole process tree is measured, the peak RSS is the
kernel's exact high-water mark, the thread never dies of a failing GPU
profiler, and stopping is bounded and cannot leave an old loop running.
As in calibrax, the GPU fields are None without a ``gpu_profiler``;
``gpu_profiler=nbmon.NVMLProfiler()`` reads an NVIDIA GPU through NVML.
``summary`` has calibrax's fields only (the others None, so ``to_dict()``
writes calibrax's keys); ``monitor.summary()`` has all of nbmon's.
"""
from __future__ import annotations

import dataclasses
import numbers
import threading
import time
from typing import Protocol, runtime_checkable

import psutil

from ..engine import Monitor
from ..options import check_interval
from ..report.summary import ResourceSample, ResourceSummary
from ..sources.gpus import nvml
from ..values import NAN, known, reading

__all__ = ["GPUProfilerProtocol", "ResourceMonitor", "ResourceSample", "ResourceSummary"]

# ResourceSummary's first nine fields are calibrax's; the rest are nbmon's.
_NBMON_FIELDS = tuple(f.name for f in dataclasses.fields(ResourceSummary))[9:]


@runtime_checkable
class GPUProfilerProtocol(Protocol):
    """Protocol for GPU profilers providing utilization and memory data."""

    def get_utilization(self) -> float:
        """Current GPU utilization as a percentage (0-100)."""
        ...

    def get_memory_usage(self) -> dict[str, float]:
        """Memory statistics with at least a 'gpu_memory_used_mb' key."""
        ...

    def get_clock_info(self) -> dict[str, float]:
        """Clock frequencies: 'gpu_clock_mhz' and 'mem_clock_mhz'."""
        ...

    def get_power_info(self) -> dict[str, float]:
        """Power: 'power_draw_w' and 'power_limit_w'."""
        ...


class ProfilerSource:
    """Adapts a GPUProfilerProtocol object to a sampler source.

    Each of the four calls is guarded on its own: one that raises or answers
    garbage gives NaN for its field and is counted in ``errors``.
    """

    name = "gpu_profiler"
    caller_safe = True  # asked for the run's baseline too, as calibrax users expect every sample filled
    fields = ("gpu_util_percent", "gpu_mem_used_mb", "gpu_sm_clock_mhz", "gpu_power_w")

    def __init__(self, profiler: GPUProfilerProtocol):
        self.profiler = profiler
        self.errors = 0

    def start(self, now: float) -> None:
        pass

    def _ask(self, method: str, key: str | None) -> float:
        try:
            payload = getattr(self.profiler, method)()
            value = payload if key is None else payload[key]
        except Exception:  # the user's profiler: anything may go wrong
            self.errors += 1
            return NAN
        number = reading(value)
        if number != number:
            self.errors += 1
        return number

    def sample(self, now: float) -> dict[str, float]:
        return {"gpu_util_percent": self._ask("get_utilization", None),
                "gpu_mem_used_mb": self._ask("get_memory_usage", "gpu_memory_used_mb"),
                "gpu_sm_clock_mhz": self._ask("get_clock_info", "gpu_clock_mhz"),
                "gpu_power_w": self._ask("get_power_info", "power_draw_w")}

    def close(self) -> None:
        pass


def _check_profiler(profiler) -> None:
    missing = [m for m in ("get_utilization", "get_memory_usage", "get_clock_info", "get_power_info")
               if not callable(getattr(profiler, m, None))]
    if missing:
        raise TypeError(f"gpu_profiler {profiler!r} does not satisfy GPUProfilerProtocol: "
                        f"missing {', '.join(missing)}")


class ThreadView:
    """A read-only view of a sampling thread, for code that checks the seed
    APIs' ``_thread`` attribute: is it a daemon, is it alive, join it."""

    __slots__ = ("_target",)

    def __init__(self, thread: threading.Thread):
        self._target = thread

    @property
    def name(self) -> str:
        return self._target.name

    @property
    def daemon(self) -> bool:
        return self._target.daemon

    def is_alive(self) -> bool:
        return self._target.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._target.join(timeout)

    def __repr__(self) -> str:
        return f"<ThreadView of {self._target!r}>"


class _SamplingThread:
    """calibrax's ``SamplingThread`` as code reads it: ``_thread`` is None
    before the first run, then a view of the (current or last) run's thread."""

    def __init__(self, monitor: Monitor):
        self._monitor = monitor

    @property
    def _thread(self) -> ThreadView | None:
        thread = self._monitor.thread
        return None if thread is None else ThreadView(thread)


class ResourceMonitor:
    """Background 10Hz resource sampling via context manager.

    ``sample_interval_sec`` seconds between samples (default 0.1 = 10 Hz);
    ``gpu_profiler`` an optional GPUProfilerProtocol object.
    """

    def __init__(self, sample_interval_sec: float = 0.1, gpu_profiler: GPUProfilerProtocol | None = None):
        interval = check_interval(sample_interval_sec, "sample_interval_sec")
        if gpu_profiler is not None:
            _check_profiler(gpu_profiler)
        # calibrax's attribute names.
        self._interval = interval
        self._gpu_profiler = gpu_profiler
        self._process = psutil.Process()
        extra = [ProfilerSource(gpu_profiler)] if gpu_profiler is not None else []
        # perf_counter is calibrax's timestamp clock.
        self._monitor = Monitor(interval=interval, gpu=False, extra_sources=extra, clock=time.perf_counter)
        self._sampling_thread = _SamplingThread(self._monitor)

    @property
    def sample_interval_sec(self) -> float:
        return self._interval

    @property
    def gpu_profiler(self) -> GPUProfilerProtocol | None:
        return self._gpu_profiler

    @property
    def monitor(self) -> Monitor:
        """The nbmon engine underneath (all columns, faults, store)."""
        return self._monitor

    def __enter__(self) -> "ResourceMonitor":
        """Start background sampling thread."""
        self._monitor.start()
        return self

    def __exit__(self, *args) -> None:
        """Stop background sampling thread."""
        self._monitor.stop()

    @property
    def samples(self) -> list[ResourceSample]:
        """Return a copy of all collected samples."""
        store = self._monitor.store
        if store is None:
            return []
        wanted = ("proc_cpu_percent", "proc_rss_mb", "gpu_util_percent", "gpu_mem_used_mb",
                  "gpu_sm_clock_mhz", "gpu_power_w")
        t, _, cols = store.series([c for c in wanted if c in store.columns])
        nan = [NAN] * len(t)
        get = {c: cols[c].tolist() if c in cols else nan for c in wanted}
        # The first sample is the baseline taken at start, with no interval to
        # measure CPU over: 0.0, as calibrax's first psutil.cpu_percent() gives.
        get["proc_cpu_percent"] = [0.0 if cpu != cpu else cpu for cpu in get["proc_cpu_percent"]]
        return [ResourceSample(timestamp=ts, cpu_percent=cpu, rss_mb=rss, gpu_util=known(gu),
                               gpu_mem_mb=known(gm), gpu_clock_mhz=known(gc),
                               gpu_power_w=known(gp))
                for ts, cpu, rss, gu, gm, gc, gp in zip(t.tolist(), *get.values())]

    _samples = samples  # calibrax's name for the same list

    @property
    def summary(self) -> ResourceSummary:
        """Compute aggregated summary from collected samples (zeroed if none)."""
        return dataclasses.replace(self._monitor.summary(), **dict.fromkeys(_NBMON_FIELDS))


class NVMLProfiler:
    """calibrax's GPUProfilerProtocol over NVML for one device.

    Each method answers for ``device_index``; a field NVML cannot give is
    NaN. Raises RuntimeError at construction when NVML has no such device.
    """

    def __init__(self, device_index: int = 0):
        # A bool or str would pass (or break) the range check below with an unclear error.
        # numbers.Integral: a numpy integer (np.arange, an array element) is a whole number too.
        if isinstance(device_index, bool) or not isinstance(device_index, numbers.Integral):
            raise ValueError(f"device_index must be a whole number, got {device_index!r}")
        device_index = int(device_index)
        count = nvml.device_count()
        if not count:
            raise RuntimeError(f"no NVIDIA GPU is usable: {nvml.status()}")
        if not 0 <= device_index < count:
            raise ValueError(f"device_index {device_index!r} is out of range: NVML sees {count} device(s)")
        try:
            self._device = nvml.device(device_index)
        except OSError as err:
            raise RuntimeError(f"NVIDIA GPU {device_index} cannot be read: {err}") from None

    def _get(self, query: str, metric: str) -> float:
        return self._device.query(query).get(metric, NAN)

    def get_utilization(self) -> float:
        return self._get("utilization", "util_percent")

    def get_memory_usage(self) -> dict[str, float]:
        memory = self._device.query("memory")
        return {"gpu_memory_used_mb": memory.get("mem_used_mb", NAN),
                "gpu_memory_total_mb": memory.get("mem_total_mb", NAN)}

    def get_clock_info(self) -> dict[str, float]:
        return {"gpu_clock_mhz": self._get("sm_clock", "sm_clock_mhz"),
                "mem_clock_mhz": self._get("mem_clock", "mem_clock_mhz")}

    def get_power_info(self) -> dict[str, float]:
        return {"power_draw_w": self._get("power", "power_w"),
                "power_limit_w": self._get("power_limit", "power_limit_w")}
