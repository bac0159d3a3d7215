"""The base of nbmon's live views: the kernel's dashboard
(:mod:`nbmon.views.dashboard`) and a Dask cluster's
(:mod:`nbmon.views.cluster`). One chart widget with one front end
(js/dashboard/: plotly's own, in the page), one refresher lifecycle, one
record. The widget is plotly's FigureWidget where the user's code can reach
it (the session in the kernel: its event callbacks), else a plain widget
with the same state, made from the figure as a dict, so that the session's
helper never imports plotly (:func:`widget_class`).

What is displayed is not the widget but the view's static record: a table
(text/html that every viewer shows, :mod:`nbmon.report.render`) carrying the
widget's id, and its timeline picture as the next output (image/png,
:meth:`LiveView.picture`). The front end mounts a live plotly view into the
table's output and hides both while it shows. A saved notebook therefore
holds a record that shows the figures wherever the widget cannot (kernel
gone, nbconvert, GitHub, an untrusted notebook), never a "model not found";
it says that a live chart stood there, and as of when. The record is
re-sent every :data:`RECORD_EVERY_S` seconds and after a cell's end
(:meth:`LiveView.cell_ended`, at most every :data:`RECORD_MIN_S`).

Streaming is one-way and incremental. The widget's first state holds the
figure and, in ``_nbmon``, what the front end needs: its *streams* (the
traces fed with points: ``{id, unit, index}`` for a trace of the figure,
``{id, unit, trace}`` for one the front end adds, ``trace`` also patching
the figure's), and a *layout* patch (shapes, annotations, margins) laid over
the figure's; both are re-sent as state when they change (joins, leaves, a
memory warning), which is rare. Then a daemon thread sends at most
``refresh_hz`` times a second one custom message (``nbmon:append``,
:class:`Frame`) holding only the points that arrived since the last one,
in groups of streams that share their x (float64 seconds, one float32 y per
stream, as binary buffers), the title, and the cell bands that changed;
nothing when nothing changed. The front end never answers: plotly's events
reach the kernel only once the user's code registers a callback for them
on the widget (``nbmon:events``).

The refresher counts its errors (``errors``, ``last_error``), never raises
them; :meth:`LiveView.freeze` stops it and returns the final record,
:meth:`LiveView.close` also closes the widget's comm.

plotly's widget bundle (plotly.js, ~5 MB) reaches the page once per
process, as a custom message: :func:`push_bundle` sends it as soon as
``%resmon`` is asked for a chart (the page takes ~1.2 s to import it, which
then runs while the kernel starts its sampler and builds the view), else the
first view sends it; a page that missed it asks a view for it (at once
where the view's state says it had been sent: Voila's page connects after
the notebook ran).

The first plotly FigureWidget of a process cost ~1-2.5 s of GIL-holding
imports, nearly all of it nbformat -> jsonschema -> rfc3987_syntax (which
builds a grammar): plotly.io imports nbformat for ``fig.show()``'s mime
renderers, never for a FigureWidget. :func:`import_plotly` imports plotly
with that import deferred to nbformat's first use (~0.1 s instead of 1.2 s,
24 MiB less here).
"""
from __future__ import annotations

import html
import importlib
import importlib.metadata
import importlib.util
import math
import pathlib
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from . import frontend
from ..report.render import Output
from .charts import Record

DEFAULT_REFRESH_HZ = 2.0   # frames a second at most: ~2 KiB/s of websocket traffic at 10 Hz sampling
RECORD_EVERY_S = 30.0      # the static record is re-sent this often, and after a cell's end...
RECORD_MIN_S = 2.0         # ...but not more often than this (1,000 quick cells: not 1,000 records)
TIMELINE_SAMPLES = 3       # a record's picture needs two samples after its window's opening one
FIRST_SAMPLE_WAIT_S = 2.0  # a view built by its refresher waits this long for a first sample
LOADER = frontend.module("dashboard/index.js")   # js/dashboard/ and format.js, as one text
EVENTS = ("hover", "unhover", "click", "select", "deselect")   # plotly's trace events
EVENTS_EVERY_S = 2.0       # how often the widget's callbacks are looked for: a walk of its whole layout
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_classes: dict[str, type] = {}
_classes_lock = threading.Lock()
_bundle_lock = threading.Lock()
_bundle_sent = False   # once per process: pages that missed it ask
# Sent before a widget's state was made: a page that then has no copy (Voila's
# connects after the notebook ran, Colab makes no carrier model) asks at once.
_bundle_pushed = False


