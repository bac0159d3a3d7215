"""The live dashboard: a plotly FigureWidget fed from a Monitor's store.

The only nbmon module that imports plotly; the notebook layer imports it
lazily. Built on the main thread; afterwards a daemon thread named
``nbmon-live`` refreshes it at most ``refresh_hz`` times a second while the
monitor runs. A refresh only sets trait values (plotly trace assignment)
inside one ``batch_update``, so each frame is one comm message whose arrays
travel as binary float32 buffers (plotly's widget serializer turns 1-D
numeric numpy arrays other than int64/uint64 into memoryviews). When no
sample arrived since the last frame nothing is sent.

:meth:`Dashboard.freeze` stops the refresher and returns static HTML (the run's
summary table and an SVG timeline, :func:`record_html`), the record a saved
notebook keeps. :func:`write_html` writes a self-contained offline page of a
whole run (the CLI's ``--html``).
"""
from __future__ import annotations

import html
import math
import os
import threading
import time

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import catalog
from ..format import fmt
from .charts import ROW_PX, svg_record_timeline, traces_for
from .frames import DEFAULT_BUDGET, build_frame, frame_bytes

__all__ = ["Dashboard", "THREAD_NAME", "frame_bytes", "record_html", "write_html"]

THREAD_NAME = "nbmon-live"
_EMPTY = np.empty(0, dtype=np.float32)


class FigureWidget(go.FigureWidget):  # the same name: callers check it
    # anywidget connects every widget whose _esm is a file to that file's
    # change signal, with a strong reference that close() does not drop:
    # each Dashboard (one per %resmon) would stay in memory for good. The
    # file's text as a plain string is the same module without the watch.
    _esm = str(go.FigureWidget._esm)


def _columns_of(monitor) -> list[str]:
    """The columns a monitor's store has, or will have once started."""
    if monitor.store is not None:  # a stopped monitor has closed its devices; its store still has them
        return list(monitor.store.columns)
    options = monitor.options
    columns = list(catalog.names(catalog.TREE))
    if options.system:
        columns += catalog.names(catalog.MACHINE)
    return columns


def _figure(columns, x_title: str) -> go.Figure:
    """Empty subplots (shared x) with one line trace per chart trace of ``columns``."""
    rows, traces = traces_for(columns)
    fig = make_subplots(rows=max(1, len(rows)), cols=1, shared_xaxes=True, vertical_spacing=0.04)
    for trace in traces:
        fig.add_trace(go.Scatter(
            x=_EMPTY, y=_EMPTY, name=trace.label, mode="lines", meta=trace.column,
            line={"width": 1.3, "color": trace.color},
            hovertemplate=f"%{{y:.1f}} {trace.unit}<extra>{html.escape(trace.label)}</extra>"),
            row=trace.row, col=1)
    for number, row in enumerate(rows, start=1):
        fig.update_yaxes(title_text=row.title, rangemode="tozero", row=number, col=1)
    fig.update_xaxes(title_text=x_title, row=max(1, len(rows)), col=1)
    fig.update_layout(
        title={"x": 0.01, "y": 0.99, "yanchor": "top", "font": {"size": 14}},
        height=100 + ROW_PX * max(1, len(rows)), margin={"l": 60, "r": 20, "t": 70, "b": 40},
        template="plotly_white", hovermode="x unified",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0.0, "xanchor": "left",
                "font": {"size": 10}},
    )
    return fig


def record_html(monitor) -> str:
    """Static record of a monitor's current (or last) run: its summary table
    and an SVG timeline; plain HTML, no widget state or JavaScript."""
    summary = monitor.summary()._repr_html_()
    return f'<div class="nbmon-live-record">{summary}{svg_record_timeline(monitor.store)}</div>'


def write_html(monitor, path, *, title: str | None = None,
               budget_per_trace: int = 5000, overwrite: bool = True) -> str:
    """Write a self-contained, offline HTML page of the monitor's run: the
    static record and an interactive plotly chart of the whole run (x in
    seconds since the first sample held; plotly.js embedded). Returns ``path``.
    With ``overwrite=False`` an existing file is left alone (FileExistsError)."""
    import plotly.io as pio

    fig = _figure(_columns_of(monitor), "seconds since start")
    store = monitor.store
    if store is not None and len(store):
        columns = [trace.meta for trace in fig.data]
        frame = build_frame(store, columns, math.inf, budget_per_trace,
                            max_bytes=8 * budget_per_trace * max(1, len(columns)))
        t, _wall, _ = store.series([])
        span = np.float32(t[-1] - t[0]) if len(t) else np.float32(0.0)
        for trace, column in zip(fig.data, columns):
            x, y = frame.get(column, (_EMPTY, _EMPTY))
            trace.x = x + span
            trace.y = y
    name = title or "nbmon run"
    fig.update_layout(title_text=html.escape(name))
    plot = pio.to_html(fig, include_plotlyjs=True, full_html=False, config={"displaylogo": False})
    page = ('<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f'<title>nbmon: {html.escape(name)}</title></head>'
            '<body style="font-family:system-ui,sans-serif;margin:16px">'
            f'<h3 style="margin:0 0 8px">nbmon: {html.escape(name)}</h3>'
            f'{record_html(monitor)}{plot}</body></html>\n')
    # O_EXCL unless told: a caller that checked for the file long before
    # (nbmon run, before its command ran) must not truncate one made since.
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if overwrite else os.O_EXCL)
    with open(os.open(path, flags, 0o666), "w", encoding="utf-8") as f:  # the user's umask applies
        f.write(page)
    return path


