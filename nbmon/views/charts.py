"""The chart, declared once. The live dashboard's plotly subplots and the
static timeline of a record (a PNG) are both drawn from :data:`ROWS` and
:data:`STYLES`; a metric joins a row through its catalog entry's ``chart``,
and how it is drawn follows from its catalog ``source``: the kernel's own
figures on top and emphasised on the row's left axis, machine-wide ones as a
light band on the row's right axis, the container's as a dashed line beside
the kernel's (its memory limit is the kernel's ceiling).
"""
from __future__ import annotations

import base64
import math
from dataclasses import dataclass

import numpy as np

from .. import catalog
from ..format import fmt
from ..report.render import BLANK_PNG, Output, png_strips

TIMELINE_PX = 360       # CSS width of a record's timeline picture
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#17becf", "#8c564b", "#e377c2")
MACHINE_COLOR = "rgba(128, 128, 128, 0.45)"   # machine-wide bands: grey whatever the row, light
MACHINE_FILL = "rgba(128, 128, 128, 0.18)"
LIMIT_COLOR = "#d62728"


@dataclass(frozen=True, slots=True)
class Row:
    key: str          # the catalog's `chart` value of the metrics drawn here
    title: str        # left (kernel) axis title
    short: str        # the row's name in a timeline's legend and a cluster view's column title
    px: int           # height in the dashboard
    machine: str | None = None               # right (machine) axis title; None: the row has none
    machine_range: tuple[float, float] | None = None   # a fixed right axis range (None: fit the data)
    total: str | None = None   # the column that stands for the row in a timeline and a cluster view,
                               # None: the row's kernel (tree) metric in the catalog

    @property
    def headline(self) -> str:
        if self.total is not None:
            return self.total
        return next(m.name for m in catalog.METRICS if m.chart == self.key and m.source == catalog.TREE)


ROWS = (
    Row("cpu", "kernel CPU %", "CPU", 150, "machine CPU %", (0.0, 100.0)),
    Row("memory", "kernel MiB", "memory", 150, "machine MiB"),
    Row("gpu_util", "GPU util %", "GPU", 120, total="gpu_util_percent"),
    Row("gpu_memory", "GPU memory MiB", "GPU mem", 120, total="gpu_mem_used_mb"),
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


@dataclass(frozen=True, slots=True)
class Timeline:
    """A record's timeline: a PNG of one strip per chart row (its headline
    column, from 0 to the window's peak), and its legend as a table row."""
    png: bytes
    width: int          # CSS pixels (the PNG has twice as many)
    height: int
    legend: tuple[str, str]

    def bundle(self) -> tuple[dict, dict]:
        """(data, metadata) of the picture as its own output."""
        return ({"image/png": base64.b64encode(self.png).decode("ascii"),
                 "text/plain": f"nbmon timeline: {self.legend[1]}"},
                {"image/png": {"width": self.width, "height": self.height}})


@dataclass(frozen=True, slots=True)
class Record:
    """A static record as a notebook keeps it: its table (HTML every viewer
    shows, and plain text), and its timeline picture (None: too few samples),
    each its own output."""
    html: str
    text: str
    timeline: Timeline | None

    def table(self) -> Output:
        return Output({"text/html": self.html, "text/plain": self.text})

    def picture(self) -> Output:
        """The timeline's output; one transparent pixel where there is no
        timeline yet (an output that a later update can fill)."""
        if self.timeline is not None:
            return Output(*self.timeline.bundle())
        return Output({"image/png": base64.b64encode(BLANK_PNG).decode("ascii"), "text/plain": ""},
                      {"image/png": {"width": 1, "height": 1}})


_PLACES = {1: ("strip",), 2: ("top", "bottom"), 3: ("top", "middle", "bottom"),
           4: ("top", "2nd", "3rd", "bottom")}


def record_timeline(store, stats, t_from: float = -math.inf) -> Timeline | None:
    """The timeline of the samples a window's ``stats`` cover (those after
    ``t_from``, the window's opening sample excluded, up to its last; the
    monitor may have sampled on since): each row's headline column on a
    scale up to the window's own peak, the figure its summary table shows,
    so the picture and the table agree. None without two samples."""
    if store is None or stats is None or not stats.count:
        return None
    wanted = [row for row in ROWS if row.headline in store.columns]
    t, _wall, values = store.series([row.headline for row in wanted], t_from=t_from)
    start = int(np.searchsorted(t, t_from, side="right")) if math.isfinite(t_from) else 0
    end = int(np.searchsorted(t, stats.t_last, side="right"))
    colors = row_colors(store.columns)
    return timeline(t[start:end], [(row, values[row.headline][start:end], _peak(stats, row.headline), colors.get(row.key))
                                for row in wanted])


def row_colors(columns) -> dict[str, str]:
    """Each chart row's colour among ``columns``: its first trace's that is not the machine's."""
    shown, traces = traces_for(columns)
    colors: dict[str, str] = {}
    for trace in traces:
        if not trace.style.machine:
            colors.setdefault(shown[trace.row - 1].key, trace.color)
    return colors


def timeline(t, strips) -> Timeline | None:
    """A timeline of ``strips``, (row, values at ``t``, peak, colour) each: a
    strip from 0 to the peak (NaN: the values' highest; at least that), in
    the colour (None: the palette's first). None without two times or any value."""
    if len(t) < 2:
        return None
    drawn, parts = [], []
    for row, v, peak, color in strips:
        if not np.isfinite(v).any():
            continue
        top = max(peak, float(np.nanmax(v))) if peak == peak else float(np.nanmax(v))
        drawn.append((v, top if top > 0 else 1.0, color or PALETTE[0]))
        parts.append((row.short, fmt(top, catalog.unit_of(row.headline))))
    if not drawn:
        return None
    strip_px, gap_px = 24, 6
    legend = " · ".join(f"{place}: {short} to {peak}" for place, (short, peak) in zip(_PLACES[len(parts)], parts))
    return Timeline(png_strips(t, drawn, width=TIMELINE_PX, strip_px=strip_px, gap_px=gap_px),
                    TIMELINE_PX, len(drawn) * (strip_px + gap_px) - gap_px,
                    ("Timeline, below", f"{legend} · over {fmt(float(t[-1] - t[0]), 's')}"))


def _peak(stats, column: str) -> float:
    # The metric's peak column where the store has one: the figure the summary table shows.
    metric = catalog.metric_of(column)
    if metric is not None and metric.peak is not None and metric.peak in stats.columns:
        value = stats.value("max", metric.peak)
        if value == value:
            return value
    return stats.value("max", column)
