"""The live dashboard: a plotly FigureWidget fed from a Monitor's store.

The only nbmon module that imports plotly, and only inside functions. The
first plotly FigureWidget of a process cost ~1-2.5 s of GIL-holding imports,
nearly all of it nbformat -> jsonschema -> rfc3987_syntax (which builds a
grammar): plotly.io imports nbformat for ``fig.show()``'s mime renderers,
never for a FigureWidget. :func:`warm` imports plotly with that import
deferred to nbformat's first use (:func:`_import_plotly`: ~0.1 s instead of
1.2 s, 24 MiB less here), in a thread started by ``%load_ext nbmon``.

What is displayed is not the widget but its static record: a table (text/html
that every viewer shows, :mod:`nbmon.render`) carrying the widget's id, and
the timeline picture as the next output (image/png, :meth:`Dashboard.picture`).
The widget's front end (js/dashboard.js) mounts a live plotly view into the
table's output and hides both while it shows. A saved notebook therefore
holds a record that shows the figures wherever the widget cannot (kernel
gone, nbconvert, GitHub, an untrusted notebook), never a "model not found";
it says that a live chart stood there, and as of when. The record is
re-sent every :data:`RECORD_EVERY_S` seconds and after a cell's end
(:meth:`Dashboard.cell_ended`, at most every :data:`RECORD_MIN_S`).

Streaming is one-way and incremental: after the widget's first state, a
daemon thread ``nbmon-live`` sends at most ``refresh_hz`` times a second one
custom message holding only the samples that arrived since the last one (x
float64 seconds since the run's start, one float32 y per trace, as binary
buffers), the title, and the cell bands that changed; nothing when nothing
changed. The front end never answers (see js/dashboard.js).

:meth:`Dashboard.freeze` stops the refresher and returns the final record.
:func:`write_html` writes a self-contained offline page of a whole run (the
CLI's ``--html``).
"""
from __future__ import annotations

import html
import importlib
import importlib.util
import math
import pathlib
import sys
import threading
import time
import uuid

import numpy as np

from .. import catalog, files
from ..format import fmt
from ..options import DEFAULT_WINDOW_S
from ..render import html_table, png_img, text_table
from .charts import ROWS, Record, record_timeline, traces_for
from .frames import DEFAULT_BUDGET, build_frame, frame_bytes

__all__ = ["Dashboard", "THREAD_NAME", "frame_bytes", "record", "record_html", "warm", "write_html"]

THREAD_NAME = "nbmon-live"
DEFAULT_REFRESH_HZ = 2.0   # frames a second at most: ~2 KiB/s of websocket traffic at 10 Hz sampling
RECORD_EVERY_S = 30.0      # the static record is re-sent this often, and after a cell's end...
RECORD_MIN_S = 2.0         # ...but not more often than this (1,000 quick cells: not 1,000 records)
MAX_CELLS = 2000           # cell bands held: those the window can show, at most this many
TIMELINE_SAMPLES = 3       # a record's picture needs two samples after its window's opening one
MARGIN_PX = 110            # title, legend and x axis around the rows
LOADER = (pathlib.Path(__file__).parent / "static" / "dashboard.js").read_text(encoding="utf-8")
_EMPTY = np.empty(0, dtype=np.float32)
_classes: dict[str, type] = {}
_classes_lock = threading.Lock()
_bundle_pushed = threading.Event()   # once per process: pages that missed it ask


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


# -- plotly, lazily ----------------------------------------------------------------

def warm() -> None:
    """Import plotly, make nbmon's FigureWidget class and a first figure
    (plotly loads its validators on first use): ~0.2 s, once per process."""
    _import_plotly()
    _widget_class()
    _figure(catalog.names(catalog.TREE) + catalog.names(catalog.MACHINE), "")


def ready() -> bool:
    """Whether a FigureWidget can be made now without waiting for imports."""
    return "FigureWidget" in _classes