# -- arguments ---------------------------------------------------------------------

def check_positive(name: str, value) -> float:
    """A finite positive number, or ValueError naming the value as given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return float(value)


def check_points(name: str, value) -> int:
    """A whole number of points, at least 2 (a line), or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"{name} must be a whole number >= 2, got {value!r}")
    return value


# -- plotly, lazily ----------------------------------------------------------------

class _Deferred:
    """Stands for a module until an attribute of it is used, then imports it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


def import_plotly() -> None:
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


def plotly_bundle() -> tuple[str, pathlib.Path]:
    """plotly's version and its widget bundle (plotly.js with plotly's
    FigureModel and FigureView, js/dashboard/bundle.js: importBundle), found
    without importing plotly (~1 s cold)."""
    spec = importlib.util.find_spec("plotly")
    return importlib.metadata.version("plotly"), pathlib.Path(spec.origin).parent / "package_data" / "widgetbundle.js"


def send_bundle(widget) -> None:
    """Send plotly's bundle to the page through ``widget``, a widget of
    nbmon's front end (js/dashboard/bundle.js: loadBundle)."""
    global _bundle_pushed
    widget.send({"type": "nbmon:bundle"}, [plotly_bundle()[1].read_bytes()])
    _bundle_pushed = True


def _claim_bundle() -> bool:
    """True for the one caller per process that sends plotly's bundle."""
    global _bundle_sent
    with _bundle_lock:
        first, _bundle_sent = not _bundle_sent, True
        return first


def push_bundle() -> bool:
    """Send plotly's bundle to the page now, ahead of the live view that
    needs it (once per process; a no-op after). It travels through a widget
    of nbmon's front end opened for it alone and closed at once, never
    displayed: a page handles a comm's messages in order, the bundle before
    the close, so no model is left behind. Where this fails (False), the
    first view sends the bundle itself, and counts what fails there."""
    global _bundle_sent
    if not _claim_bundle():
        return False
    try:
        import anywidget
        import traitlets

        class BundleCarrier(anywidget.AnyWidget):
            _esm = LOADER
            _nbmon = traitlets.Dict({"bundle": plotly_bundle()[0], "carrier": True}).tag(sync=True)

        carrier = BundleCarrier()
        try:
            send_bundle(carrier)
        finally:
            carrier.close()
            carrier.layout.close()   # a DOMWidget's own Layout widget: a model of its own
        return True
    except Exception:
        with _bundle_lock:
            _bundle_sent = False
        return False


def widget_class(plotly: bool = True) -> type:
    """nbmon's chart widget class (made once per process): plotly's
    FigureWidget where ``plotly`` (the figure as plotly's objects in Python,
    whose event callbacks the user's code can register), else a plain
    anywidget with the same state, made without importing plotly."""
    name = "FigureWidget" if plotly else "ChartWidget"
    with _classes_lock:
        if name not in _classes:
            _classes[name] = _make_widget_class(plotly)
        return _classes[name]


def _arrays_as_buffers(data: list, _widget) -> list:
    """A figure's traces with their arrays in plotly's wire form
    ({buffer, dtype, shape}: the widget's buffers travel as binary)."""
    def wire(value):
        if isinstance(value, np.ndarray):
            value = np.ascontiguousarray(value)
            return {"buffer": memoryview(value), "dtype": str(value.dtype), "shape": list(value.shape)}
        return value
    return [{key: wire(value) for key, value in trace.items()} for trace in data]


