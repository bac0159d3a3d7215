"""Where the figures come from: the watched process tree, the machine, its
container (cgroup) and GPUs. Every source is a :class:`Source`.
:class:`Sources` is the one place a run's sources are made, for the sampler
thread and the helper process alike.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from .. import catalog
from ..options import Options
from .cgroup import Cgroup
from .machine import Machine
from .gpus import GPUs
from .tree import ProcessTree


@runtime_checkable
class Source(Protocol):
    """What the sampler reads. ``fields`` are catalog names (or an extra
    source's own), fixed once ``start(now)`` returned; ``sample(now)`` gives
    a float for each (NaN where unknown) and may raise (its fields are then
    NaN and the failure a fault). Optional: ``caller_safe = True`` (it
    cannot get stuck: it may be read from the caller's thread, for a run's
    baseline), ``boundary()`` (make the next sample a full one: a span
    starts or ends there) and ``drain_faults() -> list[str]`` (what failed
    in part, in words, since the last call)."""

    name: str
    fields: tuple[str, ...]

    def start(self, now: float) -> None: ...

    def sample(self, now: float) -> dict[str, float]: ...

    def close(self) -> None: ...


class Sources:
    """The built-in sources of one run, in sampling order."""

    def __init__(self, pid: int, options: Options):
        self.tree = ProcessTree(pid, children=options.children, exact_peaks=options.exact_peaks,
                                adopt=options.adopt)
        self.gpus = GPUs(tree_pids=lambda: self.tree.pids) if options.gpu else None
        self.all = [self.tree]
        if options.system:
            self.all += [Machine(), Cgroup(pid)]
        if self.gpus is not None:
            self.all.append(self.gpus)
        # A third party's metrics: each plugin's source reads its own (catalog.METRICS_GROUP).
        self.all += [plugin.source(pid, options) for plugin in catalog.plugins(catalog.METRICS_GROUP)]

    def info(self) -> dict:
        """What the run could measure, once started: how peaks are read
        ("reset", "high-water marks", "sampled"), GPU state."""
        return {"peaks": self.tree.peaks,
                "gpu_state": self.gpus.state if self.gpus else "off (gpu=False)",
                "gpu_devices": self.gpus.count if self.gpus else 0}

