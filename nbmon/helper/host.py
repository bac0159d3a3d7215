"""The notebook's session, wherever it runs: its monitor, the cells' history,
the live views, the memory warning and the black box.

:class:`SessionHost` runs in a helper process by default
(:mod:`nbmon.helper.serve`, driven through :mod:`nbmon.kernel.remote`),
so that the kernel holds none of it: no numpy, plotly, widgets or history
for its cyclic garbage collector to walk on every full collection, no
sampler thread to share its GIL with. With ``--session kernel`` it runs in
the kernel itself. Either way the kernel talks to it in plain data: options
as dicts, summaries as ``ResourceSummary.to_dict()``, outputs as
mimebundles (``{"data": ..., "metadata": ...}``) the kernel displays, with
display ids the host updates later through its ``outlet``:
``outlet.update(display_id, bundle)`` re-sends an output,
``outlet.say(text)`` prints a line in the running cell. Widgets (the live
chart, a cell's meter) are made here; their comms reach the page through
whatever ``comm.create_comm`` is (ipykernel's in the kernel, a pipe to the
kernel in the helper).

Sampling paces itself: every ``interval`` while a cell runs, every
:data:`REST_S` between cells (the kernel's cell hooks say which), so an
open dashboard costs next to nothing while nothing runs.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid

from .. import catalog
from ..catalog import DELTA
from ..postmortem import deaths
from ..postmortem.blackbox import SLOTS, BlackBox, CellNote
from ..engine import Monitor
from ..format import fmt, printable
from ..postmortem.memguard import MemoryGuard, stop_text
from ..postmortem.memwarn import MemoryWatch
from ..options import RECORD_OPEN_AFTER_S, RECORD_OPEN_MEMORY_MB, Options
from ..report.notebooks import RECORD_MIME, postmortem_data, record_data
from ..report.render import html_table, text_table
from ..private import fallback_note
from ..sinks.senders import open_streams
from ..sampling.store import BUCKET, Store
from ..report.summary import ResourceSummary, labelled_headline, summarize
from ..report.records import CellRecord, vs_last
from ..values import NAN
from ..report.variables import Variables
from ..views.charts import Record, record_timeline
from .protocol import HostCalls, HostNotes

MAX_RECORDS = 10_000   # cells the history keeps: the oldest go first
REST_S = 1.0           # seconds between samples while no cell runs
METER_AFTER_S = 0.5    # a %%resmon cell's live meter shows once it has run this long


def bundle(output) -> dict:
    """An output as plain data: what its ``_repr_mimebundle_`` gives (a
    widget's: its data alone), else its HTML and text (a ResourceSummary)."""
    if not hasattr(output, "_repr_mimebundle_"):
        return {"data": {"text/html": output._repr_html_(), "text/plain": str(output)}, "metadata": {}}
    got = output._repr_mimebundle_()
    data, metadata = got if isinstance(got, tuple) else (got, {})
    return {"data": data, "metadata": metadata or {}}


class _Handle:
    """What a live view updates its displayed record through (IPython's
    DisplayHandle's ``update``): the host's outlet, by display id."""

    def __init__(self, outlet, display_id: str):
        self.outlet, self.display_id = outlet, display_id

    def update(self, output) -> None:
        self.outlet.update(self.display_id, bundle(output))


class _OpenCell:
    """A monitored cell while it runs: its record, its span, its meter (and
    the timer that shows it)."""

    def __init__(self, record: CellRecord, span, min_duration_s: float):
        self.record, self.span, self.min_duration_s = record, span, min_duration_s
        self.meter = self.feed = self.timer = None
        self.closed = False


@dataclasses.dataclass
class ClusterCopy:
    """The helper's copy of a kernel's Dask watch (:class:`nbmon.dask.client.Watch`),
    all its live view reads: the workers' stores, fed with the events the
    kernel passes on, how often they batch, and whether the watch runs."""

    collector: object
    every_s: float
    running: bool = True


def _closed(views: list) -> list[dict]:
    """Each live view in ``views`` (view, table's display id, picture's)
    closed, not just frozen (an open widget stays in ipywidgets' registry),
    and emptied: their final outputs (static records), by display id."""
    finals = []
    for view, table_id, picture_id in views:
        final = view.close()
        finals.append({"ids": [table_id, picture_id], "table": bundle(final.table()),
                       "picture": bundle(final.picture())})
    views.clear()
    return finals


class SessionHost(HostCalls, HostNotes):
    """The session of one kernel (``pid``). ``outlet`` carries what the host
    sends on its own (display updates, warnings); ``kernel``: the outputs
    are in a kernel's front end, where updates replace them in place (a
    terminal prints each update anew: there a record is shown once, and
    replaced at stop only)."""

    def __init__(self, pid: int, outlet, *, kernel: bool):
        self.pid, self.outlet, self.kernel = pid, outlet, kernel
        self.monitor: Monitor | None = None
        self._guard: MemoryGuard | None = None   # the monitor's memory guard: called at once as a cell starts
        self.records: list[CellRecord] = []
        # {source digest: (duration_sec, peak_mem_mb)} of each source's last kept run, oldest first
        self.runs: dict[str, tuple[float, float]] = {}
        self.last: ResourceSummary | None = None
        self.note = CellNote()   # the running cell, for the black box and the memory warning
        self.bands: list[dict] = []   # cell executions while a dashboard shows
        self.views: list[tuple] = []   # (Dashboard, table display id, picture display id)
        self.kernels_views: list = []   # nbmon.views.kernels.KernelsView, live
        self.cluster: ClusterCopy | None = None   # the watched Dask cluster's events, as the kernel passes them on
        self.cluster_views: list[tuple] = []   # (ClusterView, table display id, picture display id)
        self._cells: dict[int, _OpenCell] = {}
        self._tokens = 0
        self._owner = ""   # what started the monitor: "auto" stops it with auto mode
        self._lock = threading.Lock()   # a cell's end, and its meter's timer
        self.pending: list | None = None   # served from a helper: what calls left for after their answers
        self._unstarted = False   # the newest view's monitor waits for view_start()

    # -- start-up -----------------------------------------------------------------
    def hello(self) -> dict:
        """At ``%load_ext``: the post-mortem of this notebook's last kernel if it
        died unseen (its outputs), any problem reading it, and which private
        place nbmon's files go to when the first one was taken (``note``)."""
        try:
            death, problem = deaths.claim()
            record = death_record(death) if death is not None else None
        except Exception as err:  # noqa: BLE001 - never let a post-mortem stop the extension loading
            record, problem = None, f"{type(err).__name__}: {err}"
        outputs = []
        if record is not None:
            outputs.append(bundle(record.table()))
            outputs[-1]["data"][RECORD_MIME] = postmortem_data(death.to_dict())
            if record.timeline is not None:
                outputs.append(bundle(record.picture()))
        return {"outputs": outputs, "problem": problem, "note": fallback_note()}

    # -- the monitor --------------------------------------------------------------
    def _monitor(self, options: dict | None, owner: str) -> tuple[Monitor, bool]:
        """The running monitor, or a new one with ``options`` (not started
        yet), with its memory warning and black box; True if made here."""
        if self.monitor is not None and self.monitor.running:
            return self.monitor, False
        # Sampled from a thread of the host's process by default (Options.backend): the helper
        # is the process no GIL-held call of the kernel's can stall.
        monitor = Monitor(self.pid, options=Options(**options) if options else Options())
        self._guard = watch_kernel(monitor, self.note, self.outlet.say, self.outlet.stop_cell)
        self.monitor, self._owner = monitor, owner
        return monitor, True

    def _run(self, monitor: Monitor) -> None:
        monitor.start()
        monitor.rest(not self.note.running(), REST_S)

    def _ensure(self, options: dict | None, owner: str = "") -> bool:
        """Start the session's monitor with ``options`` unless one runs; True if this call did."""
        monitor, made = self._monitor(options, owner)
        if made:
            self._run(monitor)
        return made

    def start(self, options: dict | None = None, outputs: dict | None = None, force: bool = False,
              owner: str = "") -> dict:
        """The session's monitor, started with ``options`` if none runs;
        every sample streamed to the files ``outputs`` names ({sink: path},
        refused before anything starts if one exists and not ``force``)."""
        streams = open_streams(outputs or {}, force, "pass overwrite=True to replace it")
        made = self._ensure(options, owner)
        for stream in streams:
            self.monitor.attach(stream)
        return {"made": made, **self.info()}

    def info(self) -> dict:
        """The monitor's state, the live views shown, and the host's own
        threads (in the helper, they are not the kernel's to list)."""
        monitor = self.monitor
        out = {"running": False, "views": len(self.views), "open_cells": len(self._cells),
               "charts": sum(view.widget is not None for view, *_ in self.views),   # views whose chart is built
               "cluster_views": len(self.cluster_views),
               # the workers whose batches the cluster's copy holds
               "cluster_workers": sorted(f.address for f in self.cluster.collector.workers()
                                         if f.store is not None and len(f.store)) if self.cluster else [],
               "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("nbmon-"))}
        if monitor is not None:
            out.update(running=monitor.running, interval=monitor.interval, pid=monitor.pid, peaks=monitor.peaks,
                       gpu_state=monitor.gpu_state, gpu_count=monitor.gpu_count,
                       samples=monitor.store.seq if monitor.store is not None else 0)
        out["variables"] = self.sizing()
        return out

    def sizing(self) -> bool:
        """Whether the kernel should size its variables at each cell's end:
        a monitor runs, with ``variables`` on (the kernel learns it from
        the answers that start or stop one)."""
        monitor = self.monitor
        return monitor is not None and monitor.running and monitor.options.variables

    def stop(self) -> dict:
        """Stop the monitor: each live view's final outputs (its static
        record, by display id), and the run's summary (a bundle to show, and
        as a dict)."""
        summary = None
        for token in list(self._cells):   # opened for a cell whose end never came (its kernel gave up waiting)
            self.cell_close(token, "interrupted")
        if self.monitor is not None:
            self.monitor.stop()
            summary = self.monitor.summary()
        finals = _closed(self.views)
        self.bands.clear()
        self._owner = ""
        return {"views": finals, "summary": bundle(summary) if summary is not None else None,
                "run": summary.to_dict() if summary is not None else None}

    def stop_auto(self) -> bool:
        """Auto mode ended: the monitor stops if auto mode started it and no
        view shows it. Whether the kernel still sizes its variables."""
        if self._owner == "auto" and not self.views and self.monitor is not None:
            self.monitor.stop()
            self._owner = ""
        return self.sizing()

    def summary(self) -> dict | None:
        return self.monitor.summary().to_dict() if self.monitor is not None else None

    def status(self, auto: bool) -> str:
        monitor = self.monitor
        if monitor is None:
            return "nbmon: not started (%resmon to start)"
        lines = [f"nbmon: {'running' if monitor.running else 'stopped'}, every {monitor.interval:g} s "
                 f"(every {REST_S:g} s between cells), "
                 f"{monitor.store.seq if monitor.store is not None else 0} samples, pid {monitor.pid}",
                 f"peaks: {monitor.peaks}",
                 f"GPU: {monitor.gpu_state}",
                 f"auto: {'on' if auto else 'off'}",
                 f"cells in history: {len(self.records)}"]
        for fault in monitor.faults.values():   # errors in their own words: from anywhere
            lines.append(printable(f"fault: {fault.source} failed {fault.count} time(s), first: {fault.first_error}"))
        return "\n".join(lines)

    # -- cells --------------------------------------------------------------------
    def cell_started(self, number: int | None, label: str, source: str = "") -> None:
        """The kernel's pre_run_cell (``label``: the cell's first line;
        ``source``: its source's digest, for the memory guard's foresight):
        the black box names it, the dashboards band it, the monitor samples
        at its interval until it ends."""
        self.note.started(number, label, source)
        if self.monitor is not None:
            self.monitor.rest(False)
            if self._guard is not None:   # a cell may grow fast from its first step
                self.monitor.hurry(self._guard)
            if self.views:
                from ..views.dashboard import keep_cells

                now = self.monitor.clock()
                keep_cells(self.bands, now, max(view.window_s for view, *_ in self.views))
                self.bands.append({"id": uuid.uuid4().hex[:12], "n": number, "label": label, "t0": now, "t1": None})

    def cell_finished(self, number: int | None, variables: dict | None = None) -> None:
        """The kernel's post_run_cell; ``variables``: its namespace at the
        cell's end (:meth:`Variables.to_dict`), for the black box, unless
        the cell's own close brought them."""
        self.note.finished()
        if variables is not None:
            self.note.hold(Variables.from_dict(variables).for_box(number))
        monitor = self.monitor
        if monitor is None:
            return
        if self.bands and self.bands[-1]["t1"] is None:
            band = self.bands[-1]
            band["t1"] = monitor.clock()
            band["n"] = number if number is not None else band["n"]
            labelled = [r for r in self.records[-1:] if r.label and r.t_open >= band["t0"]]
            if labelled:
                band["label"] = labelled[0].label
        for view, *_ in self.views:
            view.cell_ended()
        monitor.rest(True)

    def cell_open(self, options: dict | None = None, *, label: str = "", number: int | None = None,
                  meter: bool = False, min_duration_s: float = 0.0, token: str | None = None,
                  kernel_rss_mb: float | None = None) -> dict:
        """A monitored cell starts: its span opens (a sample now). With
        ``meter``, a cell still running after :data:`METER_AFTER_S` gets its
        live meter, displayed with the answer's ``meter_id`` (a quick cell
        does not pay for one). ``token``: the caller's name for the cell
        (one that waits for no answer), else the answer gives one;
        ``kernel_rss_mb``: the kernel's RSS as the cell started, where that
        was before this call (:meth:`~nbmon.engine.Monitor.window`)."""
        self._ensure(options, "cell")
        self.monitor.rest(False)
        span = self.monitor.window(kernel_rss_mb)
        record = CellRecord(number, label, start_time=time.time(), t_open=span.t_open,
                            source_digest=self.note.source if self.note.running() else "")
        if token is None:
            self._tokens += 1
            token = self._tokens
        cell = self._cells[token] = _OpenCell(record, span, min_duration_s)
        meter_id = None
        if meter:
            meter_id = uuid.uuid4().hex
            cell.timer = threading.Timer(METER_AFTER_S, self._show_meter, (cell, meter_id))
            cell.timer.daemon = True
            cell.timer.name = "nbmon-meter"
            cell.timer.start()
        return {"token": token, "t_open": span.t_open, "start_time": record.start_time, "meter_id": meter_id,
                "variables": self.sizing()}

    def cell_open_note(self, token: str, number: int | None, min_duration_s: float, kernel_rss_mb: float,
                       options: dict | None = None, label: str = "") -> None:
        """:meth:`cell_open` as a note, the kernel waiting for nothing: auto
        mode's cells, and quiet ``%%resmon`` cells once a monitor runs. The
        cell may be well under way when it is read: ``kernel_rss_mb``, read
        by the kernel as it started, says where its memory began."""
        self.cell_open(options, label=label, number=number, min_duration_s=min_duration_s, token=token,
                       kernel_rss_mb=kernel_rss_mb)

    def cell_close_note(self, token: str, status: str, number: int | None, variables: dict | None) -> None:
        """:meth:`cell_close` as a note, for a cell nothing is shown of: a
        quiet one, or auto mode's shorter than its threshold by the kernel's
        clock (kept only if the host's clock says otherwise)."""
        self.cell_close(token, status, number=number, variables=variables)

    def _show_meter(self, cell: _OpenCell, meter_id: str) -> None:
        from ..views.meter import Meter, MeterFeed

        with self._lock:
            if cell.closed:
                return
            cell.meter = Meter(label=cell.record.label or f"cell {cell.record.execution_count}")
            cell.feed = MeterFeed(cell.meter, self.monitor)
            self.outlet.show(meter_id, bundle(cell.meter))

    def cell_close(self, token: int | str, status: str = "ok", *, show: str = "", extra_html: str = "",
                   number: int | None = None, variables: dict | None = None) -> dict:
        """A monitored cell ended with ``status``; kept in the history unless
        shorter than its ``min_duration_s``; ``variables``: the kernel's
        namespace at its end (:meth:`Variables.to_dict`), for its summary
        and the black box. The answer says whether it was
        kept, whether its meter showed (``meter_shown``), and
        for ``show`` "summary" its summary (a dict), for "record" that and
        its record's outputs (``extra_html`` added to the table), for "line"
        (a kept cell) that and auto mode's line. Otherwise its summary is
        made once the answer is sent (:meth:`after`), and for a cell kept
        whatever its length its last sample too: a quiet cell's kernel waits
        for neither."""
        cell = self._cells.pop(token, None)
        if cell is None:   # its open (a note) failed, and said nothing: neither does its close
            return {"kept": False, "meter_shown": False}
        with self._lock:
            cell.closed = True
        if cell.timer is not None:
            cell.timer.cancel()
        if not self._cells and not self.note.running():   # run outside the cell hooks (run_cell_magic)
            self.monitor.rest(True)
        record = cell.record
        record.status = status
        if number is not None:   # auto mode's cells: the prompt number as the front end got it
            record.execution_count = number
        if variables is not None:
            record.variables = Variables.from_dict(variables)
            self.note.hold(record.variables.for_box(record.execution_count))
        out = {"kept": True, "meter_shown": cell.meter is not None}
        if not show and not cell.min_duration_s:
            self._later(lambda: self._end(cell) and self._summarize(record))
            return out
        out["kept"] = kept = self._end(cell)
        if not (show and kept or show == "summary"):
            if kept:
                self._later(lambda: self._summarize(record))
            return out
        self._summarize(record)
        out["summary"] = record.summary.to_dict()
        if show == "record":
            shown = cell_record(record, self.monitor)
            out["table"] = {"data": {"text/html": shown.html + extra_html, "text/plain": shown.text,
                                     RECORD_MIME: record_data(record, "cell")}, "metadata": {}}
            out["picture"] = bundle(shown.picture()) if shown.timeline is not None else None
        elif show == "line":
            # the line's data, kept in the saved notebook (the kernel adds it to the line it shows)
            out["line"], out["data"] = one_line(record), {RECORD_MIME: record_data(record, "line")}
        return out

    def _end(self, cell: _OpenCell) -> bool:
        """A closed cell's last sample and statistics; whether the history keeps it."""
        record = cell.record
        if cell.span.window.closed is None:
            self.monitor.sample_now()   # the cell's last sample
        record.stats = cell.span.window.close()
        if cell.feed is not None:
            cell.feed.finish("done" if record.status == "ok" else record.status)
            cell.meter.close()
        kept = not record.stats.duration < cell.min_duration_s
        if kept:
            self._keep(record)
        return kept

    def _summarize(self, record: CellRecord) -> None:
        if record.summary is None:
            record.summary = dataclasses.replace(summarize(record.stats), variables=record.variables)
            record.variables = None
            self._ran(record)
            if self.records and self.records[-1] is record:
                self.last = record.summary

    def _ran(self, record: CellRecord) -> None:
        """Note a summarized cell's run: the last run of its source, if any,
        becomes its ``last_run``; it becomes its source's last run."""
        digest = record.source_digest
        if not digest:
            return
        record.last_run = self.runs.pop(digest, None)   # popped: re-added as the newest
        self.runs[digest] = (record.summary.duration_sec, record.summary.peak_mem_mb)
        if len(self.runs) > MAX_RECORDS:
            del self.runs[next(iter(self.runs))]

    def _later(self, work) -> None:
        """``work`` once the answer is sent, where the host is served from a
        helper (:meth:`after`); at once where the caller waits anyway."""
        if self.pending is None:
            work()
        else:
            self.pending.append(work)

    def after(self) -> None:
        """Do what calls left for after their answers (cells' summaries)."""
        while self.pending:
            self.pending.pop(0)()

    def last_summary(self) -> dict | None:
        """The last monitored cell's summary (None before any)."""
        self.after()
        return self.last.to_dict() if self.last is not None else None

    def _keep(self, record: CellRecord) -> None:
        if self.records:
            self._summarize(self.records[-1])   # before its statistics go
            self.records[-1].stats = None   # a column of statistics per metric: the newest cell's only
        self.records.append(record)
        del self.records[:-MAX_RECORDS]

    def history(self) -> list[dict]:
        """The history's rows: each cell's fields and its summary as a dict."""
        self.after()
        return [{"execution_count": r.execution_count, "label": r.label, "start_time": r.start_time,
                 "t_open": r.t_open, "status": r.status, "summary": r.summary.to_dict(), "last_run": r.last_run}
                for r in self.records]

    def samples(self) -> dict:
        """Every sample the store holds: its columns, and t, wall and each
        column as float64 ``buffers``."""
        store = self.monitor.store if self.monitor is not None else None
        if store is None:
            return {"columns": []}
        t, wall, values = store.series()
        return {"columns": list(values),
                "buffers": [t.tobytes(), wall.tobytes(), *(column.tobytes() for column in values.values())]}

    # -- live views -----------------------------------------------------------------
    def view_open(self, options: dict | None = None, window_s: float = 600.0, own_output: bool = False) -> dict:
        """A live dashboard of the session's monitor (made, not started,
        if none runs): its record's outputs to display now, with the display
        ids its updates use; :meth:`view_start` then starts both. With
        ``own_output`` a third, empty at first: the chart as a widget view
        once it is made, empty again once it stops (a front end whose widget
        manager makes models only for widget views, each output in a frame
        of its own: Colab)."""
        from ..views.dashboard import Dashboard

        monitor, self._unstarted = self._monitor(options, "view")
        sizing = monitor.options.variables   # once view_start() has started it
        # plotly's FigureWidget only where the user's code can reach it: in the kernel, not in a helper.
        view = Dashboard(monitor, window_s=window_s, cells=self.bands, build=False, start=False,
                         plotly=self.pid == os.getpid())
        ids = [uuid.uuid4().hex for _ in range(3 if own_output else 2)]
        if self.kernel:
            view.handle, view.picture_handle = _Handle(self.outlet, ids[0]), _Handle(self.outlet, ids[1])
            if own_output:
                view.chart_handle = _Handle(self.outlet, ids[2])
        self.views.append((view, ids[0], ids[1]))
        return {"ids": ids, "table": bundle(view), "picture": bundle(view.picture()), "variables": sizing,
                **({"chart": {"data": {"text/plain": ""}, "metadata": {}}} if own_output else {})}

    def view_start(self) -> None:
        """Start the newest view, and the monitor it was made for."""
        if self.kernel:
            from ..views.live import push_bundle

            push_bundle()   # plotly's bundle to the page now: it imports it while the run starts
        if self._unstarted:
            self._unstarted = False
            self._run(self.monitor)
        self.views[-1][0].start()

    # -- a watched Dask cluster (nbmon.dask: the watch is the kernel's, its live view is drawn here) --
    def cluster_begin(self, key: str, t0: float, expected: int, max_bytes: int, every_s: float) -> None:
        """A watch starts: its events follow (:meth:`cluster_event`), sealed with ``key`` (hex)."""
        from ..dask.feeds import Collector

        collector = Collector(bytes.fromhex(key), max_bytes, t0)
        collector.expected = expected
        self.cluster = ClusterCopy(collector, every_s)

    def cluster_event(self, envelope: dict, arrived: float) -> None:
        """An event of the watch's topic, as the kernel received it (:func:`nbmon.dask.wire.as_text`)."""
        from ..dask.wire import from_text

        if self.cluster is not None:
            self.cluster.collector.handle(envelope, arrived, opened_from=from_text)

    def cluster_view(self, window_s: float) -> dict:
        """The watched cluster's live view: its record's outputs to display
        now, with the display ids its updates use; :meth:`cluster_view_start`
        then starts it."""
        from ..views.cluster import ClusterView

        if self.cluster is None:
            raise RuntimeError("no Dask cluster is watched")
        view = ClusterView(self.cluster, window_s=window_s, start=False)
        ids = [uuid.uuid4().hex for _ in range(2)]
        if self.kernel:
            view.handle, view.picture_handle = _Handle(self.outlet, ids[0]), _Handle(self.outlet, ids[1])
        self.cluster_views.append((view, *ids))
        return {"ids": ids, "table": bundle(view), "picture": bundle(view.picture())}

    def cluster_view_start(self) -> None:
        if self.kernel:
            from ..views.live import push_bundle

            push_bundle()   # plotly's bundle to the page now: it imports it while the chart is built
        self.cluster_views[-1][0].start()

    def cluster_end(self) -> dict:
        """The watch stopped (its last batches passed on): each cluster view's
        final outputs (its static record, by display id)."""
        if self.cluster is not None:
            self.cluster.running = False
        finals = _closed(self.cluster_views)
        self.cluster = None
        return {"views": finals}

    def kernels_view(self) -> dict:
        """Every Jupyter kernel of this user (``%resmon kernels``): the
        table's record to display now, by its display id; in a kernel's front
        end a live table mounts into it (:mod:`nbmon.views.kernels`), read
        while a page shows it."""
        from ..views.kernels import KernelsView

        display_id = uuid.uuid4().hex
        view = KernelsView(self.pid, update=lambda bundle: self.outlet.update(display_id, bundle))
        if self.kernel:
            view.start()
            self.kernels_views.append(view)
        else:
            view.close()
        return {"id": display_id, "record": view.record()}

    def close(self) -> None:
        """The kernel exits (or unloads nbmon, after :meth:`stop`): the
        threads stop and the monitor's run ends (its black box goes with it).
        Nothing is said to the page: a chart left open there is marked no
        longer live, as it would be were the session in the kernel."""
        for view, *_ in self.views:
            view.stop()
        for kernels in self.kernels_views:
            kernels.close()
        if self.monitor is not None:
            self.monitor.stop()


def watch_kernel(monitor: Monitor, note: CellNote, say=None, stop=None) -> MemoryGuard | None:
    """Give ``monitor`` (not started yet) the kernel's memory warning (its
    lines to ``say``), memory guard (its stops to ``stop``; returned) and
    black box (``note`` names the running cell)."""
    watch = MemoryWatch(monitor.pid, monitor.options.memory_warning_percent, say=say, running_cell=note.running)
    guard = None
    if stop is not None:
        guard = monitor.attach(MemoryGuard(monitor.pid, monitor.options.memory_guard_percent,
                                           stop=lambda number, level: stop(number, stop_text(level)),
                                           running_cell=note.running, say=say))
    monitor.attach(watch)   # first: the box reads what it has just read
    monitor.attach(BlackBox(note, watch, pid=monitor.pid, guard=guard.percent if guard is not None else None))
    return guard


def says_more(record: CellRecord) -> bool:
    """Whether a cell's record is worth its full table and timeline open
    (:data:`~nbmon.options.RECORD_OPEN_AFTER_S`, ``RECORD_OPEN_MEMORY_MB``):
    it failed, it was long, its memory rose by much (at its peak or its
    end: a free is good news, and the line says it), or the container's
    OOM killer acted."""
    s = record.summary
    growth = (s.figures or {}).get(catalog.figure_key(DELTA, "proc_pss_mb"))
    rise = s.peak_rise_mb
    return (record.status != "ok" or s.duration_sec >= RECORD_OPEN_AFTER_S or bool(s.oom_kills)
            or any(v is not None and v >= RECORD_OPEN_MEMORY_MB for v in (growth, rise)))


def cell_record(record: CellRecord, monitor: Monitor | None) -> Record:
    """The static record of one cell: its line, and under it its summary
    table with the timeline's legend, and the timeline picture (None for
    fewer than two samples). A record that says little (:func:`says_more`)
    is its line, the table one click away, and has no picture."""
    s, status = record.summary, record.status
    opened = says_more(record)
    timeline = None
    if opened and monitor is not None and s.num_samples > 1:
        timeline = record_timeline(monitor.store, record.stats, record.t_open)
    rows = s.rows() + ([timeline.legend] if timeline is not None else [])
    line = one_line(record)
    return Record(html_table(line, rows, status=status, folded=not opened),
                  text_table(line, rows) if opened else line, timeline)


def one_line(record: CellRecord) -> str:
    """A cell's record in a line (auto mode's, a short ``%%resmon`` cell's):
    its duration, then the headline metrics (``catalog.headlines()``), each
    figure labelled ("mean", "peak", "now", a growth by its sign), how it
    ended unless ok, and how it compares with the last run of its source."""
    name = "nbmon" + (f" · {record.label}" if record.label else "")
    parts = [f"{name}: {fmt(record.duration_sec, 's')}", labelled_headline(record.summary.figures or {})]
    if record.status != "ok":
        parts.append(record.status)
    if record.last_run is not None:
        longer, higher = vs_last(record)
        parts.append(f"vs its last run: {fmt(longer, 's', True)}, peak {fmt(higher, 'MiB', True)}")
    return " · ".join(part for part in parts if part)


def death_record(death: deaths.Death) -> Record:
    """The post-mortem as a record like a ``%%resmon`` cell's: the table, the
    timeline's legend in it, and the timeline of the box's last minute (its
    records, in a store of their own)."""
    columns = list(dict.fromkeys(name for _, values in death.records for name in values))
    timeline = None
    if columns:
        store = Store(columns, max_bytes=8 * max(SLOTS, 8 * BUCKET) * (len(columns) + 2))
        window = store.open_window()
        for wall, values in death.records:
            store.append(wall, wall, [values.get(c, NAN) for c in columns])
        timeline = record_timeline(store, window.stats())
    title, rows = death.title(), death.rows() + ([timeline.legend] if timeline is not None else [])
    return Record(html_table(title, rows, status="failed"), text_table(title, rows), timeline)