class _Deferred:
    """Stands for a module until an attribute of it is used, then imports it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


def _import_plotly() -> None:
    """Import plotly's FigureWidget; nbformat (for plotly.io's mime
    renderers, ``fig.show()``) only once plotly uses it. plotly asks for it
    through ``_plotly_utils.optional_imports``, which skips a name it has
    seen fail: told so while plotly.io imports, then given a stand-in that
    imports nbformat on first use. Where plotly works otherwise, or is
    already imported, this is a plain import."""
    import _plotly_utils.optional_imports as optional

    skipped = getattr(optional, "_not_importable", None)
    defer = isinstance(skipped, set) and "nbformat" not in skipped and "nbformat" not in sys.modules \
        and "plotly.io._renderers" not in sys.modules and importlib.util.find_spec("nbformat") is not None
    if defer:
        skipped.add("nbformat")
    try:
        import plotly.graph_objects as go

        go.FigureWidget  # noqa: B018  (plotly imports its widget module on first use)
    finally:
        if defer:
            skipped.discard("nbformat")
            renderers = sys.modules.get("plotly.io._renderers")
            if renderers is not None and getattr(renderers, "nbformat", False) is None:
                renderers.nbformat = _Deferred("nbformat")


def _widget_class() -> type:
    with _classes_lock:
        if "FigureWidget" not in _classes:
            _classes["FigureWidget"] = _make_widget_class()
        return _classes["FigureWidget"]


def _make_widget_class() -> type:
    import plotly
    import plotly.graph_objects as go
    import traitlets

    bundle_path = pathlib.Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"

    class FigureWidget(go.FigureWidget):  # the same name: callers check it
        """plotly's FigureWidget with nbmon's front end (js/dashboard.js):
        plotly's bundle travels as a custom message (pushed once per
        process, and on request), never as widget state, and the view sends
        no echo of updates back."""

        _esm = LOADER
        # What the front end needs from the start, in the widget's first state:
        # bundle (plotly's version), id (of the record to mount into), window
        # (seconds shown), traces ([{index, column, unit}]: the streamed ones),
        # cells (bands at creation), stale_s (silence that marks it not live),
        # events (the plotly events the user's code asked for; "nbmon:events" after).
        _nbmon = traitlets.Dict().tag(sync=True)

        def __init__(self, figure=None, nbmon: dict | None = None):
            self._nbmon_first = {"bundle": plotly.__version__, **(nbmon or {})}
            super().__init__(figure)

        @traitlets.default("_nbmon")
        def _nbmon_default(self):
            return self._nbmon_first

        def send_bundle(self) -> None:
            """Send plotly's bundle to the front end (js/dashboard.js: loadBundle)."""
            self.send({"type": "nbmon:bundle"}, [bundle_path.read_bytes()])

        def _handle_custom_msg(self, content, buffers):
            # A method, not an on_msg callback: the request can come as soon as
            # the comm opens, before this widget's __init__ has returned.
            if isinstance(content, dict) and content.get("type") == "nbmon:bundle":
                self.send_bundle()
            else:
                super()._handle_custom_msg(content, buffers)

        def on_edits_completed(self, fn):
            # The front end applies edits in order and sends no delta back to wait for.
            fn()

    return FigureWidget


