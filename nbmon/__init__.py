"""nbmon: what a Jupyter kernel (or any command) costs in CPU, memory and GPU,
live and per cell. ``%load_ext nbmon``, then ``%resmon`` or ``%%resmon``.

Everything is imported on first use, so ``import nbmon`` stays cheap: no
IPython, plotly, pandas or pynvml until a feature needs them.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "Monitor": "engine",
    "StartError": "launch",
    "Options": "options",
    "Consumer": "sinks.consumers",
    "SampleForwarder": "sinks.consumers",
    "Metric": "catalog",
    "METRICS": "catalog",
    "ResourceMonitor": "compat.calibrax",
    "ResourceSample": "report.summary",
    "ResourceSummary": "report.summary",
    "GPUProfilerProtocol": "compat.calibrax",
    "SystemMonitor": "compat.scaffold",
    "AbstractBackendSender": "compat.scaffold",
    "GPUHandle": "compat.scaffold",
    "SamplerDict": "compat.scaffold",
    "StatsDict": "compat.scaffold",
    "CSVSender": "sinks.senders",
    "JSONLinesSender": "sinks.senders",
    "CallbackSender": "sinks.senders",
    "open_sink": "sinks.senders",
    "NVMLProfiler": "compat.calibrax",
    "monitor": "kernel.session",
    "history": "kernel.session",
    "samples": "kernel.session",
    "last_summary": "kernel.session",
    "MemoryGuardError": "kernel.guard",
    "read_ranks": "cli.ranks",
    "last_death": "postmortem.deaths",
    "kernels": "overview",
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


def _lacking() -> str:
    """What this interpreter lacks of what nbmon needs ("" when nothing):
    threads, and its processes' figures from Linux's /proc or psutil.
    Pyodide (JupyterLite) has neither."""
    import os
    import sys

    lacks = []
    if sys.platform in ("emscripten", "wasi"):   # CPython built there starts no threads
        lacks.append("threads")
    if not (sys.platform.startswith("linux") and os.path.exists(f"/proc/{os.getpid()}/stat")):
        try:
            import psutil  # noqa: F401
        except ImportError:
            lacks.append("/proc or psutil")
    return " and ".join(lacks)


def load_ipython_extension(ipython) -> None:
    """``%load_ext nbmon``: registers ``%resmon`` / ``%%resmon``; in a
    kernel without what nbmon needs, one line says so."""
    lacking = _lacking()
    if lacking:
        import sys

        line = (f"nbmon is not available in this kernel ({sys.platform}, no {lacking}): it needs threads "
                "and its processes' figures from Linux's /proc or psutil (JupyterLite's Pyodide has neither)")

        def resmon(_line, cell=None):
            # A notebook written with nbmon still runs here: the line again, and the cell itself.
            print(line, file=sys.stderr, flush=True)
            if cell is not None:
                ipython.run_cell(cell)

        ipython.register_magic_function(resmon, "line_cell", "resmon")
        print(line, file=sys.stderr, flush=True)
        return
    from .kernel.magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext nbmon``: stops monitoring and removes the hooks."""
    if _lacking():   # never loaded
        return
    from .kernel.magics import unload

    unload(ipython)
