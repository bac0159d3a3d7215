"""The live view of a watched Dask cluster (:class:`ClusterView`): a
:class:`~nbmon.views.live.LiveView`, as the dashboard is (one widget
class and front end, one-way frames, the same record in every viewer).

A column per chart row of :data:`~nbmon.views.charts.ROWS` that the
workers have (CPU, memory, GPU utilisation and memory), the workers on top
and the cluster's total below. A worker's trace is its batches' mean (CPU,
GPU utilisation) or maximum (memory: :func:`~nbmon.dask.wire.shown_column`);
the memory column has each distinct memory limit and Dask spill/pause
threshold as a line once a worker comes within half of it. From
:data:`COMPACT_AT` workers on, the top row is compact: the band from the
lowest to the highest worker and the median line (the legend says so). x
is seconds since the watch started.

What a frame holds: each worker's batches since the last frame (appended:
a worker's trace is a stream the front end adds when it joins), and at most
every :data:`TOTALS_EVERY_S` the totals and bands on a grid of
:data:`GRID_POINTS` over the window (replacing the last: a late batch
changes the sum). A worker that leaves keeps its trace, named "(left)" and
ended by a marker. The threshold lines, the notes on what degrades the
figures and the compact legend are the layout's patch, re-sent when they
change. Nothing a worker sends raises here: errors are counted in ``errors``.
"""
from __future__ import annotations

import html
import math
import time

import numpy as np

from .. import catalog
from ..dask import workers_table, workers_text
from ..dask.wire import shown_column
from ..format import fmt
from ..options import DEFAULT_WINDOW_S
from ..report.summary import headline
from . import live
from .charts import LIMIT_COLOR, PALETTE, ROWS, Record, row_colors, timeline
from .frames import DEFAULT_BUDGET, MAX_FRAME_BYTES, build_frame
from .live import Frame, Group, LiveView

__all__ = ["ClusterView", "COMPACT_AT", "BANDS", "THREAD_NAME", "held", "across", "notes"]

THREAD_NAME = "nbmon-cluster"
COMPACT_AT = 64          # workers from which the top row shows bands, not a trace per worker
GRID_POINTS = 300        # points of a total or band trace over the window
TOTALS_EVERY_S = 1.0     # the totals' grid is re-sent at most this often (workers send a batch a second)
KEEPALIVE_S = 2.0        # a frame (the title at least) this often while nothing arrives: the view stays live
BANDS = ("min", "max", "median")   # the compact view's traces per row, in drawing order
STALE_PERIODS = 3        # a worker's last batch stands for it this many periods, then it is a gap
LINE_FROM = 0.5          # a memory threshold is drawn once a worker's memory reaches this share of it
HEIGHT_PX, BOTTOM_PX, NOTE_PX = 560, 40, 16   # the chart; below its x axis; a line of notes below that
MOST_LINES = 9           # threshold lines drawn at most
_EMPTY = np.empty(0, dtype=np.float32)
HOSTS_COLUMN = shown_column("sys_mem_used_mb")   # the hosts' memory, beside the workers' total


def _label(feed) -> str:
    return feed.name if feed.name != feed.address else feed.address.rsplit("/", 1)[-1]


def latest_at(times, edges: np.ndarray, stale_s: float) -> np.ndarray:
    """(len(times), len(edges)): for each series of ``times`` (each sorted)
    and each of ``edges`` (sorted), the index in the series concatenated of
    its latest time at or before the edge, -1 when none is within
    ``stale_s``. Each time is put at the first edge at or after it, the
    latest one of a series at each edge kept, then carried forward."""
    lengths = np.array([len(t) for t in times], dtype=np.intp)
    at = np.full((len(times), len(edges)), -1, dtype=np.intp)
    if not lengths.sum():
        return at
    flat = np.concatenate(times).astype(float, copy=False)
    series = np.repeat(np.arange(len(times)), lengths)
    bins = np.searchsorted(edges, flat, side="left")
    last = np.append((series[1:] != series[:-1]) | (bins[1:] != bins[:-1]), True) & (bins < len(edges))
    at[series[last], bins[last]] = np.flatnonzero(last)
    np.maximum.accumulate(at, axis=1, out=at)   # a series' indices grow with its time
    return np.where((at >= 0) & (edges - flat[np.maximum(at, 0)] <= stale_s), at, -1)


