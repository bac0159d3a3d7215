"""scaffold's ``scaffold.system_monitor`` API on nbmon's engine.

``SystemMonitor(pid, backend_sender, sample_rate_seconds=2, rank=None)``
publishes one StatsDict every ``sample_rate_seconds`` (and on ``flush()``)
with the WandB client's system-metric names. Underneath, nbmon samples
faster than it publishes (at most every 0.5 s), so each published value is
the exact time-weighted mean over its period, and the process figures cover
the pid's whole process tree. A sender that raises or blocks never stops
sampling nor delays ``shutdown()``.
"""
from __future__ import annotations

import abc
import threading
import time
from typing import Any, Dict, List, Optional, Union

import psutil

from .. import catalog
from ..monitor import Monitor
from ..options import check_interval, check_pid

__all__ = ["AbstractBackendSender", "GPUHandle", "SamplerDict", "StatsDict", "SystemMonitor"]

GPUHandle = Any  # an NVML device handle (pynvml's c_nvmlDevice_t)
SamplerDict = Dict[str, List[float]]
StatsDict = Dict[str, Union[float, Dict[str, Any]]]


class AbstractBackendSender(abc.ABC):
    """Abstract interface that works in conjunction with the system monitor.
    Should be used to configure where the system metrics are being sent to."""

    @abc.abstractmethod
    def publish(self, event: StatsDict, **kwargs) -> None:
        """Implements sending event to the corresponding backend."""


def _stats_dict(stats, network_init: dict | None, gpu_count: int) -> StatsDict:
    out: StatsDict = {}

    def put(key, value):
        if value == value:  # leave out what is unknown rather than publish NaN
            out[key] = value

    for metric in catalog.METRICS:
        if metric.wandb and metric.source != catalog.DEVICE:
            key, stat = metric.wandb
            put(key, stats.value(stat, metric.name))
    rss, total = stats.value("mean", "proc_rss_mb"), stats.value("mean", "sys_mem_total_mb")
    put("proc.memory.percent", rss / total * 100.0 if total else float("nan"))
    if network_init:
        put("network.sent", stats.value("last", "sys_net_sent_bytes") - network_init["sent"])
        put("network.recv", stats.value("last", "sys_net_recv_bytes") - network_init["recv"])
    for i in range(gpu_count):
        def device(stat: str, name: str) -> float:
            return stats.value(stat, catalog.device_column(i, name))

        for metric in catalog.METRICS:
            if metric.wandb and metric.source == catalog.DEVICE:
                key, stat = metric.wandb
                put(key.format(i=i), device(stat, metric.name))
        used, mem_total = device("mean", "mem_used_mb"), device("last", "mem_total_mb")
        put(f"gpu.{i}.memoryAllocated", used / mem_total * 100.0 if mem_total else float("nan"))
        power, limit = device("mean", "power_w"), device("last", "power_limit_w")
        put(f"gpu.{i}.powerPercent", power / limit * 100.0 if limit else float("nan"))
    return out


class _Publisher:
    def __init__(self, owner: "SystemMonitor"):
        self.owner = owner
        self.every_s = owner.sample_rate_seconds
        self.window = None
        self.lock = threading.Lock()  # flush() from the user's thread vs the sender thread

    def consume(self, store, final: bool) -> None:
        self.owner._publish_period()

    def close(self) -> None:
        pass


class SystemMonitor:
    """Initializes the SystemMonitor using the parent thread's PID and a
    backend_sender that implements the logic to send the collected stats to
    the corresponding backend, e.g. CSV, Tensorboard, WandB."""

    def __init__(self, pid: int, backend_sender: AbstractBackendSender,
                 sample_rate_seconds: int = 2, rank: Optional[int] = None):
        self.pid = check_pid(pid)
        if not callable(getattr(backend_sender, "publish", None)):
            raise TypeError(f"backend_sender {backend_sender!r} has no publish(event) method")
        self.sample_rate_seconds = check_interval(sample_rate_seconds, "sample_rate_seconds")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"rank must be a non-negative whole number or None, got {rank!r}")
        self.backend_sender = backend_sender
        self.rank = rank
        self.sampler: StatsDict = {}
        self.network_init: Dict | None = None
        self._proc = psutil.Process(self.pid)
        self._publisher = _Publisher(self)
        self._monitor = Monitor(self.pid, interval=min(0.5, self.sample_rate_seconds),
                                consumers=[self._publisher])
        self.gpu_count: int = 0
        self.published = 0

    @property
    def proc(self) -> psutil.Process:
        """Returns the process corresponding to the parent's PID."""
        return self._proc

    @property
    def monitor(self) -> Monitor:
        """The nbmon engine underneath."""
        return self._monitor

    def start(self) -> None:
        """Starts the monitor by launching a separate thread."""
        monitor = self._monitor
        if monitor.running:
            return
        monitor.start()
        self.gpu_count = monitor.gpu_count
        self.network_init = None  # the first sample's counters, taken at the first publish
        with self._publisher.lock:
            self._publisher.window = monitor.store.open_window(time.monotonic())

    def flush(self) -> None:
        """Publishes the metrics gathered since the last publish."""
        self._publish_period()

    def _publish_period(self) -> None:
        publisher = self._publisher
        with publisher.lock:
            window = publisher.window
            if window is None:
                return
            stats, publisher.window = window.store.roll_window(window, time.monotonic())
            if stats.count == 0:
                return
            if self.network_init is None:
                self.network_init = {"sent": stats.value("first", "sys_net_sent_bytes"),
                                     "recv": stats.value("first", "sys_net_recv_bytes")}
            stats_dict = _stats_dict(stats, self.network_init, self.gpu_count)
            if self.rank is not None:
                stats_dict = {f"rank{self.rank}.{k}": v for k, v in stats_dict.items()}
            self.sampler = stats_dict
        self.backend_sender.publish(stats_dict)
        self.published += 1

    def shutdown(self) -> None:
        """Closes the SystemMonitor's thread (bounded, even with a stuck sender)."""
        self._monitor.stop()
