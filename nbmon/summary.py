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

    The first nine fields are calibrax's: ``peak_rss_mb``, ``mean_rss_mb``
    and ``memory_growth_mb`` are of the tree's RSS *sum*, which counts a page
    shared by forked workers once per process (as psutil and calibrax do).
    Means are time-weighted (each sample stands for the interval before
    it), which equals calibrax's plain mean when samples are evenly spaced
    and stays right when they are not.

    nbmon's headline memory is the tree's ``peak_mem_mb`` / ``mean_mem_mb``
    / ``mem_growth_mb``: its PSS, shared pages counted once
    (nbmon.sources.proctree). ``peak_mem_kind`` says what its peak is:
    "exact" (one process, its high-water mark rose in the period or it could
    not have grown between samples), "upper bound" (several processes, each
    one's own peak known, but they need not have coincided) or "sampled" (a
    spike between samples may be missing; ``peak_mem_bound_mb`` is then the
    most it can have been, None when not even that is known).
    ``peak_rss_exact`` is True for the first two. The RSS growth by kind --
    anonymous, file-backed (page cache of mapped files: reclaimable), shared
    memory (/dev/shm) -- says what a growth was.

    ``cpu_time_sec`` is read from the kernel's CPU clocks, and
    ``mean_cpu_percent`` is it over the duration. ``memory_limit_mb``,
    ``peak_container_mem_mb`` and ``oom_kills`` are the container's
    (cgroup's): its memory limit, its usage at its highest in the period
    (what the OOM killer compares with the limit), and the processes its
    OOM killer killed in the period. ``peak_group_mem_mb`` is the exact peak
    of a cgroup of the tree's own (``nbmon run --cgroup``): every page once,
    page cache included.
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
    peak_mem_mb: float | None = None
    peak_mem_kind: str | None = None
    peak_mem_bound_mb: float | None = None
    mean_mem_mb: float | None = None
    mem_growth_mb: float | None = None
    anon_growth_mb: float | None = None
    file_growth_mb: float | None = None
    shmem_growth_mb: float | None = None
    peak_container_mem_mb: float | None = None
    peak_group_mem_mb: float | None = None

    @property
    def peak_rss_kind(self) -> str:
        """How the peaks were found: 'exact', 'upper bound' or 'sampled'."""
        if self.peak_mem_kind is not None:
            return self.peak_mem_kind
        return "exact" if self.peak_rss_exact else "sampled"

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
        mib, pct = unit_of("proc_pss_mb"), unit_of("proc_cpu_percent")
        rows = [("Duration", fmt(self.duration_sec, "s"))]
        if self.peak_mem_mb is not None:
            peak = fmt(self.peak_mem_mb, mib)
            if self.peak_mem_kind == "sampled" and self.peak_mem_bound_mb is not None \
                    and self.peak_mem_bound_mb > self.peak_mem_mb + 1.0:
                peak += f" (at most {fmt(self.peak_mem_bound_mb, mib)})"
            rows += [(f"Peak memory ({self.peak_mem_kind})", peak)]
            if self.peak_group_mem_mb is not None:
                rows.append(("Peak memory (own cgroup: exact, page cache in)", fmt(self.peak_group_mem_mb, mib)))
            rows += [
                     ("Memory growth", fmt(self.mem_growth_mb, mib, signed=True)),
                     ("Mean memory", fmt(self.mean_mem_mb, mib))]
            if self.peak_rss_mb > max(self.peak_mem_mb * SHARED_SHOWN, self.peak_mem_mb + 16.0):
                rows.append(("Peak RSS sum (shared pages in each process)", fmt(self.peak_rss_mb, mib)))
            split = [(name, value) for name, value in (("anon", self.anon_growth_mb),
                                                       ("page cache", self.file_growth_mb),
                                                       ("shared memory", self.shmem_growth_mb))
                     if value is not None]
            if any(abs(value) >= SPLIT_SHOWN_MB for name, value in split if name != "anon"):
                rows.append(("RSS growth by kind", " · ".join(f"{name} {fmt(value, mib, signed=True)}"
                                                              for name, value in split)))
        else:  # a summary read from calibrax's fields only
            kind = "" if self.peak_rss_exact is None else f" ({self.peak_rss_kind})"
            rows += [("Peak RSS" + kind, fmt(self.peak_rss_mb, mib)),
                     ("RSS growth", fmt(self.memory_growth_mb, mib, signed=True)),
                     ("Mean RSS", fmt(self.mean_rss_mb, mib))]
        if self.memory_limit_mb is not None:
            limit = unit_of("cgroup_mem_limit_mb")
            used = "" if self.peak_container_mem_mb is None else f"{fmt(self.peak_container_mem_mb, limit)} of "
            rows.append(("Container memory peak / limit" if used else "Memory limit (container)",
                         f"{used}{fmt(self.memory_limit_mb, limit)}"))
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


# The RSS sum is shown beside the memory when shared pages make it this much larger.
SHARED_SHOWN = 1.05
SPLIT_SHOWN_MB = 8.0   # the growth is split by kind once page cache or shared memory moved this much
PEAK_KINDS = ("exact", "upper bound", "sampled")
EXACT_SLACK_MB = 1.0   # an upper end this close to the peak closes the bracket
_REQUIRED = ("peak_rss_mb", "mean_rss_mb", "memory_growth_mb", "num_samples", "duration_sec")
_ALWAYS_WRITTEN = _REQUIRED + ("peak_gpu_mem_mb", "mean_gpu_util")
_TYPES = {f.name: f.type for f in dataclasses.fields(ResourceSummary)}


def _primitive(name: str, value):
    # numpy / JAX scalars become plain Python numbers (calibrax's "JAX scalar safety").
    if value is None:
        return None
    if _TYPES[name].startswith("str"):
        return str(value)
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
    if kind.startswith("str"):
        if value not in PEAK_KINDS:
            raise ValueError(f"ResourceSummary.from_dict: {name} must be one of "
                             f"{', '.join(map(repr, PEAK_KINDS))}, got {value!r}")
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
    "mean_mem_mb": ("mean", "proc_pss_mb"),
    "mem_growth_mb": ("delta", "proc_pss_mb"),
    "anon_growth_mb": ("delta", "proc_rss_anon_mb"),
    "file_growth_mb": ("delta", "proc_rss_file_mb"),
    "shmem_growth_mb": ("delta", "proc_rss_shmem_mb"),
    "peak_container_mem_mb": ("max", "cgroup_mem_used_mb"),
}
# Counts: whole numbers.
COUNTS_FROM_WINDOW = {
    "max_processes": ("max", "proc_count"),
    "oom_kills": ("delta", "cgroup_oom_kills"),
}