def held(series, edges: np.ndarray, stale_s: float) -> np.ndarray:
    """(len(series), len(edges)): at each edge, each (t, v) series' latest
    value at or before it, NaN when none is within ``stale_s``."""
    values = np.concatenate([*(np.asarray(v, dtype=float) for _, v in series), [np.nan]])
    return values[latest_at([t for t, _ in series], edges, stale_s)]


def across(matrix: np.ndarray, *hows: str) -> np.ndarray | list[np.ndarray]:
    """Per column of ``matrix``: 'sum', 'mean', 'min', 'median' or 'max' of its
    known values; NaN where it has none. Several ``hows``: a list, in order."""
    known = (~np.isnan(matrix)).sum(axis=0)
    out = []
    with np.errstate(all="ignore"):
        for how in hows:
            if how in ("sum", "mean"):
                total = np.where(np.isnan(matrix), 0.0, matrix).sum(axis=0)
                out.append(total / known if how == "mean" else total)
            elif how in ("min", "max"):   # fmin and fmax skip NaN
                out.append((np.fmin if how == "min" else np.fmax).reduce(matrix, axis=0) if len(matrix)
                           else known * np.nan)
            else:
                out.append(_median(matrix, known))
    out = [np.where(known > 0, o, np.nan) for o in out]
    return out if len(hows) > 1 else out[0]


