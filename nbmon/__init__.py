"""nbmon: what a Jupyter kernel (or any command) costs in CPU, memory and GPU,
live and per cell. ``%load_ext nbmon``, then ``%resmon`` or ``%%resmon``.

Everything is imported on first use, so ``import nbmon`` stays cheap: no
IPython, plotly, pandas or pynvml until a feature needs them.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "Monitor": "monitor",
    "ResourceMonitor": "resources",
    "ResourceSample": "summary",
    "ResourceSummary": "summary",
    "GPUProfilerProtocol": "resources",
    "SystemMonitor": "system_monitor",
    "AbstractBackendSender": "system_monitor",
    "GPUHandle": "system_monitor",
    "SamplerDict": "system_monitor",
    "StatsDict": "system_monitor",
    "CSVSender": "senders",
    "JSONLinesSender": "senders",
    "CallbackSender": "senders",
    "NVMLProfiler": "nvml",
    "history": "session",
    "samples": "session",
    "last_summary": "session",
}

__all__ = sorted(_LAZY) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbmon' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython) -> None:
    """``%load_ext nbmon``: registers ``%resmon`` / ``%%resmon``."""
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext nbmon``: stops monitoring and removes the hooks."""
    from .magics import unload

    unload(ipython)