def peak_of(stats) -> tuple[float | None, str | None, float | None]:
    """(peak, kind, at most) of a window's tree memory: see ResourceSummary."""
    peak = known(stats.value("max", "proc_pss_peak_mb"))
    if peak is None:  # no high-water marks (or a window of other columns)
        sampled = "proc_pss_mb" in stats.columns or "proc_rss_mb" in stats.columns
        return known(stats.value("max", "proc_pss_mb")), ("sampled" if sampled else None), None
    bound_col = stats.columns.index("proc_pss_peak_bound_mb")
    bound = known(stats.value("max", "proc_pss_peak_bound_mb")) if stats.n[bound_col] == stats.count else None
    # The highest peak is the span's when no interval could have been higher.
    if bound is None or bound > peak + EXACT_SLACK_MB:
        return peak, "sampled", bound
    return peak, ("exact" if stats.value("max", "proc_count") <= 1 else "upper bound"), None


def summarize(stats) -> ResourceSummary:
    """ResourceSummary of a store window's :class:`~nbmon.store.Stats`."""
    if stats.count == 0:
        return ResourceSummary.zeroed()
    figures = {field: known(stats.value(stat, column)) for field, (stat, column) in FROM_WINDOW.items()}
    counts = {field: known(stats.value(stat, column)) for field, (stat, column) in COUNTS_FROM_WINDOW.items()}
    rss_peak = known(stats.value("max", "proc_rss_peak_mb"))
    if rss_peak is None:
        rss_peak = known(stats.value("max", "proc_rss_mb"))
    peak_mem, kind, bound = peak_of(stats)
    growth = stats.value("delta", "proc_rss_mb")
    duration = stats.duration
    if figures["cpu_time_sec"] is not None and duration > 0:
        # Exact, from the CPU clocks; the mean of the % column would miss the
        # CPU of processes found late (counted in the time, not in any %).
        figures["mean_cpu_percent"] = figures["cpu_time_sec"] / duration * 100.0
    if figures["mean_cpu_percent"] is not None:
        # A span shorter than an interval has a mean from the clocks but no
        # whole interval's rate: its busiest moment was at least its mean.
        figures["peak_cpu_percent"] = max(figures["peak_cpu_percent"] or 0.0, figures["mean_cpu_percent"])
    start = stats.wall_first - (stats.t_first - stats.t_open) if stats.t_open == stats.t_open else stats.wall_first
    return ResourceSummary(
        peak_rss_mb=rss_peak or 0.0,
        memory_growth_mb=known(growth) or 0.0,
        num_samples=int(stats.count),
        duration_sec=float(duration),
        peak_rss_exact=kind in ("exact", "upper bound") if kind is not None else None,
        peak_mem_mb=peak_mem, peak_mem_kind=kind, peak_mem_bound_mb=bound,
        start_time=known(start),
        end_time=known(stats.wall_last),
        **{**figures, "mean_rss_mb": figures["mean_rss_mb"] or 0.0},
        **{field: None if value is None else int(value) for field, value in counts.items()},
    )
