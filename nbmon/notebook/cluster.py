"""Charts of many processes at once: the live view of a watched Dask
cluster (:class:`ClusterView`), and the offline report of a distributed
job's ranks (:func:`write_ranks_html`).

The cluster view is one plotly FigureWidget: a column per chart row of
:data:`~nbmon.notebook.charts.ROWS` that the workers have (CPU, RSS, GPU
utilisation and memory), the workers on top and the cluster's total below.
A worker's trace is its batches' mean (CPU, GPU utilisation) or maximum
(memory: :func:`~nbmon.dask.wire.shown_column`); the memory column has
each distinct memory limit and Dask spill/pause threshold as a line once a
worker comes within half of it. From :data:`COMPACT_AT` workers on, the
top row is compact: the band from the lowest to the highest worker and the
median line (the legend says so). x is seconds since the watch started.

A refresher thread (``nbmon-cluster``) redraws at most ``refresh_hz``
times a second and only when something arrived; the arrays of a frame stay
within :data:`~nbmon.notebook.frames.MAX_FRAME_BYTES` whatever the number
of workers (fewer points per trace as workers join). A worker that leaves
keeps its trace, ended by a marker; nothing a worker does raises here:
errors are counted in ``errors``.
"""
from __future__ import annotations

import html
import math
import threading
import time

import numpy as np

from .. import catalog, files
from ..dask.wire import shown_column
from ..format import fmt
from ..options import DEFAULT_WINDOW_S
from ..render import FG, MUTED, svg_timeline
from .charts import PALETTE, ROWS
from .frames import DEFAULT_BUDGET, MAX_FRAME_BYTES, build_frame, frame_bytes, minmax_indices

THREAD_NAME = "nbmon-cluster"
COMPACT_AT = 64          # workers from which the top row shows bands, not a trace per worker
GRID_POINTS = 300        # points of a total or band trace
BANDS = ("min", "max", "median")   # the compact view's traces per row, in drawing order
STALE_PERIODS = 3        # a worker's last batch stands for it this many periods, then it is a gap
LINE_FROM = 0.5          # a memory threshold is drawn once a worker's RSS reaches this share of it
TOP_MARGIN, NOTE_PX = 80, 16   # px above the charts: the title, and each line of notes (what degrades them)
_EMPTY = np.empty(0, dtype=np.float32)


_widget_classes: list = []


def _widget(fig):
    """A FigureWidget of ``fig`` whose comm opens with the figure in it.
    plotly opens the comm with an empty figure and sends the figure in a
    second message; a front end that draws the view between the two shows
    an empty chart for good (seen in JupyterLab, now and then)."""
    if not _widget_classes:
        import plotly.graph_objects as go
        import traitlets

        class FigureWidget(go.FigureWidget):
            def __init__(self, figure):
                self._nbmon_first = figure.to_plotly_json()
                super().__init__(figure)

            @traitlets.default("_widget_data")
            def _first_data(self):
                return self._nbmon_first["data"]

            @traitlets.default("_widget_layout")
            def _first_layout(self):
                return self._nbmon_first["layout"]

        _widget_classes.append(FigureWidget)
    return _widget_classes[0](fig)


def _title(row) -> str:
    return f"{row.short} {catalog.unit_of(row.headline)}"


def _label(feed) -> str:
    return feed.name if feed.name != feed.address else feed.address.rsplit("/", 1)[-1]


def held(series, edges: np.ndarray, stale_s: float) -> np.ndarray:
    """(len(series), len(edges)): at each edge, each (t, v) series' latest
    value at or before it, NaN when none is within ``stale_s``."""
    out = np.full((len(series), len(edges)), np.nan)
    for i, (t, v) in enumerate(series):
        idx = np.searchsorted(t, edges, side="right") - 1
        ok = idx >= 0
        j = idx[ok]
        values = v[j].astype(float)
        values[edges[ok] - t[j] > stale_s] = np.nan
        out[i, ok] = values
    return out


