"""scaffold's ``scaffold.system_monitor`` API on nbmon's engine.

``SystemMonitor(pid, backend_sender, sample_rate_seconds=2, rank=None)``
behaves as scaffold's: ``gpu_count`` and ``network_init`` are set on
construction; ``start()`` publishes a StatsDict at once, then one every
``sample_rate_seconds``; ``flush()`` publishes the latest one again;
``shutdown()`` publishes once more and stops. Keys, types and meanings are
scaffold's (the WandB client's names): ``proc.*`` is the pid alone,
``network`` is ``{"sent": int, "recv": int}`` bytes since construction (every
interface, as psutil counts them), a GPU's keys come in scaffold's two
groups or not at all, and a key once published keeps its last value in
``sampler``.

Underneath, nbmon samples faster than it publishes (at most every 0.5 s),
so each figure is the time-weighted mean over its period (the last value
for threads and disk). A sender that raises or blocks never stops sampling
nor delays ``shutdown()``. Opt-in, ``tree=True`` also publishes the pid's
whole process tree under ``proc.tree.*`` keys.
"""
from __future__ import annotations

import abc
import time
from typing import Any, Dict, List, Optional, Union

import psutil

from .. import catalog
from ..engine import Monitor
from ..options import check_interval, check_pid
from ..sources import gpus
from ..sources.tree import ProcessTree
from ..values import NAN
from .calibrax import ThreadView

__all__ = ["AbstractBackendSender", "GPUHandle", "SamplerDict", "StatsDict", "SystemMonitor"]

GPUHandle = Any  # an NVML device handle (pynvml's c_nvmlDevice_t)
SamplerDict = Dict[str, List[float]]
StatsDict = Dict[str, Union[float, Dict[str, Any]]]

MAX_SAMPLE_INTERVAL_S = 0.5
TREE_PREFIX = "tree_"  # store columns of the whole tree (tree=True) beside the pid's own
# scaffold's keys, in its order. A GPU's come in scaffold's two groups (two
# NVML reads), each left out whole when one of its figures is unknown.
_GPU_GROUPS = (("gpu.{i}.gpu", "gpu.{i}.memory", "gpu.{i}.memoryAllocated", "gpu.{i}.temp"),
               ("gpu.{i}.powerWatts", "gpu.{i}.powerPercent"))
_KEYS = ("cpu", "memory", "network", "disk", "proc.memory.availableMB", "proc.memory.rssMB",
         "proc.memory.percent", "proc.cpu.threads")
_PROC_KEYS = ("proc.memory.rssMB", "proc.memory.percent", "proc.cpu.threads")  # again under proc.tree.*
# scaffold's percentages: key -> (catalog metric averaged, catalog metric it is a share of).
_PERCENTS = {"proc.memory.percent": ("proc_rss_mb", "sys_mem_total_mb"),
             "gpu.{i}.memoryAllocated": ("mem_used_mb", "mem_total_mb"),
             "gpu.{i}.powerPercent": ("power_w", "power_limit_w")}
# Published as ints, as scaffold does (NVML and psutil give ints for these).
_WHOLE = frozenset({"proc.cpu.threads", "gpu.{i}.gpu", "gpu.{i}.memory", "gpu.{i}.temp"})
# The tables above are scaffold's contract (its keys, order, types); the
# figures are the catalog's ``wandb`` metrics, and one scaffold does not
# have (a plugin's, say) follows its keys.
_SCAFFOLDS = frozenset(_KEYS) | {key for group in _GPU_GROUPS for key in group}


class AbstractBackendSender(abc.ABC):
    """Abstract interface that works in conjunction with the system monitor.
    Should be used to configure where the system metrics are being sent to."""

    @abc.abstractmethod
    def publish(self, event: StatsDict, **kwargs) -> None:
        """Implements sending event to the corresponding backend."""


def _figures(stats, column) -> dict[str, float]:
    """scaffold's key -> its figure over the period (NaN if unknown);
    ``column(metric)`` is the store column of a catalog metric."""
    out = {m.wandb[0]: stats.value(m.wandb[1], column(m)) for m in catalog.METRICS if m.wandb}
    for key, (part, whole) in _PERCENTS.items():
        total = stats.value("last", column(catalog.BY_NAME[whole]))
        out[key] = stats.value("mean", column(catalog.BY_NAME[part])) / total * 100.0 if total > 0 else NAN
    return out


def _stats_dict(stats, gpu_count: int, tree: bool, network: dict | None) -> StatsDict:
    """One period's StatsDict, without the rank prefix; what is unknown is left out."""
    out: StatsDict = {}

    def put(key: str, template: str, value: float) -> None:
        if value == value:
            out[key] = int(round(value)) if template in _WHOLE else float(value)

    for i in range(gpu_count):
        device = _figures(stats, lambda m, i=i: catalog.device_column(i, m.name) if m.source == catalog.DEVICE else m.name)
        for group in _GPU_GROUPS:
            if all(device[key] == device[key] for key in group):
                for key in group:
                    put(key.format(i=i), key, device[key])
        for key in [k for k in device if k not in _SCAFFOLDS and "{i}" in k]:
            put(key.format(i=i), key, device[key])
    own = _figures(stats, lambda m: m.name)
    for key in _KEYS:
        if key != "network":
            put(key, key, own[key])
        elif network is not None:
            out[key] = network
    for key in [k for k in own if k not in _SCAFFOLDS and "{i}" not in k]:
        put(key, key, own[key])
    if tree:
        whole = _figures(stats, lambda m: TREE_PREFIX + m.name if m.source == catalog.TREE else m.name)
        for key in _PROC_KEYS:
            put("proc.tree." + key[len("proc."):], key, whole[key])
    return out


