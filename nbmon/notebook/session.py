"""The kernel's monitoring session: one monitor, the per-cell history, the
last cell's summary. No IPython here, so scripts can read the history too.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from .. import catalog
from ..engine import Monitor, check_room
from ..format import fmt
from ..options import Options
from ..render import html_table, text_table
from ..senders import MONITOR, open_streams, sinks
from ..summary import ResourceSummary, headline
from ..tables import CellRecord, history_frame, samples_frame
from .charts import Record, record_timeline
from .kernel_watch import WATCH


MAX_RECORDS = 10_000   # cells the history keeps: the oldest go first


class Session:
    """``records``: the history, one :class:`~nbmon.tables.CellRecord` per
    monitored cell, the last MAX_RECORDS cells; the newest also keeps its
    window's statistics (``stats``), which its static record is drawn from."""

    def __init__(self):
        self.monitor: Monitor | None = None
        self.records: list[CellRecord] = []
        self.last: ResourceSummary | None = None

    def ensure_monitor(self, options: Options | None = None, *, start: bool = True) -> tuple[Monitor, bool]:
        """The running monitor, or a new one with ``options`` if none runs
        (started unless ``start`` is False: the caller starts it); the flag
        says whether this call made it."""
        if self.monitor is not None and self.monitor.running:
            return self.monitor, False
        check_room()   # StartError before anything is shown or sent (start=False: the caller starts it)
        self.monitor = Monitor(options=options)
        WATCH.attach(self.monitor)  # the memory warning and the black box (issue 20)
        if start:
            self.monitor.start()
        return self.monitor, True

    @contextmanager
    def cell(self, options: Options | None = None, *, label: str = "", execution_count=None,
             keep_running: bool = False, min_duration_s: float = 0.0):
        """Monitor one cell: yields its :class:`~nbmon.tables.CellRecord`,
        which on exit gets its ``summary`` (and ``stats``, its window's) and
        joins the history if it lasted at least ``min_duration_s``.
        ``options`` apply if no monitor runs yet."""
        monitor, started = self.ensure_monitor(options)
        span = monitor.window()
        record = CellRecord(execution_count, label, start_time=time.time(), t_open=span.t_open)
        try:
            yield record
        finally:
            record.summary = span.close()
            if started and not keep_running:
                monitor.stop()
            record.stats = span.window.stats()
            if not record.summary.duration_sec < min_duration_s:
                self._keep(record)
                self.last = record.summary

    def _keep(self, record: CellRecord) -> None:
        if self.records:
            self.records[-1].stats = None   # a column of statistics per metric: the newest cell's only
        self.records.append(record)
        del self.records[:-MAX_RECORDS]

    def stop(self) -> ResourceSummary | None:
        if self.monitor is None:
            return None
        self.monitor.stop()
        return self.monitor.summary()


SESSION = Session()


def monitor(options: Options | None = None, *, consumers=(), overwrite: bool = False, **settings) -> Monitor:
    """The notebook's monitor (the one ``%resmon`` shows), started with
    ``options`` and ``settings`` (e.g. ``interval=0.5``) if none runs yet.
    A setting named after a sink (nbmon.senders.SINKS: ``csv``, ``jsonl``)
    streams every sample to that file (an existing one is refused unless
    ``overwrite``); ``consumers`` (consumers, senders or callables) are
    attached too, either way, so a sink of your own gets the kernel's samples::

        nbmon.monitor(jsonl="kernel.jsonl")
        nbmon.monitor(consumers=[my_sender])
    """
    outputs = {name: settings.pop(name) for name in list(settings) if name in _SINK_NAMES}
    options = Options.of(options, **settings)   # refused before any file is made
    streams = open_streams({k: v for k, v in outputs.items() if v is not None}, overwrite,
                           "pass overwrite=True to replace it")
    running, _ = SESSION.ensure_monitor(options)
    for consumer in (*consumers, *streams):
        running.attach(consumer)
    return running


_SINK_NAMES = tuple(sink.name for sink in sinks(MONITOR))


def history(workers: bool = False):
    """pandas DataFrame, one row per monitored cell (the last 10,000): execution_count, label,
    start_time (UTC), duration_sec, status ('ok', 'failed', 'interrupted'),
    then the ResourceSummary fields (units in their names: _mb is MiB);
    GPU columns only when some cell has a GPU figure. ``workers=True``: one
    row per cell and worker of a watched Dask cluster (:mod:`nbmon.dask`)."""
    if workers:
        from .. import dask

        frame = dask.history()
    else:
        frame = history_frame(SESSION.records)
    empty = [c for c in frame.columns if "gpu" in c and frame[c].isna().all()]
    return frame.drop(columns=empty)


def samples(workers: bool = False):
    """pandas DataFrame of the current (or last) monitor's samples, indexed by
    UTC time; one column per metric, units in the names. ``workers=True``:
    every worker's samples of a watched Dask cluster, long (:mod:`nbmon.dask`)."""
    if workers:
        from .. import dask

        return dask.samples()
    return samples_frame(SESSION.monitor.store if SESSION.monitor else None)


def last_summary() -> ResourceSummary | None:
    """The ResourceSummary of the last monitored cell (None before any)."""
    return SESSION.last


def cell_record(record: CellRecord, monitor: Monitor | None) -> Record:
    """The static record of one cell: its summary table, the timeline's
    legend in it, and the timeline picture (None for fewer than two samples)."""
    s, status = record.summary, record.status
    title = "nbmon" + (f" · {record.label}" if record.label else "")
    if status != "ok":
        title += f" · {status}"
    timeline = None
    if monitor is not None and s.num_samples > 1:
        timeline = record_timeline(monitor.store, record.stats, record.t_open)
    rows = s.rows() + ([timeline.legend] if timeline is not None else [])
    return Record(html_table(title, rows, status=status), text_table(title, rows), timeline)


def one_line(record: CellRecord) -> str:
    """Auto mode's line for a cell: its duration, then the headline
    metrics (``catalog.headlines()``) by the statistic each summarises a
    window with (the mean CPU, the peak memory), and how it ended unless ok."""
    figures = record.summary.figures
    values = {m.name: figures[key] for m in catalog.headlines()
              if figures.get(key := catalog.figure_key(m.summary, m.name)) is not None}
    parts = [f"nbmon: {fmt(record.duration_sec, 's')}", headline(values)]
    if record.status != "ok":
        parts.append(record.status)
    return " · ".join(part for part in parts if part)
