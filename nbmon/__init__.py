"""nbmon: what a Jupyter kernel (or any command) costs in CPU, memory and GPU,
live and per cell. ``%load_ext nbmon``, then ``%resmon`` or ``%%resmon``.

Everything is imported on first use, so ``import nbmon`` stays cheap: no
IPython, plotly, pandas or pynvml until a feature needs them.
"""
from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.0"

_LAZY = {
    "Monitor": "monitor",
    "Options": "options",
    "Consumer": "consumers",
    "SampleForwarder": "consumers",
    "Metric": "catalog",
    "METRICS": "catalog",
    "ResourceMonitor": "compat.calibrax",
    "ResourceSample": "summary",
    "ResourceSummary": "summary",
    "GPUProfilerProtocol": "compat.calibrax",
    "SystemMonitor": "compat.scaffold",
    "AbstractBackendSender": "compat.scaffold",
    "GPUHandle": "compat.scaffold",
    "SamplerDict": "compat.scaffold",
    "StatsDict": "compat.scaffold",
    "CSVSender": "senders",
    "JSONLinesSender": "senders",
    "CallbackSender": "senders",
    "NVMLProfiler": "sources.nvml",
    "history": "notebook.session",
    "samples": "notebook.session",
    "last_summary": "notebook.session",
    "read_ranks": "ranks",
}

__all__ = sorted([*_LAZY, "monitor"]) + ["load_ipython_extension", "unload_ipython_extension"]


class _EngineModule(types.ModuleType):
    """``nbmon.monitor`` is two things under one name: the engine's module
    (``nbmon.monitor.Monitor``) and, called, the notebook's monitor
    (:func:`nbmon.notebook.session.monitor`: ``nbmon.monitor(consumers=[...])``).
    Were it a plain attribute, whichever was bound last would win, and which
    one that is would depend on what had been imported before."""

    def __call__(self, *args, **kwargs):
        from .notebook.session import monitor

        return monitor(*args, **kwargs)


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # The import system binds the submodule here as it is first imported.
        if name == "monitor" and type(value) is types.ModuleType:
            value.__class__ = _EngineModule
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name == "monitor":
        return importlib.import_module(".monitor", __name__)
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
    from .notebook.magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext nbmon``: stops monitoring and removes the hooks."""
    from .notebook.magics import unload

    unload(ipython)
