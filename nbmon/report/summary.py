"""ResourceSample and ResourceSummary: calibrax's two records, kept verbatim
(fields, order, defaults) and extended with what notebook users need.

Unknown values are ``None``, never NaN, so that summaries compare equal after
a ``to_dict``/``from_dict`` round trip.
"""
from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import dataclass, field
from typing import Any

from .. import catalog
from ..catalog import DELTA, GAUGE, LAST, MEAN, PEAK, figure_key, unit_of
from ..format import fmt
from .variables import Variables
from ..values import known


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
    (nbmon.sources.tree). ``peak_mem_kind`` says what its peak is:
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

    ``variables`` (a notebook cell's, last: it is not a figure of the
    window but what the kernel's namespace said at the cell's end) is
    :class:`nbmon.report.variables.Variables`: which variables the cell made,
    grew or freed, and the largest held.
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
    # Every catalog metric's statistics over the window, by figure_key ('max_proc_pss_mb'), and
    # for a metric with a peak bracket its kind ('kind_proc_pss_mb') and upper end ('bound_...').
    figures: dict[str, Any] = field(default_factory=dict)
    # A notebook cell's: the variables it made, grew or freed (nbmon.report.variables); None elsewhere.
    variables: Variables | None = None

    @property
    def peak_rss_kind(self) -> str:
        """How the peaks were found: 'exact', 'upper bound' or 'sampled'."""
        if self.peak_mem_kind is not None:
            return self.peak_mem_kind
        return "exact" if self.peak_rss_exact else "sampled"

    @property
    def peak_rise_mb(self) -> float | None:
        """How far memory (PSS) rose above where the window started, at its
        peak: a cell's own most, whatever earlier cells left held."""
        figures = self.figures or {}
        growth = figures.get(figure_key(DELTA, "proc_pss_mb"))
        now = figures.get(figure_key(LAST, "proc_pss_mb"))
        return self.peak_mem_mb - (now - growth) if None not in (self.peak_mem_mb, now, growth) else None

    @classmethod
    def zeroed(cls) -> "ResourceSummary":
        return cls(peak_rss_mb=0.0, mean_rss_mb=0.0, peak_gpu_mem_mb=None, mean_gpu_util=None,
                   memory_growth_mb=0.0, num_samples=0, duration_sec=0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, as calibrax writes it: ``peak_gpu_mem_mb`` and
        ``mean_gpu_util`` always (null when unknown), the other optional
        fields only when not None."""
        out: dict[str, Any] = {}
        for name in _TYPES:
            value = getattr(self, name)
            if value is None and name not in _ALWAYS_WRITTEN:
                continue
            out[name] = _primitive(name, value)
        if self.figures:
            out["figures"] = dict(self.figures)
        if self.variables is not None:
            out["variables"] = self.variables.to_dict()
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
        variables = data.get("variables")
        return cls(**values, figures=_checked_figures(data.get("figures", {})),
                   variables=Variables.from_dict(variables) if variables is not None else None)

    # -- for humans ------------------------------------------------------
    def rows(self) -> list[tuple[str, str]]:
        """(title, text) pairs: the rows the catalog declares (``Metric.record``)
        of the figures known, every number through :func:`nbmon.format.fmt`
        in its metric's unit, as the live meter shows it."""
        mib = unit_of("proc_pss_mb")
        rows = [(0, "Duration", fmt(self.duration_sec, "s"))]
        if self.peak_mem_mb is None:  # calibrax's fields only (a summary read back from its file)
            kind = "" if self.peak_rss_exact is None else f" ({self.peak_rss_kind})"
            rows += [(20, "Peak RSS" + kind, fmt(self.peak_rss_mb, mib)),
                     (30, "RSS growth", fmt(self.memory_growth_mb, mib, signed=True)),
                     (40, "Mean RSS", fmt(self.mean_rss_mb, mib))]
        if self.peak_group_mem_mb is not None:
            rows.append((25, "Peak memory (own cgroup: exact, page cache in)", fmt(self.peak_group_mem_mb, mib)))
        figures = self.figures or self._figures_of_fields()
        for metric, shown in catalog.recorded():
            row = _row(metric, shown, figures)
            if row is not None:
                rows.append((shown.rank, *row))
        if self.variables is not None:   # below the memory's growth: what grew
            rows += [(VARIABLES_RANK, title, text) for title, text in self.variables.rows()]
        rows.append((10 ** 6, "Samples", fmt(self.num_samples, "")))
        return [(title, text) for _, title, text in sorted(rows, key=lambda row: row[0])]

    def _figures_of_fields(self) -> dict[str, Any]:
        """The figures the fields hold, for a summary made from fields alone."""
        out = {figure_key(stat, name): getattr(self, f)
               for f, (stat, name) in (*FROM_WINDOW.items(), *COUNTS_FROM_WINDOW.items())}
        out["kind_proc_pss_mb"], out["bound_proc_pss_mb"] = self.peak_mem_kind, self.peak_mem_bound_mb
        return out

    def __post_init__(self):
        if self.figures is None:  # as every other optional field may be given
            object.__setattr__(self, "figures", {})

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("ResourceSummary\n" + str(self))

    def _repr_html_(self) -> str:
        from .render import html_table

        return html_table("Resource summary", self.rows())


PEAK_KINDS = ("exact", "upper bound", "sampled")
EXACT_SLACK_MB = 1.0   # an upper end this close to the peak closes the bracket
_REQUIRED = ("peak_rss_mb", "mean_rss_mb", "memory_growth_mb", "num_samples", "duration_sec")
_ALWAYS_WRITTEN = _REQUIRED + ("peak_gpu_mem_mb", "mean_gpu_util")
_TYPES = {f.name: f.type for f in dataclasses.fields(ResourceSummary) if f.name not in ("figures", "variables")}
VARIABLES_RANK = 35   # the variables' rows: after the memory's growth (catalog's ranks: 30), before its mean (40)


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


def _checked_figures(figures) -> dict[str, Any]:
    if not isinstance(figures, dict) or not all(isinstance(k, str) for k in figures):
        raise ValueError(f"ResourceSummary.from_dict: figures must be a mapping of names, got {reprlib.repr(figures)}")
    out = {}
    for key, value in figures.items():
        if key.startswith("kind_"):
            if value is not None and value not in PEAK_KINDS:
                raise ValueError(f"ResourceSummary.from_dict: figures[{key!r}] must be one of "
                                 f"{', '.join(map(repr, PEAK_KINDS))}, got {value!r}")
            out[key] = value
        elif value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            out[key] = known(value)
        else:
            raise ValueError(f"ResourceSummary.from_dict: figures[{key!r}] must be a number, got {value!r}")
    return out


def _row(metric: catalog.Metric, shown: catalog.Shown, figures: dict) -> tuple[str, str] | None:
    """The row ``shown`` of ``metric`` (see catalog.Shown), None when not shown."""
    stats = shown.stat if isinstance(shown.stat, tuple) else (shown.stat or metric.summary,)
    values = [figures.get(figure_key(stat, metric.name)) for stat in stats]
    unit, value = metric.unit, values[0]
    if shown.form == "of":
        other = catalog.BY_NAME[shown.other]
        beside = figures.get(figure_key(other.summary, other.name))
        if beside is None:
            return None
        if value is None:
            return shown.alone, fmt(beside, other.unit)
        return shown.title, f"{fmt(value, unit)} of {fmt(beside, other.unit)}"
    if shown.form == "split":
        names = (metric.name, *shown.other)
        parts = [(catalog.BY_NAME[n].short, figures.get(figure_key(DELTA, n))) for n in names]
        if not any(v is not None and abs(v) >= catalog.MOVED_MB for _, v in parts[1:]):
            return None
        return shown.title, " · ".join(f"{short} {fmt(v, unit, signed=True)}" for short, v in parts if v is not None)
    if all(v is None for v in values) or (shown.when == "nonzero" and not value):
        return None
    if shown.when == "above":
        # A lone process's pages shared with processes outside the tree explain nothing here.
        other, processes = figures.get(figure_key(PEAK, shown.other)), figures.get(figure_key(PEAK, "proc_count"))
        if other is None or value is None or value <= max(other * catalog.ABOVE_SHARE, other + catalog.ABOVE_MB) \
                or processes is None or processes < 2:
            return None
    if shown.form == "peak":
        kind, bound = figures.get("kind_" + metric.name), figures.get("bound_" + metric.name)
        text = fmt(value, unit)
        if kind == "sampled" and bound is not None and bound > value + EXACT_SLACK_MB:
            text += f" (at most {fmt(bound, unit)})"
        return f"{shown.title} ({kind})", text
    signed = stats == (DELTA,) and metric.kind == GAUGE  # a level's growth; a counter's count
    return shown.title, " / ".join(fmt(v, unit, signed=signed) for v in values)


# The seed API's fields <- (statistic, metric): calibrax's ResourceSummary as a facade over the figures.
FROM_WINDOW = {
    "peak_rss_mb": (PEAK, "proc_rss_mb"),
    "memory_growth_mb": (DELTA, "proc_rss_mb"),
    "mean_rss_mb": (MEAN, "proc_rss_mb"),
    "peak_gpu_mem_mb": (PEAK, "gpu_mem_used_mb"),
    "mean_gpu_util": (MEAN, "gpu_util_percent"),
    "mean_gpu_clock_mhz": (MEAN, "gpu_sm_clock_mhz"),
    "mean_gpu_power_w": (MEAN, "gpu_power_w"),
    "mean_cpu_percent": (MEAN, "proc_cpu_percent"),
    "peak_cpu_percent": (PEAK, "proc_cpu_percent"),
    "peak_proc_gpu_mem_mb": (PEAK, "gpu_proc_mem_mb"),
    "cpu_time_sec": (DELTA, "proc_cpu_time_s"),
    "memory_limit_mb": (LAST, "cgroup_mem_limit_mb"),
    "peak_mem_mb": (PEAK, "proc_pss_mb"),
    "mean_mem_mb": (MEAN, "proc_pss_mb"),
    "mem_growth_mb": (DELTA, "proc_pss_mb"),
    "anon_growth_mb": (DELTA, "proc_rss_anon_mb"),
    "file_growth_mb": (DELTA, "proc_rss_file_mb"),
    "shmem_growth_mb": (DELTA, "proc_rss_shmem_mb"),
    "peak_container_mem_mb": (PEAK, "cgroup_mem_used_mb"),
}
# Counts: whole numbers.
COUNTS_FROM_WINDOW = {
    "max_processes": (PEAK, "proc_count"),
    "oom_kills": (DELTA, "cgroup_oom_kills"),
}


def _wanted() -> dict[str, set[str]]:
    """metric name -> the statistics a window's figures hold of it: its own
    summary statistic, those its record rows show, those the facade reads."""
    wanted: dict[str, set[str]] = {m.name: {m.summary} for m in catalog.METRICS if m.source != catalog.DEVICE}
    for metric, shown in catalog.recorded():
        wanted[metric.name].update(shown.stat if isinstance(shown.stat, tuple) else (shown.stat or metric.summary,))
    for stat, name in (*FROM_WINDOW.values(), *COUNTS_FROM_WINDOW.values()):
        wanted[name].add(stat)
    for metric in catalog.headlines():
        if metric.name in wanted:
            wanted[metric.name].update(catalog.line_stats(metric))
    return wanted


def figures_of(stats) -> dict[str, Any]:
    """Every catalog metric's statistics over a store window (those it has)."""
    out: dict[str, Any] = {}
    for name, wanted in _wanted().items():  # the catalog as it is now: a metric added at run time too
        if name not in stats.columns:
            continue
        metric = catalog.BY_NAME[name]
        for stat in wanted:
            column = metric.peak if stat == PEAK and metric.peak in stats.columns else name
            value = known(stats.value(stat, column))
            if value is None and column != name:  # no peak column reading: the samples' own highest
                value = known(stats.value(stat, name))
            out[figure_key(stat, name)] = value
        if metric.bound is not None:
            _, out["kind_" + name], out["bound_" + name] = peak_of(stats, metric)
    cpu_s, duration = out.get(figure_key(DELTA, "proc_cpu_time_s")), stats.duration
    if cpu_s is not None and duration > 0:
        # Exact, from the CPU clocks; the mean of the % column would miss the
        # CPU of processes found late (counted in the time, not in any %).
        out[figure_key(MEAN, "proc_cpu_percent")] = cpu_s / duration * 100.0
    mean = out.get(figure_key(MEAN, "proc_cpu_percent"))
    if mean is not None:
        # A span shorter than an interval has a mean from the clocks but no
        # whole interval's rate: its busiest moment was at least its mean.
        key = figure_key(PEAK, "proc_cpu_percent")
        out[key] = max(out.get(key) or 0.0, mean)
    return out


def peak_of(stats, metric: catalog.Metric | None = None) -> tuple[float | None, str | None, float | None]:
    """(peak, kind, at most) of a window's ``metric`` (default: the tree's
    memory), whose intervals' peaks and upper ends are in its ``peak`` and
    ``bound`` columns: see ResourceSummary."""
    metric = metric or catalog.BY_NAME["proc_pss_mb"]
    peak = known(stats.value("max", metric.peak))
    if peak is None:  # no high-water marks (or a window of other columns)
        sampled = metric.name in stats.columns or "proc_rss_mb" in stats.columns
        return known(stats.value("max", metric.name)), ("sampled" if sampled else None), None
    bound_col = stats.columns.index(metric.bound)
    bound = known(stats.value("max", metric.bound)) if stats.n[bound_col] == stats.count else None
    # The highest peak is the span's when no interval could have been higher.
    if bound is None or bound > peak + EXACT_SLACK_MB:
        return peak, "sampled", bound
    return peak, ("exact" if stats.value("max", "proc_count") <= 1 else "upper bound"), None


def summarize(stats) -> ResourceSummary:
    """ResourceSummary of a store window's :class:`~nbmon.sampling.store.Stats`."""
    if stats.count == 0:
        return ResourceSummary.zeroed()
    figures = figures_of(stats)
    fields = {f: figures.get(figure_key(stat, name)) for f, (stat, name) in FROM_WINDOW.items()}
    counts = {f: figures.get(figure_key(stat, name)) for f, (stat, name) in COUNTS_FROM_WINDOW.items()}
    kind = figures.get("kind_proc_pss_mb")
    if kind is None and "proc_rss_mb" in stats.columns:
        kind = "sampled"
    start = stats.wall_first - (stats.t_first - stats.t_open) if stats.t_open == stats.t_open else stats.wall_first
    required = {f: fields[f] or 0.0 for f in ("peak_rss_mb", "memory_growth_mb", "mean_rss_mb")}
    return ResourceSummary(
        num_samples=int(stats.count),
        duration_sec=float(stats.duration),
        peak_rss_exact=kind in ("exact", "upper bound") if kind is not None else None,
        peak_mem_kind=kind, peak_mem_bound_mb=figures.get("bound_proc_pss_mb"),
        start_time=known(start),
        end_time=known(stats.wall_last),
        figures=figures,
        **{**fields, **required},
        **{f: None if value is None else int(value) for f, value in counts.items()},
    )


def labelled_headline(figures: dict) -> str:
    """A window's headline figures, each labelled by its statistic (the
    catalog's ``line``): 'CPU mean 40 % · Memory now 120 MiB, +0.1 MiB, peak 121 MiB'."""
    parts = []
    for metric in catalog.headlines():
        said = [f"{catalog.LINE_WORDS[stat]} {fmt(value, metric.unit, signed=stat == DELTA)}".lstrip()
                for stat in catalog.line_stats(metric)
                if (value := figures.get(figure_key(stat, metric.name))) is not None]
        if said:
            parts.append(f"{metric.short} " + ", ".join(said))
    return " · ".join(parts)


def headline(values: dict) -> str:
    """A sample's headline figures (``catalog.headlines()``, those it has):
    'CPU 3.1 % · Memory 120 MiB', and the GPU's where there is one."""
    return " · ".join(f"{m.short} {fmt(values.get(m.name), m.unit)}" for m in catalog.headlines() if m.name in values)