class Dashboard:
    """Live plotly chart of a :class:`~nbmon.monitor.Monitor`.

    Rows: CPU % (tree and machine), memory MiB (tree RSS and machine used)
    and, when the monitor has GPUs, utilisation % and memory MiB per device;
    x is seconds before the newest sample, fixed to ``[-window_s, 0]``.
    ``widget`` is the FigureWidget to display. The refresher thread starts
    at once (``start=False`` to drive :meth:`refresh` by hand) and ends by
    itself, after a last refresh, once a monitor it saw running stops.
    Failed refreshes are counted in ``errors`` (the last in ``last_error``),
    never raised from the thread.
    """

    def __init__(self, monitor, window_s: float = 600.0, refresh_hz: float = 4.0,
                 budget_per_trace: int = DEFAULT_BUDGET, *, start: bool = True):
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
        self.refreshes = 0          # frames applied to the widget
        self.skipped = 0            # refreshes with nothing new
        self.errors = 0             # exceptions caught in the refresher thread
        self.last_error: str | None = None
        self.last_frame_bytes = 0
        self.frozen = False
        self._lock = threading.RLock()
        self._store = None
        self._seq = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

        self.widget = self._make_figure()
        self.columns = [trace.meta for trace in self.widget.data]

        if start:
            self.start()

    # -- figure ------------------------------------------------------------
    def _make_figure(self) -> go.FigureWidget:  # nbmon's FigureWidget: see there
        fig = _figure(_columns_of(self.monitor), "seconds before now")
        fig.update_xaxes(range=[-self.window_s, 0.0], autorange=False)
        fig.update_layout(title_text="waiting for samples…", uirevision="nbmon")
        return FigureWidget(fig)

    def _title(self, latest: dict) -> str:
        parts = [f"CPU {fmt(latest.get('proc_cpu_percent'), '%')}",
                 f"RSS {fmt(latest.get('proc_rss_mb'), 'MiB')}"]
        if "gpu_util_percent" in latest:
            parts.append(f"GPU {fmt(latest.get('gpu_util_percent'), '%')}")
            parts.append(f"GPU mem {fmt(latest.get('gpu_mem_used_mb'), 'MiB')}")
        text = " · ".join(parts)
        return text + " · stopped" if self.frozen else text

    # -- refreshing --------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Apply one frame of the store to the widget; False (and nothing sent)
        when no sample arrived since the last frame, unless ``force``."""
        with self._lock:
            store = self.monitor.store
            if store is None:
                return False
            seq = store.seq
            if not force and store is self._store and seq == self._seq:
                self.skipped += 1
                return False
            frame = build_frame(store, self.columns, self.window_s, self.budget_per_trace)
            latest = store.latest()
            fig = self.widget
            with fig.batch_update():
                for trace, column in zip(fig.data, self.columns):
                    x, y = frame.get(column, (_EMPTY, _EMPTY))
                    trace.x = x
                    trace.y = y
                fig.layout.title.text = self._title(latest)
            self._store, self._seq = store, seq
            self.refreshes += 1
            self.last_frame_bytes = frame_bytes(frame)
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

    def _refresh_counted(self) -> None:
        try:
            self.refresh()
        except Exception as err:  # never die, never print: count it
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"

    def _run(self, stop: threading.Event) -> None:
        period = 1.0 / self.refresh_hz
        seen_running = False
        while True:
            began = time.monotonic()
            running = bool(self.monitor.running)
            seen_running = seen_running or running
            self._refresh_counted()
            if seen_running and not running:
                # A sample taken just as the monitor stopped can land after the
                # refresh above; the monitor's stop() waits at most interval + 0.1 s
                # for its sampler, so one more refresh after that draws it.
                grace = min(1.0, float(getattr(self.monitor, "interval", 0.1)) + 0.1)
                if not stop.wait(grace):
                    self._refresh_counted()
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
    def freeze(self, timeout: float = 1.0) -> str:
        """Stop refreshing, draw the last frame, and return static HTML of the
        run: the summary table and an SVG timeline (no widget state needed)."""
        self.stop(timeout)
        self.frozen = True
        try:
            self.refresh(force=True)
        except Exception as err:
            self.errors += 1
            self.last_error = f"{type(err).__name__}: {err}"
        return self.static_html()

    def static_html(self) -> str:
        """The static record (summary table and SVG timeline) of the run."""
        return record_html(self.monitor)

    def close(self) -> str:
        """Freeze, then close the widget's comm; returns the static HTML."""
        record = self.freeze()
        self.widget.close()
        return record

    def _repr_mimebundle_(self, **kwargs):
        with self._lock:  # the widget's state is copied for display: not mid-frame
            return self.widget._repr_mimebundle_(**kwargs)