def _network_bytes() -> dict[str, int] | None:
    counters = psutil.net_io_counters()  # every interface, loopback included, as scaffold counts
    return None if counters is None else {"sent": counters.bytes_sent, "recv": counters.bytes_recv}


class _WholeTree(ProcessTree):
    """The pid's whole process tree, under ``tree_<metric>`` columns beside
    the pid's own figures."""

    name = "whole process tree"

    def __init__(self, pid: int):
        super().__init__(pid, children=True)
        self.fields = tuple(TREE_PREFIX + f for f in self.fields)

    def sample(self, now: float) -> dict[str, float]:
        return {TREE_PREFIX + k: v for k, v in super().sample(now).items()}


class _Publisher:
    """The monitor's consumer that publishes: as the run starts, every
    ``sample_rate_seconds``, and once as it ends."""

    name = "backend_sender"
    at_start = True

    def __init__(self, owner: "SystemMonitor"):
        self.owner = owner
        self.every_s = owner.sample_rate_seconds

    def consume(self, store, final: bool) -> None:
        self.owner._publish_period(store)

    def close(self) -> None:
        pass


class SystemMonitor:
    """Initializes the SystemMonitor using the parent thread's PID and a
    backend_sender that implements the logic to send the collected stats to
    the corresponding backend, e.g. CSV, Tensorboard, WandB.

    nbmon's addition, keyword-only: ``tree=True`` publishes the pid's whole
    process tree too, as ``proc.tree.memory.rssMB``,
    ``proc.tree.memory.percent`` and ``proc.tree.cpu.threads``.
    """

    def __init__(self, pid: int, backend_sender: AbstractBackendSender,
                 sample_rate_seconds: int = 2, rank: Optional[int] = None, *, tree: bool = False):
        pid = check_pid(pid)
        if not callable(getattr(backend_sender, "publish", None)):
            raise TypeError(f"backend_sender {backend_sender!r} has no publish(event) method")
        rate = check_interval(sample_rate_seconds, "sample_rate_seconds")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"rank must be a non-negative whole number or None, got {rank!r}")
        if not isinstance(tree, bool):
            raise ValueError(f"tree must be True or False, got {tree!r}")
        # scaffold's attribute names.
        self._pid = pid
        self._backend_sender = backend_sender
        self._sample_rate_seconds = rate
        self._rank_prefix = f"rank{rank}." if rank is not None else ""
        self.sampler: StatsDict = {}
        self.gpu_count: int = gpus.device_count()
        self.network_init: Dict | None = _network_bytes()
        self.rank = rank
        self.tree = tree
        self.published = 0
        self._window = None  # the period being gathered
        # children=False: proc.* is the pid alone.
        self._monitor = Monitor(pid, interval=min(MAX_SAMPLE_INTERVAL_S, rate), children=False,
                                consumers=[_Publisher(self)],
                                extra_sources=[_WholeTree(pid)] if tree else ())

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def backend_sender(self) -> AbstractBackendSender:
        return self._backend_sender

    @property
    def sample_rate_seconds(self) -> float:
        return self._sample_rate_seconds

    @property
    def proc(self) -> psutil.Process:
        """Returns the process corresponding to the parent's PID."""
        return psutil.Process(pid=self._pid)

    @property
    def monitor(self) -> Monitor:
        """The nbmon engine underneath."""
        return self._monitor

    @property
    def _thread(self) -> ThreadView | None:
        """scaffold's: the sampling thread while the monitor runs, else None."""
        thread = self._monitor.thread
        return ThreadView(thread) if thread is not None and self._monitor.running else None

    def start(self) -> None:
        """Starts the monitor by launching a separate thread; the first
        StatsDict is published at once."""
        self._monitor.start()

    def flush(self) -> None:
        """Publishes the latest StatsDict (``sampler``) again, as scaffold
        does; nothing before anything was gathered."""
        if self.sampler:
            self._publish()

    def shutdown(self) -> None:
        """Publishes once more and closes the SystemMonitor's thread
        (bounded, even with a stuck sender)."""
        running = self._monitor.running
        self._monitor.stop()  # a running monitor's last period is published by its final call
        if not running:
            self.flush()

    def _publish_period(self, store) -> None:
        window = self._window
        if window is None or window.store is not store:  # the run's first call, as it starts
            window = store.open_window(store.t_start)
            self._monitor.sample_now()
        stats, self._window = store.roll_window(window, time.monotonic())
        now, init = _network_bytes(), self.network_init
        network = None if now is None or init is None else {k: now[k] - init[k] for k in init}
        figures = _stats_dict(stats, self.gpu_count, self.tree, network)
        # Replaced, not updated in place: flush() may copy it from another thread.
        self.sampler = {**self.sampler, **{self._rank_prefix + k: v for k, v in figures.items()}}
        self._publish()

    def _publish(self) -> None:
        self._backend_sender.publish(dict(self.sampler))
        self.published += 1