def across(matrix: np.ndarray, how: str) -> np.ndarray:
    """Per column of ``matrix``: 'sum', 'mean', 'min', 'median' or 'max' of its
    known values; NaN where it has none."""
    known = (~np.isnan(matrix)).sum(axis=0)
    cols = np.arange(matrix.shape[1])
    with np.errstate(all="ignore"):
        if how in ("sum", "mean"):
            total = np.where(np.isnan(matrix), 0.0, matrix).sum(axis=0)
            out = total / known if how == "mean" else total
        else:   # NaN sorts last: a column's known values lead it
            ordered = np.sort(matrix, axis=0)
            last = np.maximum(known - 1, 0)
            if how == "min":
                out = ordered[0]
            elif how == "max":
                out = ordered[last, cols]
            else:
                out = (ordered[last // 2, cols] + ordered[known // 2, cols]) / 2
    return np.where(known > 0, out, np.nan)


class ClusterView:
    """Live plotly view of a :class:`~nbmon.dask.client.Watch`; ``widget`` is
    the FigureWidget. The refresher starts at once (``start=False`` to drive
    :meth:`refresh` by hand) and ends by itself, after a last frame, once
    the watch stops."""

    def __init__(self, watch, window_s: float = DEFAULT_WINDOW_S, refresh_hz: float = 4.0, *, start: bool = True):
        for name, value in (("window_s", window_s), ("refresh_hz", refresh_hz)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite positive number, got {value!r}")
        if refresh_hz > 4.0:
            raise ValueError(f"refresh_hz must be at most 4, got {refresh_hz!r}")
        self.watch, self.collector = watch, watch.collector
        self.window_s, self.refresh_hz = float(window_s), float(refresh_hz)
        self.refreshes = self.skipped = self.errors = 0
        self.last_error: str | None = None
        self.last_frame_bytes = 0
        self.frozen = False
        self._lock = threading.RLock()
        self._seq = -1
        self._drawn: dict[str, int] = {}          # worker -> store.seq last drawn
        self._worker_traces: dict[str, list] = {}
        self._lines: tuple = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        known = [f for f in self.collector.workers() if f.decoder is not None]
        columns = {c for f in known for c in f.decoder.columns}
        self.rows = [row for row in ROWS if row.headline in columns or row.key in ("cpu", "memory")]
        # What is known now is in the widget's first state: traces added before
        # the front end has drawn it can be lost there.
        self.compact = len(known) >= COMPACT_AT
        fig = self._figure()
        if self.compact:
            self._add_bands(fig, len(known))
        else:
            for k, feed in enumerate(known):
                self._add_worker(fig, feed, PALETTE[k % len(PALETTE)])
        self.widget = _widget(fig)
        self._index(known)
        if start:
            self.start()

    # -- figure ------------------------------------------------------------------
    def _figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        n = len(self.rows)
        # The hosts' memory, on its own axis: it would squash the workers' total.
        specs = [[{}] * n, [{"secondary_y": row.key == "memory"} for row in self.rows]]
        fig = make_subplots(rows=2, cols=n, shared_xaxes=True, row_titles=("workers", "cluster"),
                            column_titles=[_title(row) for row in self.rows], specs=specs,
                            horizontal_spacing=0.3 / n, vertical_spacing=0.12)
        for c, row in enumerate(self.rows, start=1):
            unit = catalog.unit_of(row.headline)
            fig.add_trace(go.Scatter(x=_EMPTY, y=_EMPTY, mode="lines", name="cluster total",
                                     legendgroup="total", showlegend=c == 1, line={"width": 2, "color": "#222"},
                                     hovertemplate=f"%{{y:.1f}} {unit}<extra>cluster total</extra>"),
                          row=2, col=c)
            if row.key == "memory":
                fig.add_trace(go.Scatter(x=_EMPTY, y=_EMPTY, mode="lines", name="hosts' memory used",
                                         line={"width": 1, "dash": "dot", "color": "#8c8c8c"},
                                         hovertemplate="%{y:.1f} MiB<extra>hosts' memory used</extra>"),
                              row=2, col=c, secondary_y=True)
                fig.update_yaxes(title_text="hosts MiB", rangemode="tozero", showgrid=False, row=2, col=c,
                                 secondary_y=True)
            if not self.compact:
                fig.add_trace(go.Scatter(x=[], y=[], mode="markers", name="left the cluster", legendgroup="gone",
                                         showlegend=c == 1, marker={"symbol": "x", "size": 9, "color": "#444"},
                                         hovertemplate=f"%{{y:.1f}} {unit}<extra>%{{text}} left</extra>"),
                              row=1, col=c)
            fig.update_yaxes(rangemode="tozero", row=1, col=c)
            fig.update_yaxes(rangemode="tozero", row=2, col=c)
        fig.update_xaxes(matches="x")   # one range to set per frame
        fig.update_xaxes(title_text="seconds since the watch started", row=2)
        fig.update_layout(height=560, template="plotly_white", hovermode="closest", uirevision="nbmon",
                          margin={"l": 50, "r": 30, "t": TOP_MARGIN, "b": 40}, legend={"font": {"size": 10}},
                          title={"text": "waiting for the workers…", "x": 0.01, "font": {"size": 14}})
        return fig

    def _index(self, known) -> None:
        """Keep the widget's trace objects, in the order __init__ made them:
        _figure's, then the bands or a trace per row for each ``known`` worker."""
        self._totals, self._machines, self._gone, self._bands = [], None, [], []
        data = list(self.widget.data)
        for c, row in enumerate(self.rows):
            self._totals.append(data.pop(0))
            if row.key == "memory":
                self._machines = data.pop(0)
            if not self.compact:
                self._gone.append(data.pop(0))
        if self.compact:
            self._bands = [[(stat, data.pop(0)) for stat in BANDS] for _ in self.rows]
        for feed in [] if self.compact else known:
            self._worker_traces[feed.address] = [data.pop(0) for _ in self.rows]

    def _subplot_refs(self, row_number: int, col: int) -> tuple[str, str]:
        sub = self.widget.get_subplot(row_number, col)
        return "x" + sub.xaxis.plotly_name[5:], "y" + sub.yaxis.plotly_name[5:]

    def _add_worker(self, fig, feed, color: str) -> list:
        """Add ``feed``'s traces (one per row) to ``fig``; returns fig's new traces."""
        import plotly.graph_objects as go

        for c, row in enumerate(self.rows, start=1):
            unit = catalog.unit_of(row.headline)
            fig.add_trace(go.Scatter(
                x=_EMPTY, y=_EMPTY, mode="lines", name=_label(feed), legendgroup=feed.address,
                showlegend=c == 1, line={"width": 1.2, "color": color},
                hovertemplate=f"%{{y:.1f}} {unit}<extra>{html.escape(_label(feed))} · "
                              f"{html.escape(feed.host)}</extra>"), row=1, col=c)
        return list(fig.data[-len(self.rows):])

    def _add_bands(self, fig, workers: int) -> list:
        """Add the compact view's traces to ``fig``: per row, the lowest,
        highest (filled between) and median worker; returns them per row."""
        import plotly.graph_objects as go

        style = {"min": {"line": {"width": 0, "color": "#1f77b4"}},
                 "max": {"line": {"width": 0, "color": "#1f77b4"}, "fill": "tonexty",
                         "fillcolor": "rgba(31, 119, 180, 0.25)", "name": "lowest–highest worker"},
                 "median": {"line": {"width": 1.6, "color": "#1f77b4"}, "name": "median worker"}}
        bands = []
        for c, row in enumerate(self.rows, start=1):
            unit = catalog.unit_of(row.headline)
            for stat in BANDS:
                fig.add_trace(go.Scatter(
                    x=_EMPTY, y=_EMPTY, mode="lines", showlegend=c == 1 and stat != "min", legendgroup=stat,
                    hovertemplate=f"%{{y:.1f}} {unit}<extra>{stat} of the workers</extra>", **style[stat]),
                    row=1, col=c)
            bands.append(list(zip(BANDS, fig.data[-len(BANDS):])))
        fig.update_layout(legend_title_text=f"compact view ({workers} workers ≥ {COMPACT_AT})")
        return bands

    def _go_compact(self, workers: int) -> None:
        """Bands instead of a trace per worker, from COMPACT_AT workers on (for good)."""
        dropped = {id(t) for traces in self._worker_traces.values() for t in traces} | {id(t) for t in self._gone}
        self.widget.data = [t for t in self.widget.data if id(t) not in dropped]
        self._worker_traces, self._gone = {}, []
        self.compact = True
        self._bands = self._add_bands(self.widget, workers)

    # -- refreshing --------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Draw what arrived since the last frame; False (nothing sent) when nothing did."""
        with self._lock:
            seq = self.collector.seq
            if not force and seq == self._seq:
                self.skipped += 1
                return False
            feeds = [f for f in self.collector.workers() if f.store is not None and len(f.store)]
            now = max([time.time() - self.collector.t0] + [f.store.latest()["t"] for f in feeds])
            period = max([self.watch.every_s] + [f.about.get("period_s", 0.0) for f in feeds])
            # The axis fits the data until the window is full.
            lo = max(now - self.window_s, min([f.store.t_start for f in feeds], default=now) - period)
            if not self.compact and len(feeds) >= COMPACT_AT:
                self._go_compact(len(feeds))
            edges = np.linspace(lo, now, GRID_POINTS)
            payload, rss_now = self._grid_payload(feeds, edges, STALE_PERIODS * period)
            if not self.compact:
                budget = (MAX_FRAME_BYTES - frame_bytes({i: p[1:] for i, p in enumerate(payload)})) \
                    // (8 * len(self.rows) * max(1, len(feeds)))
                payload += self._workers_payload(feeds, min(DEFAULT_BUDGET, max(2, budget // 2 * 2)), force)
            lines = self._threshold_lines(feeds, rss_now)
            with self.widget.batch_update():
                for trace, x, y in payload:
                    trace.x, trace.y = x, y
                if not self.compact:
                    self._mark_gone(feeds)
                if lines != self._lines:
                    self.widget.layout.shapes = [shape for _, shape in lines]
                    self._lines = lines
                self.widget.layout.xaxis.range = [lo, now]
                said = notes(self.collector, feeds)
                self.widget.layout.title.text = self._headline(feeds, payload) + "".join(
                    f"<br><span style='font-size:11px;color:#a33'>{html.escape(line)}</span>" for line in said)
                self.widget.layout.margin.t = TOP_MARGIN + NOTE_PX * len(said)   # a line each, above the charts
            self._seq = seq
            self.refreshes += 1
            self.last_frame_bytes = frame_bytes({i: p[1:] for i, p in enumerate(payload)})
            return True

    def _grid_payload(self, feeds, edges, stale_s: float) -> tuple[list, float]:
        """The cluster's totals and, in the compact view, the workers' bands:
        at each of ``edges``, each worker's latest value (sample and hold, for
        at most ``stale_s``).
        Each worker's store is read once, for the columns drawn. Also returns
        the largest RSS of a worker now."""
        t_from = edges[0] - stale_s
        x = edges.astype(np.float32)
        devices: dict[str, dict] = {}   # row key -> {(host, device index): (worker, column)}
        read = {}
        for f in feeds:
            wanted = [shown_column(row.headline) for row in self.rows] + [shown_column("sys_mem_used_mb")]
            for c in f.decoder.columns:
                device = catalog.split_device_column(c)
                for row in self.rows:
                    metric = catalog.BY_NAME[row.headline]
                    if device and metric.source == catalog.GPU and device[1] == metric.of:
                        # each device once, however many workers may use it
                        devices.setdefault(row.key, {}).setdefault((f.host, device[0]), (f.address, shown_column(c)))
                        wanted.append(shown_column(c))
            t, _wall, values = f.store.series([c for c in wanted if c in f.store.columns], t_from=t_from)
            read[f.address] = (t, values)

        def matrix(pairs):
            return held([(read[a][0], read[a][1][c]) for a, c in pairs if c in read[a][1]], edges, stale_s)

        payload, rss_now = [], 0.0
        for k, (row, trace) in enumerate(zip(self.rows, self._totals)):
            metric = catalog.BY_NAME[row.headline]
            workers = matrix([(f.address, shown_column(row.headline)) for f in feeds])
            total = across(matrix(devices.get(row.key, {}).values()), metric.total) \
                if metric.source == catalog.GPU else across(workers, "sum")
            payload.append((trace, x, total.astype(np.float32)))
            if row.key == "memory":
                rss_now = float(np.nanmax(workers[:, -1], initial=0.0))
            if row.key == "memory" and self._machines is not None:
                hosts = matrix([(f.address, shown_column("sys_mem_used_mb")) for f in feeds])
                payload.append((self._machines, x, across(hosts, "sum").astype(np.float32)))
            if self.compact:
                payload += [(band, x, across(workers, stat).astype(np.float32)) for stat, band in self._bands[k]]
        return payload, rss_now

    def _workers_payload(self, feeds, budget: int, force: bool) -> list:
        payload = []
        for feed in feeds:
            if feed.address not in self._worker_traces:
                color = PALETTE[len(self._worker_traces) % len(PALETTE)]
                self._worker_traces[feed.address] = self._add_worker(self.widget, feed, color)
            if not force and self._drawn.get(feed.address) == feed.store.seq:
                continue
            self._drawn[feed.address] = feed.store.seq
            columns = [shown_column(row.headline) for row in self.rows]
            frame = build_frame(feed.store, columns, self.window_s, budget,
                                max_bytes=8 * budget * len(columns), origin=0.0)
            for column, trace in zip(columns, self._worker_traces[feed.address]):
                x, y = frame.get(column, (_EMPTY, _EMPTY))
                payload.append((trace, x, y))
        return payload

    def _mark_gone(self, feeds) -> None:
        gone = [f for f in feeds if f.state == "gone"]
        for f in gone:
            traces = self._worker_traces.get(f.address, ())
            for trace in traces:
                if not trace.name.endswith(" (left)"):
                    trace.name = trace.name + " (left)"
        for row, marker in zip(self.rows, self._gone):
            column = shown_column(row.headline)
            ends = [(f.store.latest(), _label(f)) for f in gone]
            marker.x = [end["t"] for end, _ in ends]
            marker.y = [end.get(column, math.nan) for end, _ in ends]
            marker.text = [name for _, name in ends]

    def _threshold_lines(self, feeds, rss_now: float) -> tuple:
        """(key, shape) per distinct memory limit / spill / pause value of the
        live workers that the largest RSS now (``rss_now``) has reached LINE_FROM of."""
        if "memory" not in [row.key for row in self.rows]:
            return ()
        col = [row.key for row in self.rows].index("memory") + 1
        xref, yref = self._subplot_refs(1, col)
        wanted: dict[tuple[str, float], None] = {}
        for f in feeds:
            limit = f.about.get("limit_mb")
            if f.state != "live" or not limit:
                continue
            wanted[("memory limit", round(limit, 1))] = None
            for name in ("spill", "pause"):
                if f.about.get(name):
                    wanted[(f"{name} {fmt(f.about[name] * 100, '%')}", round(limit * f.about[name], 1))] = None
        shown = sorted(k for k in wanted if rss_now >= LINE_FROM * k[1])
        return tuple((key, {"type": "line", "xref": f"{xref} domain", "x0": 0, "x1": 1, "yref": yref,
                            "y0": key[1], "y1": key[1], "line": {"width": 1, "dash": "dot", "color": "#d62728"},
                            "label": {"text": f"{key[0]} {fmt(key[1], 'MiB')}", "textposition": "end",
                                      "font": {"size": 9}}})
                     for key in shown[:9])

    def _headline(self, feeds, payload) -> str:
        live = sum(f.state == "live" for f in feeds)
        gone = len(feeds) - live
        last = {}
        for row, trace in zip(self.rows, self._totals):
            y = next(y for tr, _, y in payload if tr is trace)
            known = y[~np.isnan(y)]
            last[row.key] = float(known[-1]) if known.size else math.nan
        parts = [f"Dask cluster · {live} worker{'s' if live != 1 else ''}"
                 + (f" · {gone} left" if gone else ""),
                 f"CPU {fmt(last.get('cpu'), '%')}", f"RSS {fmt(last.get('memory'), 'MiB')}"]
        if "gpu_util" in last:
            parts.append(f"GPU {fmt(last['gpu_util'], '%')}")
        text = " · ".join(parts)
        return text + " · stopped" if self.frozen else text

    # -- the refresher -----------------------------------------------------------
    def start(self) -> "ClusterView":
        """Start the refresher thread (a no-op while it runs)."""
        with self._lock:
            if not self.running:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,), name=THREAD_NAME,
                                                daemon=True)
                self._thread.start()
            return self

    def _refresh_counted(self, force: bool = False) -> None:
        try:
            self.refresh(force)
        except Exception as err:  # never die, never print: count it
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"

    def _run(self, stop: threading.Event) -> None:
        # A frame, then a whole period of rest: at most refresh_hz frames a second.
        while not stop.is_set():
            watching = self.watch.running
            self._refresh_counted()
            if not watching:   # the watch's last batches are drawn: done
                return
            stop.wait(1.0 / self.refresh_hz)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> bool:
        """Stop the refresher; True when it has ended within ``timeout``."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self.running

    def freeze(self, timeout: float = 1.0) -> str:
        """Stop refreshing, draw the last frame, return the static record."""
        self.stop(timeout)
        self.frozen = True
        self._refresh_counted(force=True)
        return self.static_html()

    def close(self) -> str:
        """Freeze, then close the widget's comm; returns the static record."""
        record = self.freeze()
        self.widget.close()
        return record

    def static_html(self) -> str:
        return cluster_record_html(self.collector, self.rows)

    def _repr_mimebundle_(self, **kwargs):
        with self._lock:
            return self.widget._repr_mimebundle_(**kwargs)


# -- static HTML -----------------------------------------------------------------------

def table_html(title: str, header: list[str], rows: list[list[str]], cls: str) -> str:
    """A small table of text, in nbmon's summary style."""
    cell = f"padding:1px 8px;text-align:right;color:{FG}"
    head = "".join(f'<th style="{cell};font-weight:normal;color:{MUTED}">{html.escape(h)}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{cell}">{html.escape(v)}</td>' for v in r) + "</tr>"
                   for r in rows)
    return (f'<div class="{cls}" style="display:inline-block;padding:4px 10px;color:{FG};'
            f'font:12px/1.4 system-ui,sans-serif;border-left:3px solid #2a7d2a">'
            f'<div style="font-weight:600;margin-bottom:2px">{html.escape(title)}</div>'
            f'<table style="border-collapse:collapse;background:transparent"><tr>{head}</tr>{body}</table></div>')


WORKER_HEADER = ["worker", "host", "peak RSS", "CPU mean", "CPU time", "GPU mem peak"]


def workers_cell_html(rows) -> str:
    """The per-worker table of one cell: ``rows`` as :func:`nbmon.dask.cell` makes them."""
    body = []
    for r in rows:
        s = r.summary
        body.append([r.worker, r.host, fmt(s.peak_rss_mb, "MiB") + (" (exact)" if s.peak_rss_exact else ""),
                     fmt(s.mean_cpu_percent, "%"), fmt(s.cpu_time_sec, "s"), fmt(s.peak_gpu_mem_mb, "MiB")]
                    if s.num_samples else [r.worker, r.host, "no answer", "", "", ""])
    return table_html("nbmon · the cell on each worker", WORKER_HEADER, body, "nbmon-workers")


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


def cluster_record_html(collector, rows=ROWS) -> str:
    """Static record of a watch: per worker its peak RSS, mean CPU, CPU time
    and GPU memory peak over the watch, and a timeline of the cluster's totals."""
    body, totals = [], {}
    feeds = [f for f in collector.workers() if f.store is not None and len(f.store)]
    for f in feeds:
        _, _, v = f.store.series()

        def peak(column):
            return np.nanmax(v[column]) if column in v and not np.isnan(v[column]).all() else math.nan

        cpu = v["proc_cpu_percent"]
        body.append([_label(f) + ("" if f.state == "live" else " (left)"), f.host,
                     fmt(peak("max_proc_rss_peak_mb"), "MiB"),
                     fmt(np.nanmean(cpu) if not np.isnan(cpu).all() else math.nan, "%"),
                     fmt(peak("proc_cpu_time_s"), "s"), fmt(peak("max_gpu_mem_used_mb"), "MiB")])
    if feeds:
        t_end = max(f.store.latest()["t"] for f in feeds)
        edges = np.linspace(0.0, t_end, GRID_POINTS)
        for row in rows:
            column = shown_column(row.headline)
            series = [f.store.series([column]) for f in feeds if column in f.store.columns]
            if series:
                matrix = held([(t, values[column]) for t, _, values in series], edges, math.inf)
                totals[f"cluster {row.short}"] = (across(matrix, catalog.BY_NAME[row.headline].total or "sum"),
                                                  catalog.unit_of(row.headline))
    timeline = svg_timeline(edges, totals) if feeds else ""
    said = "".join(f'<div style="color:#a33;font:11px system-ui,sans-serif">{html.escape(line)}</div>'
                   for line in notes(collector, feeds))
    return (f'<div class="nbmon-cluster-record">'
            f'{table_html(f"nbmon · Dask cluster · {len(feeds)} workers", WORKER_HEADER, body, "nbmon-workers")}'
            f'{said}{timeline}</div>')


# -- the ranks of a distributed job ---------------------------------------------------

def ranks_figure(frame, points_per_trace: int = 2000):
    """One timeline per chart row the ranks have, a trace per rank (x: the
    job's common ``elapsed_s``), each reduced to ``points_per_trace`` by
    min/max decimation."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [row for row in ROWS if row.headline in frame.columns and frame[row.headline].notna().any()]
    fig = make_subplots(rows=max(1, len(rows)), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[_title(row) for row in rows])
    for k, (rank, part) in enumerate(frame.groupby("rank", sort=True)):
        part = part.sort_values("elapsed_s")
        host = part["host"].iloc[0]
        for r, row in enumerate(rows, start=1):
            x = part["elapsed_s"].to_numpy(dtype=float)
            y = part[row.headline].to_numpy(dtype=float)
            idx = minmax_indices(y, points_per_trace)
            if idx is not None:
                x, y = x[idx], y[idx]
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines", name=f"rank {rank}", legendgroup=str(rank), showlegend=r == 1,
                line={"width": 1.2, "color": PALETTE[k % len(PALETTE)]},
                hovertemplate=f"%{{y:.1f}} {catalog.unit_of(row.headline)}<extra>rank {rank}"
                              f"{' · ' + html.escape(str(host)) if host else ''}</extra>"), row=r, col=1)
    fig.update_xaxes(title_text="seconds since the job's first sample", row=max(1, len(rows)), col=1)
    fig.update_layout(height=120 + 200 * max(1, len(rows)), template="plotly_white", hovermode="closest",
                      margin={"l": 60, "r": 20, "t": 40, "b": 40})
    return fig


def write_ranks_html(frame, table, path, *, title: str, overwrite: bool = False) -> str:
    """An offline page: ``table`` (HTML: the slowest and largest ranks) above
    :func:`ranks_figure` of ``frame`` (plotly.js embedded). Returns ``path``;
    an existing name is FileExistsError unless ``overwrite``, which replaces
    the name, never what a link there points to (:mod:`nbmon.files`)."""
    import plotly.io as pio

    plot = pio.to_html(ranks_figure(frame), include_plotlyjs=True, full_html=False,
                       config={"displaylogo": False})
    page = ('<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f'<title>nbmon: {html.escape(title)}</title></head>'
            '<body style="font-family:system-ui,sans-serif;margin:16px">'
            f'<h3 style="margin:0 0 8px">nbmon: {html.escape(title)}</h3>{table}{plot}</body></html>\n')
    return files.write_text(path, page, overwrite=overwrite)