def _make_widget_class(plotly: bool) -> type:
    import anywidget
    import traitlets

    version = plotly_bundle()[0]

    class Chart(traitlets.HasTraits):
        """What nbmon's chart widgets share: nbmon's front end
        (js/dashboard/); plotly's bundle travels as a custom message (pushed
        once per process, and on request), never as widget state, and the
        view sends no echo of updates back."""

        _esm = LOADER
        # What the front end needs from the start (see the module's doc): bundle
        # (plotly's version), id (of the record to mount into), window (seconds
        # shown), streams, layout, cells (bands at creation), stale_s (silence
        # that marks it not live), events (the plotly events the user's code
        # asked for; "nbmon:events" after).
        _nbmon = traitlets.Dict().tag(sync=True)

        def __init__(self, nbmon: dict, *args, **kwargs):
            self._nbmon_first = {"bundle": version, "pushed": _bundle_pushed, **nbmon}
            super().__init__(*args, **kwargs)

        @traitlets.default("_nbmon")
        def _nbmon_default(self):
            return self._nbmon_first

        def send_bundle(self) -> None:
            send_bundle(self)

        def _handle_custom_msg(self, content, buffers):
            # A method, not an on_msg callback: the request can come as soon as
            # the comm opens, before this widget's __init__ has returned.
            if isinstance(content, dict) and content.get("type") == "nbmon:bundle":
                self.send_bundle()
            else:
                super()._handle_custom_msg(content, buffers)

    if not plotly:
        class ChartWidget(Chart, anywidget.AnyWidget):
            """The figure (a dict: data, layout) as the state plotly's front
            end reads, no more: the session's helper draws with it, and never
            imports plotly (34 MiB)."""

            _widget_data = traitlets.List().tag(sync=True, to_json=_arrays_as_buffers)
            _widget_layout = traitlets.Dict().tag(sync=True)
            _config = traitlets.Dict().tag(sync=True)

            def __init__(self, nbmon: dict, figure: dict):
                super().__init__(nbmon, _widget_data=figure["data"], _widget_layout=figure["layout"])

        return ChartWidget

    import_plotly()
    import plotly.graph_objects as go

    class FigureWidget(Chart, go.FigureWidget):  # the same name: callers check it
        """plotly's FigureWidget with nbmon's front end."""

        def on_edits_completed(self, fn):
            # The front end applies edits in order and sends no delta back to wait for.
            fn()

    return FigureWidget


# nbmon's plotly template: transparent panels and grey grid lines that read
# on a light and a dark page (the front end sets the font colour from the
# page's theme); tick labels level, drawn where they fall, in fixed margins:
# plotly otherwise measures every new label against the page, and tries
# angles for the x axis's, at every redraw. The rest is plotly_white's
# layout, as plotly 6 and 7 have it: a plain dict, so that a chart needs no
# plotly in the process that makes it.
_GRID = "rgba(128,128,128,0.25)"
_AXIS = {"gridcolor": _GRID, "linecolor": _GRID, "zerolinecolor": _GRID, "zerolinewidth": 2, "ticks": "",
         "title": {"standoff": 15}, "automargin": False, "ticklabeloverflow": "allow"}
TEMPLATE = {"layout": {
    "annotationdefaults": {"arrowcolor": "#2a3f5f", "arrowhead": 0, "arrowwidth": 1},
    "autotypenumbers": "strict",
    "colorway": ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
                 "#FF97FF", "#FECB52"],
    "font": {"color": "#2a3f5f"}, "hoverlabel": {"align": "left"}, "hovermode": "closest",
    "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)",
    "shapedefaults": {"line": {"color": "#2a3f5f"}}, "title": {"x": 0.05},
    "xaxis": {**_AXIS, "tickangle": 0}, "yaxis": _AXIS,
}}
SECONDARY_Y_ROOM = 0.06   # the width plotly's make_subplots leaves right of a plot for its secondary y axis


