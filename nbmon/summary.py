"""ResourceSample and ResourceSummary: calibrax's two records, kept verbatim
(fields, order, defaults) and extended with what notebook users need.

Unknown values are ``None``, never NaN, so that summaries compare equal after
a ``to_dict``/``from_dict`` round trip.
"""
from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import dataclass
from typing import Any

from .catalog import unit_of
from .format import fmt
from .values import known


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceSample:
    """Single resource measurement at a point in time.

    ``timestamp`` is ``time.perf_counter()`` seconds (on Linux and macOS the
    same clock as ``time.monotonic()``); ``rss_mb`` is the whole process
    tree's resident set in MiB; ``cpu_percent`` is the tree's CPU over the
    interval before the sample (100 = one core).
    """

    timestamp: float
    cpu_percent: float
    rss_mb: float
    gpu_util: float | None
    gpu_mem_mb: float | None
    gpu_clock_mhz: float | None = None
    gpu_power_w: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceSummary:
    """Aggregated resource usage over a monitoring period.

    The first nine fields are calibrax's. Means are time-weighted (each
    sample stands for the interval before it), which equals calibrax's plain
    mean when samples are evenly spaced and stays right when they are not.
    ``peak_rss_mb`` comes from the kernel's high-water marks when
    ``peak_rss_exact`` is True, so spikes between samples are caught: exact
    when the tree was one process (``max_processes`` 1), otherwise an upper
    bound (see nbmon.sources.proctree). ``cpu_time_sec`` is read from the
    kernel's CPU clocks, and ``mean_cpu_percent`` is it over the duration.
    ``memory_limit_mb`` and ``oom_kills`` are the container's (cgroup's):
    its memory limit, and the processes its OOM killer killed in the period.
    """

    peak_rss_mb: float
    mean_rss_mb: float
    peak_gpu_mem_mb: float | None
    mean_gpu_util: float | None
    memory_growth_mb: float
    num_samples: int
    duration_sec: float
    mean_gpu_clock_mhz: float | None = None
    mean_gpu_power_w: float | None = None
    # nbmon's additions
    mean_cpu_percent: float | None = None
    peak_cpu_percent: float | None = None
    cpu_time_sec: float | None = None
    peak_rss_exact: bool | None = None
    peak_proc_gpu_mem_mb: float | None = None
    max_processes: int | None = None
    memory_limit_mb: float | None = None
    oom_kills: int | None = None
    start_time: float | None = None
    end_time: float | None = None

    @property
    def peak_rss_kind(self) -> str:
        """How ``peak_rss_mb`` was found: 'exact', 'upper bound' (a tree's,
        from each process's high-water mark) or 'sampled' (a lower bound)."""
        if not self.peak_rss_exact:
            return "sampled"
        return "exact" if (self.max_processes or 1) <= 1 else "upper bound"

    @classmethod
    def zeroed(cls) -> "ResourceSummary":
        return cls(peak_rss_mb=0.0, mean_rss_mb=0.0, peak_gpu_mem_mb=None, mean_gpu_util=None,
                   memory_growth_mb=0.0, num_samples=0, duration_sec=0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, as calibrax writes it: ``peak_gpu_mem_mb`` and
        ``mean_gpu_util`` always (null when unknown), the other optional
        fields only when not None."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name not in _ALWAYS_WRITTEN:
                continue
            out[f.name] = _primitive(f.name, value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ResourceSummary":
        """Inverse of :meth:`to_dict`, with or without the null GPU fields.
        Unknown keys are ignored, as calibrax does (a file written by a newer
        version loads); a missing required key or a mistyped value is a
        ValueError naming it."""
        if not isinstance(data, dict):
            # Name the value itself (shortened), not only its type: "got list" does not say which.
            raise ValueError(f"ResourceSummary.from_dict needs a dict, got {reprlib.repr(data)} "
                             f"({type(data).__name__})")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ValueError(f"ResourceSummary.from_dict: missing key(s) {', '.join(map(repr, missing))}")
        # Optional fields that to_dict() left out are None (the GPU ones have no default).
        values = {k: None for k in _TYPES if k not in _REQUIRED}
        values.update((k, _checked(k, v)) for k, v in data.items() if k in _TYPES)
        return cls(**values)

    # -- for humans ------------------------------------------------------
    def rows(self) -> list[tuple[str, str]]:
        """(title, text) pairs: every figure through :func:`nbmon.format.fmt`
        in its catalog column's unit, as the live meter shows it."""
        kind = "" if self.peak_rss_exact is None else f" ({self.peak_rss_kind})"
        mib, pct = unit_of("proc_rss_mb"), unit_of("proc_cpu_percent")
        rows = [
            ("Duration", fmt(self.duration_sec, "s")),
            ("Peak RSS" + kind, fmt(self.peak_rss_mb, unit_of("proc_rss_peak_mb"))),
            ("RSS growth", fmt(self.memory_growth_mb, mib, signed=True)),
            ("Mean RSS", fmt(self.mean_rss_mb, mib)),
        ]
        if self.memory_limit_mb is not None:
            rows.append(("Memory limit (container)", fmt(self.memory_limit_mb, unit_of("cgroup_mem_limit_mb"))))
        if self.oom_kills:
            rows.append(("OOM kills (container)", fmt(self.oom_kills, unit_of("cgroup_oom_kills"))))
        if self.mean_cpu_percent is not None:
            rows.append(("CPU mean / peak", f"{fmt(self.mean_cpu_percent, pct)} / "
                                            f"{fmt(self.peak_cpu_percent, pct)}"))
        if self.cpu_time_sec is not None:
            rows.append(("CPU time", fmt(self.cpu_time_sec, unit_of("proc_cpu_time_s"))))
        if self.peak_gpu_mem_mb is not None:
            rows.append(("GPU util mean", fmt(self.mean_gpu_util, unit_of("gpu_util_percent"))))
            rows.append(("GPU memory peak (all GPUs)", fmt(self.peak_gpu_mem_mb, unit_of("gpu_mem_used_mb"))))
            rows.append(("GPU memory peak (this tree)", fmt(self.peak_proc_gpu_mem_mb, unit_of("gpu_proc_mem_mb"))))
        if self.mean_gpu_power_w is not None:
            rows.append(("GPU power mean", fmt(self.mean_gpu_power_w, unit_of("gpu_power_w"))))
        rows.append(("Samples", fmt(self.num_samples, "")))
        return rows

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("ResourceSummary\n" + str(self))

    def _repr_html_(self) -> str:
        from .render import html_table

        return html_table("Resource summary", self.rows())


_REQUIRED = ("peak_rss_mb", "mean_rss_mb", "memory_growth_mb", "num_samples", "duration_sec")
_ALWAYS_WRITTEN = _REQUIRED + ("peak_gpu_mem_mb", "mean_gpu_util")
_TYPES = {f.name: f.type for f in dataclasses.fields(ResourceSummary)}


def _primitive(name: str, value):
    # numpy / JAX scalars become plain Python numbers (calibrax's "JAX scalar safety").
    if value is None:
        return None
    if _TYPES[name].startswith("bool"):
        return bool(value)
    if _TYPES[name].startswith("int"):
        return int(value)
    return float(value)


def _checked(name: str, value):
    kind = _TYPES[name]
    if value is None:
        if name in _REQUIRED:
            raise ValueError(f"ResourceSummary.from_dict: {name} must be a number, got None")
        return None
    if kind.startswith("bool"):
        if not isinstance(value, bool):
            raise ValueError(f"ResourceSummary.from_dict: {name} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(value, complex):
        raise ValueError(f"ResourceSummary.from_dict: {name} must be a number, got {value!r}")
    if kind.startswith("int"):
        if isinstance(value, float) and not value.is_integer():  # int() raises on inf and NaN
            raise ValueError(f"ResourceSummary.from_dict: {name} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


# ResourceSummary field <- (statistic, column) of a store window.
FROM_WINDOW = {
    "mean_rss_mb": ("mean", "proc_rss_mb"),
    "peak_gpu_mem_mb": ("max", "gpu_mem_used_mb"),
    "mean_gpu_util": ("mean", "gpu_util_percent"),
    "mean_gpu_clock_mhz": ("mean", "gpu_sm_clock_mhz"),
    "mean_gpu_power_w": ("mean", "gpu_power_w"),
    "mean_cpu_percent": ("mean", "proc_cpu_percent"),
    "peak_cpu_percent": ("max", "proc_cpu_percent"),
    "peak_proc_gpu_mem_mb": ("max", "gpu_proc_mem_mb"),
    "cpu_time_sec": ("delta", "proc_cpu_time_s"),
    "memory_limit_mb": ("last", "cgroup_mem_limit_mb"),
}
# Counts: whole numbers.
COUNTS_FROM_WINDOW = {
    "max_processes": ("max", "proc_count"),
    "oom_kills": ("delta", "cgroup_oom_kills"),
}


def summarize(stats, *, peak_exact: bool | None = None) -> ResourceSummary:
    """ResourceSummary of a store window's :class:`~nbmon.store.Stats`."""
    if stats.count == 0:
        return ResourceSummary.zeroed()
    figures = {field: known(stats.value(stat, column)) for field, (stat, column) in FROM_WINDOW.items()}
    counts = {field: known(stats.value(stat, column)) for field, (stat, column) in COUNTS_FROM_WINDOW.items()}
    rss_peak = known(stats.value("max", "proc_rss_peak_mb"))
    if rss_peak is None:
        rss_peak = known(stats.value("max", "proc_rss_mb"))
    growth = stats.value("delta", "proc_rss_mb")
    duration = stats.duration
    if figures["cpu_time_sec"] is not None and duration > 0:
        # Exact, from the CPU clocks; the mean of the % column would miss the
        # CPU of processes found late (counted in the time, not in any %).
        figures["mean_cpu_percent"] = figures["cpu_time_sec"] / duration * 100.0
    start = stats.wall_first - (stats.t_first - stats.t_open) if stats.t_open == stats.t_open else stats.wall_first
    return ResourceSummary(
        peak_rss_mb=rss_peak or 0.0,
        memory_growth_mb=known(growth) or 0.0,
        num_samples=int(stats.count),
        duration_sec=float(duration),
        peak_rss_exact=peak_exact if "proc_rss_mb" in stats.columns else None,
        start_time=known(start),
        end_time=known(stats.wall_last),
        **{**figures, "mean_rss_mb": figures["mean_rss_mb"] or 0.0},
        **{field: None if value is None else int(value) for field, value in counts.items()},
    )
