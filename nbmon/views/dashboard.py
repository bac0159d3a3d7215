"""The live dashboard: the kernel's monitor as a live view
(:class:`~nbmon.views.live.LiveView`: its record, one-way stream and
refresher).

Rows and traces come from :mod:`charts`: per row the kernel's own traces on
a left axis drawn on top, machine-wide ones as light bands on a right axis
beneath, the container's memory limit as a dashed line, and the cells run
as bands. Each frame holds the samples that arrived since the last one (one
group: x seconds since the run's start, a y per trace) and the cell bands
that changed. The memory warning (:mod:`nbmon.postmortem.memwarn`) is drawn too: a
dotted line at its threshold (under the container's limit, or on the
machine's axis without one), and a red note on the memory row while the
warning holds, sent as the layout's patch when it changes.

:func:`write_html` writes a self-contained offline page of a whole run (the
CLI's ``--html``).
"""
from __future__ import annotations

import html
import math
import time

import numpy as np

from .. import catalog
from ..postmortem import memwarn
from ..format import fmt
from ..options import DEFAULT_WINDOW_S
from ..report.render import html_table, png_img, text_table
from ..report.summary import headline
from . import live, pages
from .charts import LIMIT_COLOR, Record, record_timeline, traces_for
from .frames import DEFAULT_BUDGET, build_frame
from .live import DEFAULT_REFRESH_HZ, Frame, Group, LiveView

__all__ = ["Dashboard", "THREAD_NAME", "keep_cells", "record", "record_html", "write_html"]

THREAD_NAME = "nbmon-live"
MAX_CELLS = 2000           # cell bands held: those the window can show, at most this many
MARGIN_PX = 110            # title, legend and x axis around the rows
ROW_SPACING = 0.05         # between the rows, a share of the plot's height
WARNING_LINE, WARNING_NOTE = "nbmon-warning-line", "nbmon-warning"   # the front end finds them by name
_EMPTY = np.empty(0, dtype=np.float32)


def _columns_of(monitor) -> list[str]:
    """The columns a monitor's store has, or will have once started. The
    container's figures only where it has them (its limits are read in the
    run's first sample): no legend entry for a memory limit never drawn."""
    store = monitor.store
    if store is None:
        return [*catalog.names(catalog.TREE), *(catalog.names(catalog.MACHINE) if monitor.options.system else ())]
    # A stopped monitor has closed its devices; its store still has them.
    known = store.latest_known()
    container = set(catalog.names(catalog.CGROUP))
    return [c for c in store.columns if c not in container or not math.isnan(known.get(c, math.nan))]


def _figure(columns, x_title: str) -> dict:
    """Empty subplots (shared x) from charts.ROWS, as a plotly figure's dict
    (made without plotly: :func:`live.stacked_rows`): per row the kernel's
    own traces on a left axis drawn on top, machine-wide ones as light bands
    on a right axis beneath, and in the first row an invisible bar trace
    ("cells") that gives the cell bands their hover text."""
    rows, traces = traces_for(columns)
    layout = live.stacked_rows([row.px for row in rows] or [1], ROW_SPACING)
    data = []
    for trace in traces:
        style = trace.style
        x, (machine_y, kernel_y) = live.axis_refs(trace.row)
        line = {"width": style.width, "color": trace.color, **({"dash": style.dash} if style.dash else {})}
        data.append({"type": "scatter", "x": _EMPTY, "y": _EMPTY, "name": trace.label, "mode": "lines",
                     "meta": trace.column, "connectgaps": True, "line": line,
                     **({"fill": "tozeroy", "fillcolor": style.fill} if style.fill else {}),
                     "hovertemplate": "%{text}", "text": [], "xaxis": x,
                     "yaxis": machine_y if style.machine else kernel_y})
    for number, row in enumerate(rows, start=1):
        x, (machine_y, kernel_y) = live.axis_refs(number)
        machine = any(t.row == number and t.style.machine for t in traces)
        # Each axis its own ticks (plotly would align an overlaying axis's to the other's).
        layout[live.layout_key(kernel_y)].update(title={"text": row.title}, rangemode="tozero", side="left",
                                              showgrid=True, tickmode="auto")
        layout[live.layout_key(machine_y)].update(side="right", showgrid=False, tickmode="auto", rangemode="tozero",
                                               visible=machine, **({"title": {"text": row.machine}} if machine else {}),
                                               **({"range": list(row.machine_range)}
                                                  if machine and row.machine_range else {}))
    for key, axis in layout.items():
        if key.startswith("xaxis"):
            axis["hoverformat"] = ".1f"   # the hover's header: seconds, not 9.301387
    layout[live.layout_key(live.axis_refs(max(1, len(rows)))[0])]["title"] = {"text": x_title}
    # On the first row's kernel axis, as high as the front end draws it: an axis
    # of its own would be a subplot more to draw (a seventh of a redraw).
    data.append({"type": "bar", "x": [], "y": [], "meta": "cells", "name": "cells",
                 "marker": {"color": "rgba(0,0,0,0)"}, "hoverinfo": "text", "showlegend": False,
                 "xaxis": "x", "yaxis": live.axis_refs(1)[1][1]})
    layout.update(
        title={"x": 0.01, "y": 0.99, "yanchor": "top", "font": {"size": 14}},
        height=MARGIN_PX + sum(row.px for row in rows), autosize=True,
        margin={"l": 60, "r": 60, "t": 70, "b": 40},
        template=live.TEMPLATE, hovermode="x unified", uirevision="nbmon",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0.0, "xanchor": "left",
                "font": {"size": 10}},
    )
    return {"data": data, "layout": layout}