def stacked_rows(heights: list[float], spacing: float) -> dict:
    """The axes of plotly's ``make_subplots(rows=len(heights), cols=1,
    shared_xaxes=True, vertical_spacing=spacing, row_heights=heights,
    specs=[[{"secondary_y": True}]] * rows)``, as layout entries, made
    without plotly: row k (from the top) has x axis k, its primary y axis
    2k-1 and its secondary 2k (see :func:`axis_refs`)."""
    rows, total = len(heights), float(sum(heights))
    room = 1.0 - spacing * (rows - 1)
    domains, bottom = [], 0.0
    for height in reversed(heights):   # from the bottom up, as plotly adds them (the same floats)
        top = bottom + height / total * room
        domains.append([round(bottom, 12), round(top, 12)])   # 1.0, not 1.0000000000000004
        bottom = top + spacing
    layout = {}
    for k, domain in enumerate(reversed(domains), start=1):
        x, (y1, y2) = axis_refs(k)
        xaxis = {"anchor": y1, "domain": [0.0, 1.0 - SECONDARY_Y_ROOM]}
        if k < rows:   # shared: every row follows the bottom row's x axis, which alone shows its ticks
            xaxis.update(matches=axis_refs(rows)[0], showticklabels=False)
        layout[layout_key(x)] = xaxis
        layout[layout_key(y1)] = {"anchor": x, "domain": domain}
        layout[layout_key(y2)] = {"anchor": x, "overlaying": y1, "side": "right"}
    return layout


def axis_refs(row: int) -> tuple[str, tuple[str, str]]:
    """('x2', ('y3', 'y4')): row ``row``'s x axis and its primary and secondary y axes, as traces name them."""
    def ref(letter: str, number: int) -> str:
        return letter if number == 1 else f"{letter}{number}"
    return ref("x", row), (ref("y", 2 * row - 1), ref("y", 2 * row))


def layout_key(ref: str) -> str:
    """'y3' -> 'yaxis3': where the layout holds the axis a trace names."""
    return f"{ref[0]}axis{ref[1:]}"


def subplot_refs(fig, row: int, col: int) -> tuple[str, str]:
    """('x3', 'y5'): the axes of subplot (row, col) of ``fig``, as shapes name them."""
    sub = fig.get_subplot(row, col)
    return "x" + sub.xaxis.plotly_name[5:], "y" + sub.yaxis.plotly_name[5:]


# -- frames ------------------------------------------------------------------------

@dataclass(slots=True)
class Group:
    """Points of streams that share their x: ``ys[k]`` belongs to ``ids[k]``.
    ``replace``: these are the streams' whole points, not new ones."""
    ids: list[str]
    x: np.ndarray
    ys: list[np.ndarray]
    replace: bool = False

    @property
    def bytes(self) -> int:
        """What the group's buffers take: x as float64, each y as float32."""
        return 8 * len(self.x) + 4 * sum(len(y) for y in self.ys)


@dataclass(slots=True)
class Frame:
    title: str
    groups: list[Group] = field(default_factory=list)
    cells: list[dict] = field(default_factory=list)


# -- the view ----------------------------------------------------------------------

