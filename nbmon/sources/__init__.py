"""Where the figures come from: the watched process tree, the machine, and
NVIDIA GPUs. A source has ``name``, ``fields`` (catalog names, fixed by
``start(now)``), ``sample(now)`` returning ``{name: float}`` (NaN where
unknown), ``close()``, and optionally ``boundary()`` (make the next sample
a full one). :class:`Sources` is the one place a run's sources are
made, for the sampler thread and the helper process alike.
"""
from __future__ import annotations

from ..options import Options
from .cgroup import Cgroup
from .machine import Machine
from .nvml import GPUs
from .proctree import ProcessTree


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

    def info(self) -> dict:
        """What the run could measure, once started: how peaks are read
        ("reset", "high-water marks", "sampled"), GPU state."""
        return {"peaks": self.tree.peaks,
                "gpu_state": self.gpus.state if self.gpus else "off (gpu=False)",
                "gpu_devices": self.gpus.count if self.gpus else 0}