def _origin(store) -> float:
    """x = 0 of a run's chart: its start, or its first sample held."""
    return store.t_start if store.t_start == store.t_start else float(store.series([])[0][0])


# -- static records ----------------------------------------------------------------

def record(monitor, live_id: str = "", state: str = "") -> Record:
    """Static record of a monitor's current (or last) run: its headline
    figures and summary table (HTML that every viewer shows, see
    :mod:`nbmon.report.render`), and its timeline picture, both from the same run
    window. ``live_id`` lets a live dashboard's front end mount its chart
    there, and the headline then says that a live chart stood there and as of
    when; ``state`` ends the headline instead ("stopped")."""
    store = monitor.store
    window = getattr(monitor, "_run_window", None)
    stats = window.stats() if window is not None else None
    figures = headline(store.latest_known()) if store is not None and len(store) else "no sample yet"
    summary = monitor.summary()
    tail = live.record_tail(state, summary.end_time)
    timeline = record_timeline(store, stats, stats.t_open if stats is not None else -math.inf)
    rows = summary.rows() + ([timeline.legend] if timeline is not None else [])
    return Record(live.record_html(figures, tail, html_table("Resource summary", rows), live_id),
                  f"nbmon · {figures} · {tail}\n" + text_table("Resource summary", rows), timeline)


def record_html(monitor, live_id: str = "", state: str = "") -> str:
    """The HTML of :func:`record` (its table; the timeline is a separate output)."""
    return record(monitor, live_id, state).html


def write_html(monitor, path, *, title: str | None = None,
               budget_per_trace: int = 5000, overwrite: bool = False):
    """Write a self-contained, offline HTML page of the monitor's run
    (:func:`nbmon.views.pages.write_page`): the static record and an
    interactive plotly chart of the whole run (x in seconds since the run
    started). Returns ``path``; an existing name is FileExistsError unless
    ``overwrite``."""
    fig = _figure(_columns_of(monitor), "seconds since start")
    store = monitor.store
    if store is not None and len(store):
        traces = [trace for trace in fig["data"] if trace["meta"] != "cells"]
        columns = [trace["meta"] for trace in traces]
        frame = build_frame(store, columns, math.inf, budget_per_trace, origin=_origin(store),
                            max_bytes=8 * budget_per_trace * max(1, len(columns)))
        for trace, column in zip(traces, columns):
            x, y = frame.get(column, (_EMPTY, _EMPTY))
            unit = catalog.unit_of(column)
            trace.update(x=x, y=y, text=[fmt(v, unit) for v in y.tolist()])
    name = title or "nbmon run"
    fig["layout"]["title"]["text"] = html.escape(name)
    static = record(monitor, state="stopped")
    picture = png_img(static.timeline.png, static.timeline.width, static.timeline.height) if static.timeline else ""
    return pages.write_page(path, name, static.html + picture, fig, overwrite=overwrite)


# -- the live dashboard --------------------------------------------------------------

