"""The chart, declared once. The live dashboard's plotly subplots and the
static SVG timeline of a record are both drawn from :data:`ROWS` and
:data:`STYLES`; a metric joins a row through its catalog entry's ``chart``,
and how it is drawn follows from its catalog ``source``: the kernel's own
figures on top and emphasised on the row's left axis, machine-wide ones as a
light band on the row's right axis, the container's as a dashed line beside
the kernel's (its memory limit is the kernel's ceiling).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import catalog
from ..render import svg_timeline
from .frames import bucket_max

TIMELINE_POINTS = 600   # points of a static timeline
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#17becf", "#8c564b", "#e377c2")
MACHINE_COLOR = "rgba(128, 128, 128, 0.45)"   # machine-wide bands: grey whatever the row, light
MACHINE_FILL = "rgba(128, 128, 128, 0.18)"
LIMIT_COLOR = "#d62728"


@dataclass(frozen=True, slots=True)
class Row:
    key: str          # the catalog's `chart` value of the metrics drawn here
    title: str        # left (kernel) axis title
    short: str        # the row's name in a static timeline's legend
    headline: str     # the column a static timeline draws for the row
    px: int           # height in the dashboard
    machine: str | None = None               # right (machine) axis title; None: the row has none
    machine_range: tuple[float, float] | None = None   # a fixed right axis range (None: fit the data)


ROWS = (
    Row("cpu", "kernel CPU %", "CPU", "proc_cpu_percent", 150, "machine CPU %", (0.0, 100.0)),
    Row("memory", "kernel MiB", "RSS", "proc_rss_mb", 150, "machine MiB"),
    Row("gpu_util", "GPU util %", "GPU", "gpu_util_percent", 120),
    Row("gpu_memory", "GPU memory MiB", "GPU mem", "gpu_mem_used_mb", 120),
)


@dataclass(frozen=True, slots=True)
class Style:
    machine: bool = False     # drawn on the row's right axis, under the kernel's traces
    width: float = 2.0
    dash: str | None = None
    fill: str | None = None   # the colour of a band down to zero
    color: str | None = None  # None: the next palette colour


STYLES = {
    catalog.TREE: Style(width=2.2),
    catalog.MACHINE: Style(machine=True, width=0.8, fill=MACHINE_FILL, color=MACHINE_COLOR),
    catalog.CGROUP: Style(width=1.4, dash="dash", color=LIMIT_COLOR),
    catalog.GPU: Style(width=1.6),
    catalog.DEVICE: Style(width=1.6),
}


@dataclass(frozen=True, slots=True)
class Trace:
    row: int          # 1-based, among the rows shown
    column: str
    label: str
    unit: str
    color: str
    style: Style


def traces_for(columns) -> tuple[list[Row], list[Trace]]:
    """The rows that have data among ``columns`` and their traces, in
    drawing order: machine-wide bands first (underneath), then catalog order
    (devices in index order)."""
    by_row: dict[str, list[tuple[str, catalog.Metric, int | None]]] = {row.key: [] for row in ROWS}
    for column in columns:
        metric = catalog.metric_of(column)
        if metric is None or metric.chart not in by_row:
            continue
        device = catalog.split_device_column(column)
        by_row[metric.chart].append((column, metric, device[0] if device else None))
    order = {m.name: k for k, m in enumerate(catalog.METRICS)}
    rows, traces, colors = [], [], iter(PALETTE * 8)
    for row in ROWS:
        members = sorted(by_row[row.key], key=lambda c: (not STYLES[c[1].source].machine, order[c[1].name],
                                                         -1 if c[2] is None else c[2]))
        if not members:
            continue
        rows.append(row)
        for column, metric, device in members:
            style = STYLES[metric.source]
            label = metric.label if device is None else f"GPU {device} {metric.label}"
            traces.append(Trace(len(rows), column, label, metric.unit, style.color or next(colors), style))
    return rows, traces


def svg_record_timeline(store, stats, t_from: float = -math.inf) -> str:
    """Static SVG timeline of the samples a window's ``stats`` cover (those
    after ``t_from``, the window's opening sample excluded): each row's
    headline column, with the window's own peaks in the legend, so the
    timeline and the summary table beside it give the same figures."""
    if store is None or stats is None or not stats.count:
        return ""
    wanted = [row for row in ROWS if row.headline in store.columns]
    t, _wall, values = store.series([row.headline for row in wanted], t_from=t_from)
    start = int(np.searchsorted(t, t_from, side="right")) if math.isfinite(t_from) else 0
    t, values = t[start:], {c: v[start:] for c, v in values.items()}
    t, peaks = bucket_max(t, values, TIMELINE_POINTS)
    return svg_timeline(t, {row.short: (peaks[row.headline], catalog.unit_of(row.headline),
                                        _peak(stats, row.headline)) for row in wanted})


def _peak(stats, column: str) -> float:
    # The exact high-water mark where there is one: the figure the summary table shows.
    exact = "proc_rss_peak_mb" if column == "proc_rss_mb" else None
    value = stats.value("max", exact) if exact else math.nan
    return value if value == value else stats.value("max", column)