def _median(matrix: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Each column's median of its ``known`` values (NaN sorts last: they lead
    it). The columns where every row is known, nearly all of them once the
    window is full, are partitioned, the others sorted."""
    out = np.full(matrix.shape[1], np.nan)
    full = known == len(matrix)
    if len(matrix) and full.any():
        middle = [(len(matrix) - 1) // 2, len(matrix) // 2]
        ordered = np.partition(matrix[:, full], middle, axis=0)
        out[full] = (ordered[middle[0]] + ordered[middle[1]]) / 2
    if not full.all():
        part, count = np.sort(matrix[:, ~full], axis=0), known[~full]
        cols = np.arange(part.shape[1])
        out[~full] = (part[np.maximum(count - 1, 0) // 2, cols] + part[count // 2, cols]) / 2
    return out


def notes(collector, feeds, most: int = 3) -> list[str]:
    """What degrades the figures, in words: the hosts whose machine figures
    nobody reports, and why (the first ``most``); events on the topic that
    were ignored."""
    covered = {f.host for f in feeds if f.state == "live" and f.about.get("machine")}
    problems: dict[str, str] = {}
    for f in feeds:
        if f.state == "live" and f.host not in covered and f.about.get("machine_problem"):
            problems.setdefault(f.host, f.about["machine_problem"])
    said = [f"no machine figures on {host}: {why}" for host, why in list(problems.items())[:most]]
    if len(problems) > most:
        said.append(f"nor on {len(problems) - most} more host(s)")
    if collector.unread or collector.errors:
        said.append(f"{collector.unread + collector.errors} event(s) on the topic ignored, "
                    f"the last: {collector.reason or collector.last_error}")
    return said


class ClusterView(LiveView):
    """Live view of a :class:`~nbmon.dask.client.Watch`. Display it (its
    record, into which the front end mounts the chart) and its
    :meth:`picture`; the refresher starts at once (``start=False`` to drive
    :meth:`refresh` by hand) and ends by itself, after a last frame, once
    the watch stops."""

    THREAD_NAME = THREAD_NAME
    MAX_HZ = 4.0

    def __init__(self, watch, window_s: float = DEFAULT_WINDOW_S, refresh_hz: float = 4.0, *, start: bool = True):
        super().__init__(window_s, refresh_hz)
        self.watch, self.collector = watch, watch.collector
        self._seq = -1
        self._sent_at = -math.inf       # monotonic time of the last frame
        self._totals_at = -math.inf     # ... and of the last totals' grid
        self._joined: dict[str, int] = {}   # worker address -> its colour's index, in order of joining
        self._sent: dict[str, int] = {}     # worker address -> the store's seq sent
        self._gone: tuple = ()              # the workers marked as gone
        self._latest: dict[str, float] = {}   # the totals' newest values, by row headline
        self._memory_now = 0.0              # the largest memory of a worker, as of the last grid
        known = [f for f in self.collector.workers() if f.decoder is not None]   # headers are enough
        columns = {c for f in known for c in f.decoder.columns}
        self.rows = [row for row in ROWS if row.headline in columns or row.key in ("cpu", "memory")]
        self._metrics = [catalog.BY_NAME[row.headline] for row in self.rows]
        self._traced = [shown_column(row.headline) for row in self.rows]   # a worker's trace in each row
        self._drawn_by: dict[int, tuple] = {}   # id(decoder) -> (decoder, what _grid reads of its workers)
        self._read: dict[str, tuple] = {}       # worker -> (its store, seq read to, t, {column: values}) for _grid
        self.compact = len(known) >= COMPACT_AT
        self._build()
        if start:
            self.start()

    def _feeds(self) -> list:
        """The workers that sent a batch, in order of joining."""
        return [f for f in self.collector.workers() if f.decoder is not None and f.store is not None and len(f.store)]

    # -- the figure and its streams -----------------------------------------------
    def _build(self) -> None:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        n = len(self.rows)
        # The hosts' memory, on its own axis: it would squash the workers' total.
        specs = [[{}] * n, [{"secondary_y": row.key == "memory"} for row in self.rows]]
        # Each axis says what it shows (a column title would sit where the front end puts the legend).
        fig = make_subplots(rows=2, cols=n, shared_xaxes=True, specs=specs, horizontal_spacing=0.3 / n,
                            vertical_spacing=0.12)
        self._fixed = []   # streams of the figure's own traces: the totals, the hosts' memory
        for c, row in enumerate(self.rows, start=1):
            fig.add_trace(go.Scatter(x=_EMPTY, y=_EMPTY, mode="lines", name="cluster total", legendgroup="total",
                                     showlegend=c == 1, line={"width": 2, "color": "#7f7f7f"},
                                     hovertemplate="%{text}<extra>cluster total</extra>"), row=2, col=c)
            self._fixed.append({"id": f"total {row.key}", "unit": catalog.unit_of(row.headline),
                                "index": len(fig.data) - 1})
            if row.key == "memory":
                fig.add_trace(go.Scatter(x=_EMPTY, y=_EMPTY, mode="lines", name="hosts' memory used",
                                         line={"width": 1, "dash": "dot", "color": "#8c8c8c"},
                                         hovertemplate="%{text}<extra>hosts' memory used</extra>"),
                              row=2, col=c, secondary_y=True)
                self._fixed.append({"id": "hosts", "unit": catalog.unit_of("sys_mem_used_mb"),
                                    "index": len(fig.data) - 1})
                fig.update_yaxes(title_text="hosts MiB", rangemode="tozero", showgrid=False, row=2, col=c,
                                 secondary_y=True)
            for r, whose in ((1, "each worker"), (2, "the cluster")):
                fig.update_yaxes(rangemode="tozero", title_text=f"{row.short} {catalog.unit_of(row.headline)}, {whose}",
                                 title_font={"size": 11}, row=r, col=c, secondary_y=False)
        fig.update_xaxes(matches="x", hoverformat=".1f")
        fig.update_xaxes(title_text="seconds since the watch started", row=2)
        fig.update_layout(height=HEIGHT_PX, template=live.TEMPLATE, hovermode="closest", uirevision="nbmon",
                          margin={"l": 60, "r": 60, "t": 80, "b": BOTTOM_PX}, legend=self._legend(),
                          title={"text": "waiting for the workers…", "x": 0.01, "font": {"size": 14}})
        self._axes = [live.subplot_refs(fig, 1, c) for c in range(1, n + 1)]
        self._layout_base = {"height": HEIGHT_PX, "margin": dict(fig.layout.margin.to_plotly_json())}
        feeds = self._feeds()
        for f in feeds:
            self._joined.setdefault(f.address, len(self._joined))
        period = max([self.watch.every_s] + [f.about.get("period_s", 0.0) for f in feeds])
        self._make_widget(fig, streams=self._streams(feeds), layout=self._layout(feeds, 0.0),
                          stale_s=max(5.0, KEEPALIVE_S + 3 * period))

    def _legend(self, workers: int = 0) -> dict:
        title = {"text": f"compact view ({workers} workers ≥ {COMPACT_AT})"} if self.compact else {"text": ""}
        return {"orientation": "h", "x": 0.0, "xanchor": "left", "font": {"size": 10}, "title": title}

    def _trace(self, col: int, name: str, hover: str, **style) -> dict:
        """A trace the front end adds, in column ``col`` of the workers' row."""
        xref, yref = self._axes[col]
        return {"type": "scatter", "xaxis": xref, "yaxis": yref, "name": name,
                "hovertemplate": f"%{{text}}<extra>{html.escape(hover)}</extra>", **style}

    def _streams(self, feeds) -> list[dict]:
        """Every stream now: the figure's, then a trace per row for each
        worker and the "left" markers, or the compact view's bands."""
        streams = list(self._fixed)
        if self.compact:
            band = {"min": {"line": {"width": 0, "color": PALETTE[0]}, "showlegend": False},
                    "max": {"line": {"width": 0, "color": PALETTE[0]}, "fill": "tonexty",
                            "fillcolor": "rgba(31, 119, 180, 0.25)", "name": "lowest–highest worker"},
                    "median": {"line": {"width": 1.6, "color": PALETTE[0]}, "name": "median worker"}}
            for c, row in enumerate(self.rows):
                for stat in BANDS:
                    style = {"mode": "lines", "legendgroup": stat, **band[stat]}
                    style["showlegend"] = c == 0 and stat != "min"
                    name = style.pop("name", stat)
                    streams.append({"id": f"{stat} {row.key}", "unit": catalog.unit_of(row.headline),
                                    "trace": self._trace(c, name, f"{stat} of the workers", **style)})
            return streams
        by_address = {f.address: f for f in feeds}
        for address, k in sorted(self._joined.items(), key=lambda item: item[1]):
            feed = by_address.get(address)
            if feed is None:
                continue
            name = _label(feed) + ("" if feed.state == "live" else " (left)")
            for c, row in enumerate(self.rows):
                streams.append({"id": f"{address} {row.key}", "unit": catalog.unit_of(row.headline),
                                "trace": self._trace(c, name, f"{_label(feed)} · {feed.host}", mode="lines",
                                                     legendgroup=address, showlegend=c == 0,
                                                     line={"width": 1.2, "color": PALETTE[k % len(PALETTE)]})})
        for c, row in enumerate(self.rows):
            streams.append({"id": f"gone {row.key}", "unit": catalog.unit_of(row.headline),
                            "trace": self._trace(c, "left the cluster", "left the cluster", mode="markers",
                                                 legendgroup="gone", showlegend=c == 0,
                                                 marker={"symbol": "x", "size": 9, "color": "#7f7f7f"})})
        return streams

    def _layout(self, feeds, memory_now: float) -> dict:
        """The layout's patch: the threshold lines the workers' memory
        (``memory_now``: the largest now) has come within LINE_FROM of, the
        notes below the chart, the legend."""
        said = notes(self.collector, feeds)
        margin = {**self._layout_base["margin"], "b": BOTTOM_PX + (NOTE_PX * len(said) + 8 if said else 0)}
        return {"shapes": self._threshold_lines(feeds, memory_now),
                "annotations": [{"text": html.escape(line, quote=False), "xref": "paper", "yref": "paper", "x": 0, "y": 0,
                                 "xanchor": "left", "yanchor": "top", "yshift": -(BOTTOM_PX + NOTE_PX * k),
                                 "showarrow": False, "font": {"size": 11, "color": LIMIT_COLOR}}
                                for k, line in enumerate(said)],
                "margin": margin, "height": self._layout_base["height"] + margin["b"] - BOTTOM_PX,
                "legend": self._legend(len(feeds))}

    def _threshold_lines(self, feeds, memory_now: float) -> list[dict]:
        keys = [row.key for row in self.rows]
        if "memory" not in keys:
            return []
        xref, yref = self._axes[keys.index("memory")]
        # Each distinct setting once, not each worker's: a thousand workers share a few.
        settings = {(f.about.get("limit_mb"), f.about.get("spill"), f.about.get("pause"))
                    for f in feeds if f.state == "live"}
        wanted: dict[tuple[str, float, float], None] = {}   # (kind, its fraction of the limit, MiB)
        for limit, *fractions in settings:
            if not limit:
                continue
            wanted[("memory limit", 1.0, round(limit, 1))] = None
            for name, fraction in zip(("spill", "pause"), fractions):
                if fraction:
                    wanted[(name, fraction, round(limit * fraction, 1))] = None
        shown = sorted(("memory limit" if name == "memory limit" else f"{name} {fmt(fraction * 100, '%')}", value)
                       for name, fraction, value in wanted if memory_now >= LINE_FROM * value)[:MOST_LINES]
        return [{"type": "line", "xref": f"{xref} domain", "x0": 0, "x1": 1, "yref": yref, "y0": value, "y1": value,
                 "line": {"width": 1, "dash": "dot", "color": LIMIT_COLOR},
                 "label": {"text": f"{name} {fmt(value, 'MiB')}", "textposition": "end", "font": {"size": 9}}}
                for name, value in shown]

    # -- frames ------------------------------------------------------------------
    def _frame(self, force: bool) -> Frame | None:
        seq, now_s = self.collector.seq, time.monotonic()
        if not force and seq == self._seq and (not self.watch.running or now_s - self._sent_at < KEEPALIVE_S):
            return None
        feeds = self._feeds()
        groups: list[Group] = []
        if feeds:
            if not self.compact and len(feeds) >= COMPACT_AT:
                self.compact = True   # for good
            for f in feeds:
                self._joined.setdefault(f.address, len(self._joined))
            now = max([time.time() - self.collector.t0] + [f.t_last for f in feeds])
            period = max([self.watch.every_s] + [f.about.get("period_s", 0.0) for f in feeds])
            streams = self._streams(feeds)
            if force or streams != self.widget._nbmon.get("streams") \
                    or seq != self._seq and now_s - self._totals_at >= TOTALS_EVERY_S:
                # The axis fits the data until the window is full.
                lo = max(now - self.window_s, min(f.store.t_start for f in feeds) - period)
                grid, self._memory_now = self._grid(feeds, np.linspace(lo, now, GRID_POINTS),
                                                    STALE_PERIODS * period)
                groups.append(grid)
                self._totals_at = now_s
            self._declare(streams=streams, layout=self._layout(feeds, self._memory_now))
            if not self.compact:
                groups += self._left(feeds, force)
                groups += self._workers(feeds, force, MAX_FRAME_BYTES - sum(g.bytes for g in groups))
        self._seq, self._sent_at = seq, now_s
        return Frame(self._title(feeds, stopped=self.frozen), groups)

    def _drawn(self, decoder) -> tuple[list[str], dict[str, list[tuple[int, str]]]]:
        """What the grid reads of a worker with ``decoder``'s columns: the
        store columns drawn, and per GPU row its (device, column) pairs.
        Kept per decoder (the workers of a process share one)."""
        kept = self._drawn_by.get(id(decoder))
        if kept is None or kept[0] is not decoder:
            present = set(decoder.store_columns)
            columns = [c for c in (*self._traced, HOSTS_COLUMN) if c in present]
            devices: dict[str, list[tuple[int, str]]] = {}
            for c in decoder.columns:
                device = catalog.split_device_column(c)
                for row, metric in zip(self.rows, self._metrics):
                    if device and metric.source == catalog.GPU and device[1] == metric.of:
                        devices.setdefault(row.key, []).append((device[0], shown_column(c)))
                        columns.append(shown_column(c))
            kept = self._drawn_by[id(decoder)] = (decoder, columns, devices)
        return kept[1], kept[2]

    def _recent(self, feed, columns: list[str], t_from: float) -> tuple[np.ndarray, dict]:
        """(t, {column: values}) of ``feed``'s ``columns`` from ``t_from`` on:
        read from its store once, then only the rows it gained since."""
        store, kept = feed.store, self._read.get(feed.address)
        if kept is not None and kept[0] is store and kept[1] != store.seq:
            t_new, _wall, rows, seq, lost = store.rows_since(kept[1])
            kept = None if lost else (store, seq, np.concatenate([kept[2], t_new]),
                                      {c: np.concatenate([v, rows[store.columns.index(c)]]) for c, v in kept[3].items()})
        if kept is None or kept[0] is not store:
            seq = store.seq   # before reading: a row appended meanwhile comes twice, never not at all
            t, _wall, values = store.series(columns, t_from=t_from)
            kept = (store, seq, t, values)
        cut = int(np.searchsorted(kept[2], t_from))
        if cut:
            kept = (store, kept[1], kept[2][cut:], {c: v[cut:] for c, v in kept[3].items()})
        self._read[feed.address] = kept
        return kept[2], kept[3]

    def _grid(self, feeds, edges, stale_s: float) -> tuple[Group, float]:
        """The cluster's totals (and the compact view's bands) at each of
        ``edges``: each worker's latest value, held for at most ``stale_s``.
        Each worker's store is read once, for the columns drawn; every
        worker is looked up at every edge in one search. Also returns the
        largest memory of a worker now."""
        t_from = edges[0] - stale_s
        devices: dict[str, dict] = {}   # row key -> {(host, device index): (worker's index, column)}
        times, reads = [], []
        for i, f in enumerate(feeds):
            columns, drawn = self._drawn(f.decoder)
            t, values = self._recent(f, columns, t_from)
            times.append(t)
            reads.append(values)
            for key, pairs in drawn.items():
                for device, column in pairs:   # each device once, however many workers may use it
                    devices.setdefault(key, {}).setdefault((f.host, device), (i, column))
        # Edges by workers, so that each edge's workers lie together: a
        # statistic across workers (a sort for the median) reads them in a row.
        if len(self._read) > len(feeds):   # workers the collector let go (MAX_WORKERS)
            self._read = {f.address: self._read[f.address] for f in feeds if f.address in self._read}
        at = np.ascontiguousarray(latest_at(times, edges, stale_s).T)
        flat: dict[str, np.ndarray] = {}

        def column(c: str) -> np.ndarray:
            """``c`` of every worker, laid out as ``at`` counts (NaN where a
            worker has none), and a NaN last for -1."""
            if c not in flat:
                flat[c] = np.concatenate([*(r[c] if c in r else np.full(len(t), np.nan)
                                            for t, r in zip(times, reads)), [np.nan]])
            return flat[c]

        def having(c: str) -> np.ndarray:
            """(workers that have ``c``, edges): their value at each edge."""
            return column(c)[at[:, [i for i, r in enumerate(reads) if c in r]]].T

        ids, ys, memory_now = [], [], 0.0
        for row, metric, shown in zip(self.rows, self._metrics, self._traced):
            workers = having(shown)
            pairs = list(devices.get(row.key, {}).values())
            total = across(np.array([column(c)[at[:, i]] for i, c in pairs]).reshape(len(pairs), len(edges)),
                           metric.total) if metric.source == catalog.GPU else across(workers, "sum")
            ids.append(f"total {row.key}")
            ys.append(total)
            known = total[~np.isnan(total)]
            self._latest[row.headline] = float(known[-1]) if known.size else math.nan
            if row.key == "memory":
                memory_now = float(np.nanmax(workers[:, -1], initial=0.0)) if workers.size else 0.0
                ids.append("hosts")
                ys.append(across(having(HOSTS_COLUMN), "sum"))
            if self.compact:
                ids += [f"{stat} {row.key}" for stat in BANDS]
                ys += across(workers, *BANDS)
        return Group(ids, edges, ys, replace=True), memory_now

    def _workers(self, feeds, force: bool, room: int) -> list[Group]:
        """Each worker's batches since the last frame; a worker's first
        frame (and a forced one) holds its whole window, in what is left of
        ``room`` bytes however many workers there are."""
        columns = [shown_column(row.headline) for row in self.rows]
        new = [f for f in feeds if force or f.address not in self._sent]
        groups = []
        for f in feeds:
            if f not in new and self._sent[f.address] != f.store.seq:
                t, _wall, rows, _seq, _lost = f.store.rows_since(self._sent[f.address])
                index = [f.store.columns.index(c) if c in f.store.columns else None for c in columns]
                groups.append(Group([f"{f.address} {row.key}" for row in self.rows], t,
                                    [rows[j] if j is not None else np.full(t.shape, np.nan) for j in index]))
            self._sent[f.address] = f.store.seq
        room -= sum(g.bytes for g in groups)
        # A point: its x (float64, decimated columns each their own) and its y (float32).
        budget = min(DEFAULT_BUDGET, max(2, room // (12 * len(columns) * max(1, len(new))) // 2 * 2))
        for f in new:
            frame = build_frame(f.store, columns, self.window_s, budget, origin=0.0, max_bytes=12 * budget * len(columns))
            by_x: dict[int, Group] = {}
            for column, row in zip(columns, self.rows):
                x, y = frame.get(column, (_EMPTY, _EMPTY))
                group = by_x.setdefault(id(x), Group([], x, [], replace=True))
                group.ids.append(f"{f.address} {row.key}")
                group.ys.append(y)
            groups += by_x.values()
        return groups

    def _left(self, feeds, force: bool) -> list[Group]:
        """A marker at the last batch of each worker that left (when that changes)."""
        gone = tuple(sorted((f.store.latest()["t"], f.address) for f in feeds if f.state == "gone"))
        if gone == self._gone and not force:
            return []
        self._gone = gone
        by_address = {f.address: f for f in feeds}
        ends = [by_address[address].store.latest() for _, address in gone]
        return [Group([f"gone {row.key}" for row in self.rows], np.array([t for t, _ in gone], dtype=np.float64),
                      [np.array([end.get(shown_column(row.headline), math.nan) for end in ends], dtype=np.float32)
                       for row in self.rows], replace=True)]

    def _title(self, feeds, stopped: bool = False) -> str:
        live_now = sum(f.state == "live" for f in feeds)
        gone = len(feeds) - live_now
        if not feeds:
            return "waiting for the workers…"
        parts = [f"Dask cluster · {live_now} worker{'s' if live_now != 1 else ''}" + (f" · {gone} left" if gone else ""),
                 headline(self._latest)]
        return " · ".join(p for p in parts if p) + (" · stopped" if stopped else "")

    # -- what LiveView asks --------------------------------------------------------
    def _samples(self) -> int:
        return self.collector.seq

    def _source_running(self) -> bool:
        return self.watch.running

    def _make_record(self, live_id: str, state: str) -> Record:
        """Per worker its figures over the watch (its batches' summary), the
        notes on what degrades them, and a timeline of the cluster's totals."""
        feeds = self._feeds()
        workers = [(_label(f) + ("" if f.state == "live" else " (left)"), f.host, f.summary()) for f in feeds]
        title = f"Dask cluster · {len(feeds)} workers"
        said = notes(self.collector, feeds)
        body = workers_table(f"nbmon · {title}", workers) + "".join(
            f'<div style="color:{LIMIT_COLOR};font:11px system-ui,sans-serif">{html.escape(line)}</div>'
            for line in said)
        ends = [f.store.latest().get("wall", math.nan) for f in feeds]
        end_time = max((w for w in ends if w == w), default=None)
        tail = live.record_tail(state, end_time)
        figures = self._title(feeds)
        text = "\n".join([f"nbmon · {figures} · {tail}", workers_text(title, workers), *said])
        return Record(live.record_html(figures, tail, body, live_id, cls="nbmon-cluster-record"), text,
                      self._timeline(feeds))

    def _timeline(self, feeds):
        """The cluster's totals over the whole watch, a strip per row."""
        if not feeds:
            return None
        edges = np.linspace(0.0, max(f.t_last for f in feeds), GRID_POINTS)
        colors = row_colors([row.headline for row in self.rows])
        strips = []
        for row in self.rows:
            column = shown_column(row.headline)
            series = [f.store.series([column]) for f in feeds if column in f.store.columns]
            if series:
                matrix = held([(t, values[column]) for t, _, values in series], edges, math.inf)
                strips.append((row, across(matrix, catalog.BY_NAME[row.headline].total or "sum"), math.nan,
                               colors.get(row.key)))
        return timeline(edges, strips)