class LiveView:
    """What the live views share: the widget, its first state, frames, the
    refresher thread and the record. A subclass makes the widget
    (:meth:`_build`), says what is new (:meth:`_frame`), what its record is
    (:meth:`_make_record`), how many samples its source has had
    (:meth:`_samples`) and whether it still runs (:meth:`_source_running`)."""

    THREAD_NAME = "nbmon-live"
    MAX_HZ = math.inf

    def __init__(self, window_s: float, refresh_hz: float, *, plotly: bool = True):
        self.plotly = plotly        # the widget: plotly's FigureWidget, else a plain one (see widget_class)
        self.window_s = check_positive("window_s", window_s)
        self.refresh_hz = check_positive("refresh_hz", refresh_hz)
        if self.refresh_hz > self.MAX_HZ:
            raise ValueError(f"refresh_hz must be at most {self.MAX_HZ:g}, got {refresh_hz!r}")
        self.live_id = uuid.uuid4().hex
        self.handle = None          # the display handles of the record's table and picture,
        self.picture_handle = None  # set by whoever displays them (:meth:`picture`)
        self.chart_handle = None    # the chart's own output, where the front end needs one (see below)
        self.refreshes = 0          # frames sent to the widget
        self.skipped = 0            # refreshes with nothing new
        self.errors = 0             # exceptions caught in the refresher thread
        self.last_error: str | None = None
        self.last_frame_bytes = 0
        self.frozen = False
        self.widget = None
        self._lock = threading.RLock()
        self._events: tuple = ()    # plotly events the user's code asked for (sent to the front end)
        self._events_at = -math.inf
        self._recorded = time.monotonic()
        self._record_due = False    # a cell ended since the record was last sent
        self._shown: Record | None = None   # the record last displayed
        self._shown_empty = False   # the record displayed had no sample yet
        self._shown_bare = False    # ... or no timeline yet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what a subclass says ------------------------------------------------------
    def _build(self) -> None:
        raise NotImplementedError

    def _frame(self, force: bool) -> Frame | None:
        """What is new since the last frame (None: nothing; ``force``: a frame even so)."""
        raise NotImplementedError

    def _make_record(self, live_id: str, state: str) -> Record:
        raise NotImplementedError

    def _samples(self) -> int:
        raise NotImplementedError

    def _source_running(self) -> bool:
        raise NotImplementedError

    def _grace_s(self) -> float:
        """How long the last samples may take to arrive after the source stopped."""
        return 1.0

    # -- the widget ----------------------------------------------------------------
    def _make_widget(self, fig, *, streams: list[dict], layout: dict | None = None, stale_s: float,
                     cells: list | None = None) -> None:
        self.widget = widget_class(self.plotly)({
            "id": self.live_id, "window": self.window_s, "stale_s": stale_s, "events": [],
            "cells": cells or [], "streams": streams, "layout": layout or {}}, fig)
        if self.chart_handle is not None:   # a widget view, for a manager that makes models only for those
            self.chart_handle.update(Output({WIDGET_VIEW: {"version_major": 2, "version_minor": 0,
                                                           "model_id": self.widget.model_id},
                                             "text/plain": "nbmon live chart"}))

    def _declare(self, *, streams: list[dict] | None = None, layout: dict | None = None) -> None:
        """Re-send the streams or the layout patch as state, where they changed."""
        state = self.widget._nbmon
        new = {**state, **({"streams": streams} if streams is not None else {}),
               **({"layout": layout} if layout is not None else {})}
        if new != state:
            self.widget._nbmon = new

    def _asked_events(self) -> tuple:
        """The plotly events the user's code registered callbacks for on the
        widget (``trace.on_hover``, ``layout.on_change``, ...): the front end
        sends those, and only those, back to the kernel. A plain widget has none."""
        if not self.plotly:
            return ()
        asked = set()
        for trace in self.widget.data:
            for kind in EVENTS:
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

    # -- refreshing ----------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Send what is new since the last frame; False, and nothing sent,
        when nothing is, unless ``force`` (which sends the title even so)."""
        with self._lock:
            if self.widget is None:
                return False
            now = time.monotonic()
            if now - self._events_at >= EVENTS_EVERY_S:
                self._events_at, events = now, self._asked_events()
            else:
                events = self._events
            if events != self._events:
                self._events = events
                self.widget.send({"type": "nbmon:events", "events": list(events)})
            frame = self._frame(force)
            if frame is None:
                self.skipped += 1
                return False
            buffers = []
            for group in frame.groups:
                buffers.append(np.asarray(group.x, dtype=np.float64).tobytes())
                buffers += [np.asarray(y, dtype=np.float32).tobytes() for y in group.ys]
            self.widget.send({"type": "nbmon:append", "title": frame.title, "cells": frame.cells,
                              "groups": [{"ids": g.ids, "replace": g.replace}
                                         for g in frame.groups]}, buffers)
            self.refreshes += 1
            self.last_frame_bytes = sum(len(b) for b in buffers)
            return True

    def start(self):
        """Start the refresher thread (a no-op while it runs)."""
        with self._lock:
            if self.running:
                return self
            self.frozen = False
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), name=self.THREAD_NAME,
                                            daemon=True)
            self._thread.start()
            return self

    def _counted(self, step) -> None:
        try:
            step()
        except Exception as err:  # never die, never print: count it
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"

    def _run(self, stop: threading.Event) -> None:
        if self.widget is None:
            # The first figures into the record (a sampler's first sample comes
            # within a few hundred ms), then the chart, which can take seconds.
            deadline = time.monotonic() + FIRST_SAMPLE_WAIT_S
            while not self._samples() and time.monotonic() < deadline and not stop.wait(0.02):
                pass
            if self._shown_empty and self._samples():
                self._counted(self.update_record)
            self._counted(self._build)
        if self.widget is not None and _claim_bundle():
            # At once: JupyterLab handles a comm's messages only once its model
            # exists, and anywidget only once the front end's initialize() ran.
            self._counted(self.widget.send_bundle)
        period = 1.0 / self.refresh_hz
        seen_running = False
        while True:
            began = time.monotonic()
            running = bool(self._source_running())
            seen_running = seen_running or running
            self._counted(self.refresh)
            since = began - self._recorded
            if since >= RECORD_EVERY_S or (self._record_due and since >= RECORD_MIN_S) \
                    or (self._shown_empty and self._samples()) \
                    or (self._shown_bare and self._samples() >= TIMELINE_SAMPLES):
                self._counted(self.update_record)
            if seen_running and not running:
                # Samples taken just as the source stopped can land after the
                # refresh above: one more refresh once they have had time to.
                if not stop.wait(self._grace_s()):
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

    # -- the static record ---------------------------------------------------------
    def _record(self) -> Record:
        self._shown = self._make_record("" if self.frozen else self.live_id, "stopped" if self.frozen else "")
        # Too few samples for a picture: re-sent once there are enough, so that
        # a notebook saved soon after the view showed has one.
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
            self._shown_empty = not self._samples()
            shown = self._record()
            self.handle.update(shown.table())
            self._send_record(shown)
            if self.picture_handle is not None:
                self.picture_handle.update(shown.picture())

    def _send_record(self, shown: Record) -> None:
        """The record's table and timeline to the page through the widget too:
        a page that applies no display update (Voila's, once rendered) writes
        them into the record it shows (js/dashboard/live.js: "nbmon:record")."""
        if self.widget is None:
            return
        msg = {"type": "nbmon:record", "html": shown.table().data["text/html"]}
        if self.picture_handle is not None and shown.timeline is not None:
            msg["picture"] = {"png": shown.picture().data["image/png"],
                              "width": shown.timeline.width, "height": shown.timeline.height}
        self.widget.send(msg)

    def cell_ended(self) -> None:
        """A cell ended: re-send the record now, or once :data:`RECORD_MIN_S`
        have passed since the last (the refresher thread then sends it)."""
        if time.monotonic() - self._recorded >= RECORD_MIN_S or not self.running:
            self.update_record()
        else:
            self._record_due = True

    def freeze(self, timeout: float = 1.0) -> Record:
        """Stop refreshing, send the last samples, and return the final
        static record (no widget state needed)."""
        self.stop(timeout)
        self.frozen = True
        self._counted(lambda: self.refresh(force=True))
        return self._record()

    def close(self) -> Record:
        """Freeze, then close the widget's comm; returns the static record."""
        final = self.freeze()
        if self.chart_handle is not None:   # the record beside it stays: no view of a closed model is kept
            self.chart_handle.update(Output({"text/plain": ""}))
        if self.widget is not None:
            # Said first, so that the front end does not mark the chart "disconnected".
            self._counted(lambda: self._send_record(final))
            self._counted(lambda: self.widget.send({"type": "nbmon:stopped"}))
            self.widget.close()
        return final

    def _repr_mimebundle_(self, **kwargs):
        self._shown_empty = not self._samples()
        return self._record().table()._repr_mimebundle_()


def record_html(title_line: str, tail: str, body: str, live_id: str, cls: str = "") -> str:
    """A live view's record: its headline (``title_line``, then ``tail``),
    then ``body`` (tables), in the element a live chart mounts into
    (``live_id``: the widget's, "" for none)."""
    live = f' data-nbmon-live="{html.escape(live_id)}"' if live_id else ""
    return (f'<div class="nbmon-live-record{" " + cls if cls else ""}"{live}><div class="nbmon-live-static">'
            f'<div class="nbmon-live-headline"><b>nbmon</b> · {html.escape(title_line)} · '
            f'{html.escape(tail)}</div>{body}</div></div>')


def record_tail(state: str, end_time: float | None) -> str:
    """What a record says after its figures: that a live chart stood there
    and as of when, or ``state`` ("stopped") and as of when."""
    when = time.strftime("%H:%M:%S", time.localtime(end_time)) if end_time else ""
    if state:
        return " · ".join(p for p in (state, f"as of {when}" if when else "") if p)
    return "a live chart stood here" + (f"; its figures as of {when}" if when else "")
