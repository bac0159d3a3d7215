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
import re
import threading
import time

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .frames import DEFAULT_BUDGET, bucket_max, build_frame, frame_bytes
from .render import fmt_mib, fmt_plain, svg_timeline

__all__ = ["Dashboard", "THREAD_NAME", "frame_bytes", "record_html", "write_html"]

THREAD_NAME = "nbmon-live"
_EMPTY = np.empty(0, dtype=np.float32)
_ROW_PX = 170
_TIMELINE_POINTS = 600
_GPU_COLUMN = re.compile(r"gpu(\d+)_util_percent")


class FigureWidget(go.FigureWidget):  # the same name: callers check it
    # anywidget connects every widget whose _esm is a file to that file's
    # change signal, with a strong reference that close() does not drop:
    # each Dashboard (one per %resmon) would stay in memory for good. The
    # file's text as a plain string is the same module without the watch.
    _esm = str(go.FigureWidget._esm)


def _traces_for(columns, gpu_indices):
    """[(row, column, label, unit)] for the charts, in display order."""
    specs = [
        (1, "proc_cpu_percent", "CPU, process tree (100 = 1 core)", "%"),
        (1, "sys_cpu_percent", "CPU, machine (100 = all cores)", "%"),
        (2, "proc_rss_mb", "RSS, process tree", "MiB"),
        (2, "sys_mem_used_mb", "memory used, machine", "MiB"),
    ]
    for i in gpu_indices:
        specs.append((3, f"gpu{i}_util_percent", f"GPU {i} utilisation", "%"))
    for i in gpu_indices:
        specs.append((4, f"gpu{i}_mem_used_mb", f"GPU {i} memory used", "MiB"))
    if columns is None:
        return specs
    have = set(columns)
    return [s for s in specs if s[1] in have]


def _columns_of(monitor) -> tuple[list[int], list]:
    """(GPU indices, chart specs) for a monitor, started or not."""
    gpus = getattr(monitor, "gpus", None)
    indices = {int(getattr(d, "index", k)) for k, d in enumerate(gpus.devices)} if gpus else set()
    store = monitor.store
    if store is not None:  # a stopped monitor has closed its devices; its store still has them
        indices.update(int(m.group(1)) for m in map(_GPU_COLUMN.fullmatch, store.columns) if m)
        columns = list(store.columns)
    else:  # not started yet: the columns its sources will have
        columns = ["proc_cpu_percent", "proc_rss_mb"]
        if getattr(monitor, "system", True):
            columns += ["sys_cpu_percent", "sys_mem_used_mb"]
        columns += [f"gpu{i}_{f}" for i in sorted(indices) for f in ("util_percent", "mem_used_mb")]
    indices = sorted(indices)
    return indices, _traces_for(columns, indices)


def _figure(traces, gpus: bool, x_title: str) -> go.Figure:
    """Empty subplots (shared x) with one line trace per spec of :func:`_traces_for`."""
    rows = 4 if gpus else 2
    titles = ["CPU %", "memory MiB", "GPU util %", "GPU memory MiB"][:rows]
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.04)
    for row, column, label, unit in traces:
        fig.add_trace(go.Scatter(
            x=_EMPTY, y=_EMPTY, name=label, mode="lines", line={"width": 1.3}, meta=column,
            hovertemplate=f"%{{y:.1f}} {unit}<extra>{html.escape(label)}</extra>"),
            row=row, col=1)
    for row, title in enumerate(titles, start=1):
        fig.update_yaxes(title_text=title, rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text=x_title, row=rows, col=1)
    fig.update_layout(
        title={"x": 0.01, "y": 0.99, "yanchor": "top", "font": {"size": 14}},
        height=100 + _ROW_PX * rows, margin={"l": 60, "r": 20, "t": 70, "b": 40},
        template="plotly_white", hovermode="x unified",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.01, "x": 0.0, "xanchor": "left",
                "font": {"size": 10}},
    )
    return fig


def _timeline(store) -> str:
    """SVG timeline of everything the store holds (CPU, RSS, GPU when known)."""
    if store is None:
        return ""
    wanted = [("CPU", "proc_cpu_percent", " %"), ("RSS", "proc_rss_mb", " MiB"),
              ("GPU", "gpu_util_percent", " %")]
    wanted = [w for w in wanted if w[1] in store.columns]
    if not wanted:
        return ""
    t, _wall, values = store.series([c for _, c, _ in wanted])
    t, peaks = bucket_max(t, values, _TIMELINE_POINTS)
    series = {label: (peaks[c], unit) for label, c, unit in wanted
              if label != "GPU" or np.isfinite(peaks[c]).any()}
    return svg_timeline(t, series)


def record_html(monitor) -> str:
    """Static record of a monitor's current (or last) run: its summary table
    and an SVG timeline; plain HTML, no widget state or JavaScript."""
    summary = monitor.summary()._repr_html_()
    return f'<div class="nbmon-live-record">{summary}{_timeline(monitor.store)}</div>'


def write_html(monitor, path, *, title: str | None = None,
               budget_per_trace: int = 5000, overwrite: bool = True) -> str:
    """Write a self-contained, offline HTML page of the monitor's run: the
    static record and an interactive plotly chart of the whole run (x in
    seconds since the first sample held; plotly.js embedded). Returns ``path``.
    With ``overwrite=False`` an existing file is left alone (FileExistsError)."""
    import plotly.io as pio

    gpu_indices, traces = _columns_of(monitor)
    fig = _figure(traces, bool(gpu_indices), "seconds since start")
    store = monitor.store
    if store is not None and len(store):
        columns = [c for _, c, _, _ in traces]
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

        self.gpu_indices, self.traces = _columns_of(monitor)
        self.columns = [c for _, c, _, _ in self.traces]
        self.widget = self._make_figure()

        if start:
            self.start()

    # -- figure ------------------------------------------------------------
    def _make_figure(self) -> go.FigureWidget:  # nbmon's FigureWidget: see there
        fig = _figure(self.traces, bool(self.gpu_indices), "seconds before now")
        fig.update_xaxes(range=[-self.window_s, 0.0], autorange=False)
        fig.update_layout(title_text="waiting for samples…", uirevision="nbmon")
        return FigureWidget(fig)

    def _title(self, latest: dict) -> str:
        parts = [f"CPU {fmt_plain(latest.get('proc_cpu_percent', math.nan), ' %')}",
                 f"RSS {fmt_mib(latest.get('proc_rss_mb', math.nan))}"]
        if self.gpu_indices:
            parts.append(f"GPU {fmt_plain(latest.get('gpu_util_percent', math.nan), ' %')}")
            parts.append(f"GPU mem {fmt_mib(latest.get('gpu_mem_used_mb', math.nan))}")
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
