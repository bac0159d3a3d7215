"""The chart's rows, declared once. The live dashboard's plotly subplots and
the static SVG timeline of a record are both drawn from :data:`ROWS`; a
metric joins a row through its catalog entry's ``chart``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import catalog
from ..render import svg_timeline
from .frames import bucket_max

ROW_PX = 170            # height of one dashboard row
TIMELINE_POINTS = 600   # points of a static timeline
PALETTE = ("#1f77b4", "#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#17becf", "#8c564b")


@dataclass(frozen=True, slots=True)
class Row:
    key: str          # the catalog's `chart` value of the metrics drawn here
    title: str        # y-axis title
    short: str        # the row's name in a static timeline's legend
    headline: str     # the column a static timeline draws for the row


ROWS = (
    Row("cpu", "CPU %", "CPU", "proc_cpu_percent"),
    Row("memory", "memory MiB", "RSS", "proc_rss_mb"),
    Row("gpu_util", "GPU util %", "GPU", "gpu_util_percent"),
    Row("gpu_memory", "GPU memory MiB", "GPU mem", "gpu_mem_used_mb"),
)


@dataclass(frozen=True, slots=True)
class Trace:
    row: int          # 1-based, among the rows shown
    column: str
    label: str
    unit: str
    color: str


def traces_for(columns) -> tuple[list[Row], list[Trace]]:
    """The rows that have data among ``columns`` and their traces, in
    display order (catalog order within a row, devices in index order)."""
    by_row: dict[str, list[tuple[str, catalog.Metric, int | None]]] = {row.key: [] for row in ROWS}
    for column in columns:
        metric = catalog.metric_of(column)
        if metric is None or metric.chart not in by_row:
            continue
        device = catalog.split_device_column(column)
        by_row[metric.chart].append((column, metric, device[0] if device else None))
    order = {m.name: k for k, m in enumerate(catalog.METRICS)}
    rows, traces = [], []
    for row in ROWS:
        members = sorted(by_row[row.key], key=lambda c: (order[c[1].name], -1 if c[2] is None else c[2]))
        if not members:
            continue
        rows.append(row)
        for column, metric, device in members:
            label = metric.label if device is None else f"GPU {device} {metric.label}"
            traces.append(Trace(len(rows), column, label, metric.unit, PALETTE[len(traces) % len(PALETTE)]))
    return rows, traces


def svg_record_timeline(store, t_from: float = -math.inf) -> str:
    """Static SVG timeline of what the store holds from ``t_from`` on: each
    row's headline column (those with data)."""
    if store is None:
        return ""
    wanted = [row for row in ROWS if row.headline in store.columns]
    t, _wall, values = store.series([row.headline for row in wanted], t_from=t_from)
    t, peaks = bucket_max(t, values, TIMELINE_POINTS)
    return svg_timeline(t, {row.short: (peaks[row.headline], catalog.unit_of(row.headline))
                            for row in wanted})