def _template():
    import plotly.io as pio

    # Transparent panels and grey grid lines read on a light and a dark page;
    # the front end sets the font colour from JupyterLab's theme.
    template = pio.templates["plotly_white"]
    template.layout.update(paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")
    grid = "rgba(128,128,128,0.25)"
    for axis in (template.layout.xaxis, template.layout.yaxis):
        axis.update(gridcolor=grid, zerolinecolor=grid, linecolor=grid)
    return template


def _figure(columns, x_title: str):
    """Empty subplots (shared x) from charts.ROWS: per row the kernel's own
    traces on a left axis drawn on top, machine-wide ones as light bands on a
    right axis beneath, and over the first row an invisible bar trace
    ("cells") that gives the cell bands their hover text."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows, traces = traces_for(columns)
    n = max(1, len(rows))
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=0.05,
                        row_heights=[row.px for row in rows] or None,
                        specs=[[{"secondary_y": True}] for _ in range(n)])
    for trace in traces:
        style = trace.style
        fig.add_trace(go.Scatter(
            x=_EMPTY, y=_EMPTY, name=trace.label, mode="lines", meta=trace.column, connectgaps=True,
            line={"width": style.width, "color": trace.color, "dash": style.dash},
            fill="tozeroy" if style.fill else None, fillcolor=style.fill,
            hovertemplate="%{text}", text=[]),
            row=trace.row, col=1, secondary_y=not style.machine)
    for number, row in enumerate(rows, start=1):
        machine = any(t.row == number and t.style.machine for t in traces)
        # Each axis its own ticks (plotly would align an overlaying axis's to the other's).
        fig.update_yaxes(title_text=row.title, rangemode="tozero", side="left", showgrid=True,
                         tickmode="auto", row=number, col=1, secondary_y=True)
        fig.update_yaxes(title_text=row.machine if machine else None, side="right", showgrid=False,
                         tickmode="auto", rangemode="tozero", visible=machine, row=number, col=1,
                         secondary_y=False,
                         **({"range": list(row.machine_range)} if machine and row.machine_range else {}))
    fig.update_xaxes(title_text=x_title, row=n, col=1)
    fig.update_xaxes(hoverformat=".1f")   # the hover's header: seconds, not 9.301387
    # Fixed margins and labels drawn where they fall: plotly otherwise measures
    # every tick label against the page at every redraw (half of a redraw's time).
    fig.update_xaxes(ticklabeloverflow="allow", automargin=False)
    fig.update_yaxes(ticklabeloverflow="allow", automargin=False)
    cells_axis = 2 * n + 1
    fig.add_trace(go.Bar(x=[], y=[], meta="cells", name="cells", xaxis="x", yaxis=f"y{cells_axis}",
                         marker={"color": "rgba(0,0,0,0)"}, hoverinfo="text", showlegend=False))
    fig.update_layout({f"yaxis{cells_axis}": {"overlaying": "y", "range": [0, 1], "visible": False,
                                              "fixedrange": True}})
    fig.update_layout(
        title={"x": 0.01, "y": 0.99, "yanchor": "top", "font": {"size": 14}},
        height=MARGIN_PX + sum(row.px for row in rows), autosize=True,
        margin={"l": 60, "r": 60, "t": 70, "b": 40},
        template=_template(), hovermode="x unified", uirevision="nbmon",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0.0, "xanchor": "left",
                "font": {"size": 10}},
    )
    return fig


# -- static records ----------------------------------------------------------------

def headline(latest: dict) -> str:
    """The figures of a sample (``Store.latest_known``), meter-style, one per
    chart row it has: 'CPU 3.1 % · RSS 120 MiB', plus the GPU's."""
    return " · ".join(f"{row.short} {fmt(latest.get(row.headline), catalog.unit_of(row.headline))}"
                      for row in ROWS if row.headline in latest)


def record(monitor, live_id: str = "", state: str = "") -> Record:
    """Static record of a monitor's current (or last) run: its headline
    figures and summary table (HTML that every viewer shows, see
    :mod:`nbmon.render`), and its timeline picture, both from the same run
    window. ``live_id`` lets a live dashboard's front end mount its chart
    there, and the headline then says that a live chart stood there and as of
    when; ``state`` ends the headline instead ("stopped")."""
    store = monitor.store
    window = getattr(monitor, "_run_window", None)
    stats = window.stats() if window is not None else None
    figures = headline(store.latest_known()) if store is not None and len(store) else "no sample yet"
    summary = monitor.summary()
    when = time.strftime("%H:%M:%S", time.localtime(summary.end_time)) if summary.end_time else ""
    if state:
        tail = " · ".join(p for p in (state, f"as of {when}" if when else "") if p)
    else:
        tail = "a live chart stood here" + (f"; its figures as of {when}" if when else "")
    timeline = record_timeline(store, stats, stats.t_open if stats is not None else -math.inf)
    rows = summary.rows() + ([timeline.legend] if timeline is not None else [])
    line = f"nbmon · {figures} · {tail}"
    body = html_table("Resource summary", rows)
    live = f' data-nbmon-live="{html.escape(live_id)}"' if live_id else ""
    return Record(f'<div class="nbmon-live-record"{live}><div class="nbmon-live-static">'
                  f'<div class="nbmon-live-headline"><b>nbmon</b> · {html.escape(figures)} · '
                  f'{html.escape(tail)}</div>{body}</div></div>',
                  line + "\n" + text_table("Resource summary", rows), timeline)


def record_html(monitor, live_id: str = "", state: str = "") -> str:
    """The HTML of :func:`record` (its table; the timeline is a separate output)."""
    return record(monitor, live_id, state).html


def write_html(monitor, path, *, title: str | None = None,
               budget_per_trace: int = 5000, overwrite: bool = False) -> str:
    """Write a self-contained, offline HTML page of the monitor's run: the
    static record and an interactive plotly chart of the whole run (x in
    seconds since the run started; plotly.js embedded). Returns ``path``.
    An existing name is FileExistsError unless ``overwrite``, which replaces
    the name, never what a link there points to (:mod:`nbmon.files`)."""
    import plotly.io as pio

    fig = _figure(_columns_of(monitor), "seconds since start")
    store = monitor.store
    if store is not None and len(store):
        live = [trace for trace in fig.data if trace.meta != "cells"]
        columns = [trace.meta for trace in live]
        frame = build_frame(store, columns, math.inf, budget_per_trace, origin=_origin(store),
                            max_bytes=8 * budget_per_trace * max(1, len(columns)))
        for trace, column in zip(live, columns):
            x, y = frame.get(column, (_EMPTY, _EMPTY))
            unit = catalog.unit_of(column)
            trace.update(x=x, y=y, text=[fmt(v, unit) for v in y.tolist()])
    name = title or "nbmon run"
    fig.update_layout(title_text=html.escape(name))
    plot = pio.to_html(fig, include_plotlyjs=True, full_html=False, config={"displaylogo": False})
    static = record(monitor, state="stopped")
    picture = png_img(static.timeline.png, static.timeline.width, static.timeline.height) if static.timeline else ""
    page = ('<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f'<title>nbmon: {html.escape(name)}</title></head>'
            '<body style="font-family:system-ui,sans-serif;margin:16px">'
            f'<h3 style="margin:0 0 8px">nbmon: {html.escape(name)}</h3>'
            f'{static.html}{picture}{plot}</body></html>\n')
    files.write_text(path, page, overwrite=overwrite)
    return path


def _origin(store) -> float:
    """x = 0 of a run's chart: its start, or its first sample held."""
    return store.t_start if store.t_start == store.t_start else float(store.series([])[0][0])


# -- the live dashboard --------------------------------------------------------------

class Dashboard:
    """Live plotly chart of a :class:`~nbmon.engine.Monitor`.

    Rows and traces come from :mod:`charts`; x is seconds since the run
    started and fits the data until ``window_s`` seconds are held, then
    shows the last ``window_s``. ``widget`` is the FigureWidget (None until
    built: with ``build=False`` the refresher thread builds it, so a caller
    can display the record at once). ``cells`` is a list the caller fills
    with cell executions ({id, n, label, t0, t1}, times on the monitor's
    clock, t1 None while running) to draw as bands; those that ended before
    the window are not sent (:func:`keep_cells` drops them). The refresher thread
    starts at once (``start=False`` to drive :meth:`refresh` by hand) and
    ends by itself, after a last refresh, once a monitor it saw running
    stops. Failed refreshes are counted in ``errors`` (the last in
    ``last_error``), never raised from the thread.
    """

    def __init__(self, monitor, window_s: float = DEFAULT_WINDOW_S, refresh_hz: float = DEFAULT_REFRESH_HZ,
                 budget_per_trace: int = DEFAULT_BUDGET, *, start: bool = True, build: bool = True,
                 cells: list | None = None):
        for name, value in (("window_s", window_s), ("refresh_hz", refresh_hz)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite positive number, got {value!r}")
        if isinstance(budget_per_trace, bool) or not isinstance(budget_per_trace, int) or budget_per_trace < 2:
            raise ValueError(f"budget_per_trace must be a whole number >= 2, got {budget_per_trace!r}")
        self.monitor = monitor
        self.window_s = float(window_s)
        self.refresh_hz = float(refresh_hz)
        self.budget_per_trace = budget_per_trace
        self.cells = cells if cells is not None else []
        self.live_id = uuid.uuid4().hex
        self.handle = None          # the display handles of the record's table and picture,
        self.picture_handle = None  # set by whoever displays them (:meth:`picture`)
        self.refreshes = 0          # frames sent to the widget
        self.skipped = 0            # refreshes with nothing new
        self.errors = 0             # exceptions caught in the refresher thread
        self.last_error: str | None = None
        self.last_frame_bytes = 0
        self.frozen = False
        self.widget = None
        self.columns = [trace.column for trace in traces_for(_columns_of(monitor))[1]]
        self._lock = threading.RLock()
        self._store = None
        self._seq = 0
        self._t0 = math.nan
        self._t_last = -math.inf
        self._sent_cells: dict = {}
        self._events: tuple = ()    # plotly events the user's code asked for (sent to the front end)
        self._recorded = time.monotonic()
        self._record_due = False    # a cell ended since the record was last sent
        self._shown: Record | None = None   # the record last displayed
        self._shown_empty = False   # the record displayed had no sample yet
        self._shown_bare = False    # ... or no timeline yet (fewer than two samples in its window)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
            traces = [k for k, trace in enumerate(fig.data) if trace.meta != "cells"]
            self.columns = [fig.data[k].meta for k in traces]   # the store's, once it has one
            if store is not None and len(store):
                self._attach(store)
                frame = build_frame(store, self.columns, self.window_s, self.budget_per_trace, origin=self._t0)
                for k, column in zip(traces, self.columns):
                    x, y = frame.get(column, (_EMPTY, _EMPTY))
                    fig.data[k].update(x=x.astype(np.float64), y=y)
                fig.layout.title.text = self._title(store)
            else:
                fig.layout.title.text = "waiting for samples…"
            # No frame for stale_s seconds: the front end marks the chart as not live.
            stale_s = max(5.0, 3 * self.monitor.interval + 2 / self.refresh_hz)
            self.widget = _widget_class()(fig, nbmon={
                "id": self.live_id, "window": self.window_s, "cells": self._cell_updates(), "stale_s": stale_s,
                "events": [],
                "traces": [{"index": k, "column": c, "unit": catalog.unit_of(c)} for k, c in zip(traces, self.columns)]})

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

    def _asked_events(self) -> tuple:
        """The plotly events the user's code registered callbacks for on the
        widget (``trace.on_hover``, ``layout.on_change``, ...): the front end
        sends those, and only those, back to the kernel."""
        asked = set()
        for trace in self.widget.data:
            for kind in ("hover", "unhover", "click", "select", "deselect"):
                if getattr(trace, f"_{kind}_callbacks", None):
                    asked.add(kind)
            if trace._change_callbacks:
                asked.add("restyle")
        pending = [self.widget.layout]
        while pending and "relayout" not in asked:
            obj = pending.pop()
            if obj._change_callbacks:
                asked.add("relayout")
            pending.extend(obj._compound_props.values())
            pending.extend(child for children in obj._compound_array_props.values() for child in children)
        return tuple(sorted(asked))

    # -- refreshing --------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Send the samples (and cell bands) new since the last frame; False,
        and nothing sent, when there are none, unless ``force`` (which sends
        the title even so)."""
        with self._lock:
            store = self.monitor.store
            if store is None or self.widget is None:
                return False
            if store is not self._store:  # built before the run started: every sample is new
                self._store, self._seq, self._t0 = store, 0, _origin(store)
            t, _wall, rows, seq, _lost = store.rows_since(self._seq)
            fresh = t > self._t_last   # a sample already in the first state is not sent again
            cells = self._cell_updates()
            self._seq = seq
            events = self._asked_events()
            if events != self._events:
                self._events = events
                self.widget.send({"type": "nbmon:events", "events": list(events)})
            if not fresh.any() and not cells and not force:
                self.skipped += 1
                return False
            index = [store.columns.index(c) for c in self.columns]
            buffers = [(t[fresh] - self._t0).astype(np.float64).tobytes()]
            buffers += [rows[j][fresh].astype(np.float32).tobytes() for j in index]
            if fresh.any():
                self._t_last = float(t[fresh][-1])
            self.widget.send({"type": "nbmon:append", "title": self._title(store), "cells": cells}, buffers)
            self.refreshes += 1
            self.last_frame_bytes = sum(len(b) for b in buffers)
            return True

    def start(self) -> "Dashboard":
        """Start the refresher thread (a no-op while it runs)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self.frozen = False
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), name=THREAD_NAME, daemon=True)
            self._thread.start()
            return self

    def _counted(self, step) -> None:
        try:
            step()
        except Exception as err:  # never die, never print: count it
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"

    def _samples(self) -> int:
        store = self.monitor.store
        return 0 if store is None else store.seq

    def _sampled(self) -> bool:
        return self._samples() > 0

    def _run(self, stop: threading.Event) -> None:
        if self.widget is None:
            # The first figures into the record (a sampler's first sample comes
            # within a few hundred ms), then the chart, which can take seconds.
            deadline = time.monotonic() + 2.0
            while not self._sampled() and time.monotonic() < deadline and not stop.wait(0.02):
                pass
            if self._shown_empty and self._sampled():
                self._counted(self.update_record)
            self._counted(self._build)
        if self.widget is not None and not _bundle_pushed.is_set():
            # At once: JupyterLab handles a comm's messages only once its model
            # exists, and anywidget only once the front end's initialize() ran.
            _bundle_pushed.set()
            self._counted(self.widget.send_bundle)
        period = 1.0 / self.refresh_hz
        seen_running = False
        while True:
            began = time.monotonic()
            running = bool(self.monitor.running)
            seen_running = seen_running or running
            self._counted(self.refresh)
            since = began - self._recorded
            if since >= RECORD_EVERY_S or (self._record_due and since >= RECORD_MIN_S) \
                    or (self._shown_empty and self._sampled()) \
                    or (self._shown_bare and self._samples() >= TIMELINE_SAMPLES):
                self._counted(self.update_record)
            if seen_running and not running:
                # A sample taken just as the monitor stopped can land after the
                # refresh above; the monitor's stop() waits at most interval + 0.1 s
                # for its sampler, so one more refresh after that draws it.
                grace = min(1.0, float(getattr(self.monitor, "interval", 0.1)) + 0.1)
                if not stop.wait(grace):
                    self._counted(self.refresh)
                return
            if stop.wait(max(0.0, period - (time.monotonic() - began))):
                return

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> bool:
        """Stop the refresher; True when the thread has ended within ``timeout``."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            return not thread.is_alive()
        return True

    # -- static record -----------------------------------------------------
    def _record(self) -> Record:
        self._shown = record(self.monitor, "" if self.frozen else self.live_id,
                             "stopped" if self.frozen else "")
        # Too few samples for a picture: re-sent once there are enough, so that
        # a notebook saved soon after %resmon has one.
        self._shown_bare = self._shown.timeline is None and self._samples() < TIMELINE_SAMPLES
        return self._shown

    def picture(self):
        """The record's timeline picture, to display (with a display id) as
        the output after the record's table; the front end hides it while
        the live chart shows."""
        return (self._shown or self._record()).picture()

    def update_record(self) -> None:
        """Re-send the displayed record with the figures so far (a no-op
        until it has been displayed through a handle)."""
        self._recorded, self._record_due = time.monotonic(), False
        if self.handle is not None and not self.frozen:
            self._shown_empty = not self._sampled()
            shown = self._record()
            self.handle.update(shown.table())
            if self.picture_handle is not None:
                self.picture_handle.update(shown.picture())

    def cell_ended(self) -> None:
        """A cell ended: re-send the record now, or once :data:`RECORD_MIN_S`
        have passed since the last (the refresher thread then sends it)."""
        if time.monotonic() - self._recorded >= RECORD_MIN_S or not self.running:
            self.update_record()
        else:
            self._record_due = True

    def freeze(self, timeout: float = 1.0) -> Record:
        """Stop refreshing, send the last samples, and return the run's
        final static record (no widget state needed)."""
        self.stop(timeout)
        self.frozen = True
        self._counted(lambda: self.refresh(force=True))
        return self._record()

    def close(self) -> Record:
        """Freeze, then close the widget's comm; returns the static record."""
        final = self.freeze()
        if self.widget is not None:
            # Said first, so that the front end does not mark the chart "disconnected".
            self._counted(lambda: self.widget.send({"type": "nbmon:stopped"}))
            self.widget.close()
        return final

    def _repr_mimebundle_(self, **kwargs):
        self._shown_empty = not self._sampled()
        return self._record().table()._repr_mimebundle_()


def keep_cells(cells: list, now: float, window_s: float) -> None:
    """Drop, in place, the cell bands no window of ``window_s`` seconds up to
    ``now`` can show (ended before it), then the oldest beyond :data:`MAX_CELLS`."""
    cells[:] = [c for c in cells if c.get("t1") is None or c["t1"] >= now - window_s][-MAX_CELLS:]