class Dashboard(LiveView):
    """Live plotly chart of a :class:`~nbmon.engine.Monitor`.

    x is seconds since the run started and fits the data until ``window_s``
    seconds are held, then shows the last ``window_s``. ``widget`` is the
    chart's widget, plotly's FigureWidget unless ``plotly`` is False
    (:func:`live.widget_class`) (None until built: with ``build=False`` the refresher
    thread builds it, so a caller can display the record at once). ``cells``
    is a list the caller fills with cell executions ({id, n, label, t0, t1},
    times on the monitor's clock, t1 None while running) to draw as bands;
    those that ended before the window are not sent (:func:`keep_cells`
    drops them). The refresher thread starts at once (``start=False`` to
    drive :meth:`refresh` by hand) and ends by itself, after a last refresh,
    once a monitor it saw running stops.
    """

    THREAD_NAME = THREAD_NAME

    def __init__(self, monitor, window_s: float = DEFAULT_WINDOW_S, refresh_hz: float = DEFAULT_REFRESH_HZ,
                 budget_per_trace: int = DEFAULT_BUDGET, *, start: bool = True, build: bool = True,
                 cells: list | None = None, plotly: bool = True):
        super().__init__(window_s, refresh_hz, plotly=plotly)
        self.budget_per_trace = live.check_points("budget_per_trace", budget_per_trace)
        self.monitor = monitor
        self.cells = cells if cells is not None else []
        self.columns = [trace.column for trace in traces_for(_columns_of(monitor))[1]]
        self._store = None
        self._seq = 0
        self._t0 = math.nan
        self._t_last = -math.inf
        self._sent_cells: dict = {}
        self._cells_sent_at = time.monotonic()   # every band in the window last sent
        self._memory_axes: tuple | None = None   # (x, kernel y, machine y or None) of the memory row
        self._warning: tuple = (None, {})   # (what the memory warning's layout shows, that layout)
        if build:
            self._build()
        if start:
            self.start()

    # -- figure ------------------------------------------------------------
    def _build(self) -> None:
        """Make the widget with the window's samples so far (min/max decimated)."""
        fig = _figure(_columns_of(self.monitor), "seconds since start")
        with self._lock:
            store = self.monitor.store
            traces = [k for k, trace in enumerate(fig["data"]) if trace["meta"] != "cells"]
            self.columns = [fig["data"][k]["meta"] for k in traces]   # the store's, once it has one
            self._memory_axes = _memory_axes(fig)
            if store is not None and len(store):
                self._attach(store)
                frame = build_frame(store, self.columns, self.window_s, self.budget_per_trace, origin=self._t0)
                for k, column in zip(traces, self.columns):
                    x, y = frame.get(column, (_EMPTY, _EMPTY))
                    fig["data"][k].update(x=x.astype(np.float64), y=y)
                fig["layout"]["title"]["text"] = self._title(store)
            else:
                fig["layout"]["title"]["text"] = "waiting for samples…"
            # No frame for stale_s seconds: the front end marks the chart as not live.
            stale_s = max(5.0, 3 * self.monitor.interval + 2 / self.refresh_hz)
            self._make_widget(fig, stale_s=stale_s, cells=self._cell_updates(), layout=self._warning_layout(),
                              streams=[{"id": c, "unit": catalog.unit_of(c), "index": k}
                                       for k, c in zip(traces, self.columns)])

    def _attach(self, store) -> None:
        # Samples up to seq are in the first state; later ones are appended.
        self._store, self._seq = store, store.seq
        self._t0 = _origin(store)
        self._t_last = store.latest()["t"] if len(store) else -math.inf

    def _title(self, store) -> str:
        text = headline(store.latest_known())
        return text + " · stopped" if self.frozen else text

    def _cell_updates(self) -> list[dict]:
        """Cells new or changed since last sent, with times as chart x; none
        that ended before the window (the front end drops those too)."""
        out = []
        t0 = self._t0 if self._t0 == self._t0 else 0.0
        oldest = self._t_last - self.window_s
        now = time.monotonic()
        if now - self._cells_sent_at >= live.RECORD_EVERY_S:
            # Every band in the window again, now and then: a page misses the frames that come before
            # its model's initialize() ran, and a band whose end it missed would run on for good.
            self._cells_sent_at, self._sent_cells = now, {}
        sent, self._sent_cells = self._sent_cells, {}
        for cell in list(self.cells):
            t1 = cell.get("t1")
            if t1 is not None and t1 < oldest:
                continue
            key = (cell.get("n"), t1, cell.get("label"))
            self._sent_cells[cell["id"]] = key
            if sent.get(cell["id"]) != key:
                out.append({"id": cell["id"], "n": cell.get("n"), "label": cell.get("label", ""),
                            "t0": cell["t0"] - t0, "t1": None if t1 is None else t1 - t0})
        return out

    def _warning_layout(self) -> dict:
        """The memory warning on the memory row: a dotted line at its
        threshold, and a note while the warning holds (nothing without one);
        made again only when what it shows changed."""
        watch = memwarn.attached(self.monitor)
        if watch is None or watch.percent is None or watch.level is None or self._memory_axes is None:
            return {}
        key = (watch.percent, watch.level.kind, watch.level.limit_mb, watch.warning is not None)
        if self._warning[0] != key:
            self._warning = (key, self._warning_patch(watch))
        return self._warning[1]

    def _warning_patch(self, watch) -> dict:
        level, (x, kernel_y, machine_y) = watch.level, self._memory_axes
        container = level.kind == memwarn.CONTAINER
        threshold = level.limit_mb * watch.percent / 100.0
        yref = kernel_y if container else machine_y   # where the limit itself is drawn
        shapes = [] if yref is None else [{
            "type": "line", "name": WARNING_LINE, "xref": f"{x} domain", "x0": 0, "x1": 1, "yref": yref,
            "y0": threshold, "y1": threshold, "layer": "above",
            "line": {"width": 1.2, "dash": "dot", "color": LIMIT_COLOR},
            # Whose memory, of what limit, and where the line stands.
            "label": {"text": f"{'container limit' if container else 'machine memory'} "
                              f"{fmt(watch.percent, '%')}: {fmt(threshold, 'MiB')}", "textposition": "end",
                      "font": {"size": 9}}}]
        notes = []
        if watch.warning is not None:
            text = (f"memory warning: the container is over {fmt(watch.percent, '%')} of its "
                    f"{fmt(level.limit_mb, 'MiB')} limit" if container else
                    f"memory warning: the machine's memory is over {fmt(watch.percent, '%')} used "
                    f"(of {fmt(level.limit_mb, 'MiB')})")
            notes.append({"name": WARNING_NOTE, "text": html.escape(text, quote=False), "xref": f"{x} domain",
                          "yref": f"{kernel_y} domain", "x": 0.0, "y": 1.0, "xanchor": "left",
                          "yanchor": "bottom", "showarrow": False, "font": {"size": 11, "color": LIMIT_COLOR}})
        return {"shapes": shapes, "annotations": notes}

    # -- refreshing --------------------------------------------------------
    def _frame(self, force: bool) -> Frame | None:
        """The samples (and cell bands) new since the last frame."""
        store = self.monitor.store
        if store is None:
            return None
        if store is not self._store:  # built before the run started: every sample is new
            self._store, self._seq, self._t0 = store, 0, _origin(store)
        t, _wall, rows, seq, _lost = store.rows_since(self._seq)
        fresh = t > self._t_last   # a sample already in the first state is not sent again
        cells = self._cell_updates()
        self._seq = seq
        self._declare(layout=self._warning_layout())
        if not fresh.any() and not cells and not force:
            return None
        index = [store.columns.index(c) for c in self.columns]
        group = Group(list(self.columns), t[fresh] - self._t0, [rows[j][fresh] for j in index])
        if fresh.any():
            self._t_last = float(t[fresh][-1])
        return Frame(self._title(store), [group], cells)

    def _samples(self) -> int:
        store = self.monitor.store
        return 0 if store is None else store.seq

    def _source_running(self) -> bool:
        return self.monitor.running

    def _grace_s(self) -> float:
        # The monitor's stop() waits at most interval + 0.1 s for its sampler.
        return min(1.0, float(getattr(self.monitor, "interval", 0.1)) + 0.1)

    def _make_record(self, live_id: str, state: str) -> Record:
        return record(self.monitor, live_id, state)


def _memory_axes(fig) -> tuple | None:
    """(x, kernel y, machine y or None) of the memory row of a :func:`_figure`."""
    memory = {catalog.metric_of(t["meta"]).source: t for t in fig["data"]
              if t["meta"] != "cells" and catalog.metric_of(t["meta"]).chart == "memory"}
    kernel = memory.get(catalog.TREE)
    if kernel is None:
        return None
    machine = memory.get(catalog.MACHINE)
    return kernel["xaxis"], kernel["yaxis"], machine["yaxis"] if machine is not None else None


def keep_cells(cells: list, now: float, window_s: float) -> None:
    """Drop, in place, the cell bands no window of ``window_s`` seconds up to
    ``now`` can show (ended before it), then the oldest beyond :data:`MAX_CELLS`."""
    cells[:] = [c for c in cells if c.get("t1") is None or c["t1"] >= now - window_s][-MAX_CELLS:]
