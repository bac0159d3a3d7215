"""pandas DataFrames of samples and of per-cell history (pandas imported
lazily), and the record of one monitored cell that the history is made of."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import catalog
from .summary import COUNTS_FROM_WINDOW, FROM_WINDOW, ResourceSummary
from ..values import MIB, NAN

if TYPE_CHECKING:
    from ..sampling.store import Stats
    from .variables import Variables


def samples_frame(t, wall, values: dict):
    """Samples (a store's ``series()``: monotonic and epoch seconds, and
    {column: values}) indexed by UTC time (column ``time``), with
    ``elapsed_s`` since the first and one column per metric (units in the
    names). Samples older than a store's ring are min/max pairs per bucket."""
    import pandas as pd

    if not len(wall):
        return pd.DataFrame(index=pd.DatetimeIndex([], name="time", tz="UTC"))
    frame = pd.DataFrame(values, index=pd.to_datetime(wall, unit="s", utc=True))
    frame.index.name = "time"
    frame.insert(0, "elapsed_s", t - t[0] if len(t) else t)
    return frame


# Per-cell columns before the summary's own fields: CellRecord's, then how the cell compares with
# the last run of the same source in the session (NaN for its first run).
HISTORY_COLUMNS = ("execution_count", "label", "start_time", "duration_sec", "status")
VS_LAST_COLUMNS = ("duration_vs_last_sec", "peak_mem_vs_last_mb")


@dataclass(eq=False, slots=True)
class CellRecord:
    """One monitored cell (a ``%%resmon`` cell, or one auto mode kept): a
    row of ``nbmon.history()``. Made when the cell starts; the cell's
    monitor fills in ``summary`` when it ends, the magic ``status``."""

    execution_count: int | None     # its prompt number (None outside a numbered cell)
    label: str                      # --label, or ""
    start_time: float               # epoch s when it started
    t_open: float                   # the monitor's clock when its span opened (the live chart's bands)
    status: str = "ok"              # "ok", "failed", "interrupted"; a worker's row: "no answer" too
    summary: ResourceSummary | None = None   # once it ended
    stats: Stats | None = None      # its window's statistics, for its static record: the newest cell's only
    workers: tuple[WorkerCellRecord, ...] = ()   # the cell on each watched Dask worker
    variables: Variables | None = None   # the kernel's variables at its end, until its summary holds them
    source_digest: str = ""         # its source's digest: the runs of one cell in a session share it
    last_run: tuple[float, float] | None = None   # (duration_sec, peak_mem_mb) of this source's last kept run

    @property
    def duration_sec(self) -> float:
        return self.summary.duration_sec if self.summary is not None else NAN

    def ended_with(self, error: BaseException | None) -> None:
        """Set the status from how the cell's code ended (None: it ran through)."""
        if error is not None:
            self.status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"


@dataclass(eq=False, slots=True)
class WorkerCellRecord(CellRecord):
    """A cell on one Dask worker: a row of ``nbmon.history(workers=True)``."""

    worker: str = ""
    host: str = ""

    @classmethod
    def on(cls, record: CellRecord, worker: str, host: str, summary: ResourceSummary) -> "WorkerCellRecord":
        """``record``'s cell on ``worker``: its summary there (none came: status 'no answer')."""
        status = record.status if summary.num_samples > 0 else "no answer"
        return cls(record.execution_count, record.label, record.start_time, record.t_open, status, summary,
                   worker=worker, host=host)


def recorded_figures() -> list[str]:
    """The figures a record shows that no ResourceSummary field holds (a
    metric added to the catalog with a row of its own): history() has a
    column for each, named by :func:`nbmon.catalog.figure_key`."""
    held = {catalog.figure_key(stat, name) for stat, name in (*FROM_WINDOW.values(), *COUNTS_FROM_WINDOW.values())}
    keys = []
    for metric, shown in catalog.recorded():
        for stat in shown.stat if isinstance(shown.stat, tuple) else (shown.stat or metric.summary,):
            key = catalog.figure_key(stat, metric.name)
            if key not in held and key not in keys:
                keys.append(key)
    return keys


# A cell's variables (nbmon.report.variables), None where they were not sized.
VARIABLE_COLUMNS = ("vars_held_mb", "vars_growth_mb", "vars_grew_mb", "vars_shrank_mb", "vars_not_sized")


def variable_columns(variables: Variables | None) -> dict:
    """The history's columns of a cell's variables: the namespace's sized
    variables in MiB and their growth, {name: MiB now} of the largest
    that grew (made, grown, replaced), {name: MiB change} of those that
    shrank (deleted among them), and how many objects were not sized."""
    if variables is None:
        return dict.fromkeys(VARIABLE_COLUMNS)
    return {"vars_held_mb": variables.held / MIB, "vars_growth_mb": variables.change / MIB,
            "vars_grew_mb": {v.name: v.nbytes / MIB for v in variables.grew},
            "vars_shrank_mb": {v.name: v.change / MIB for v in variables.shrank},
            "vars_not_sized": variables.unsized}


def vs_last(record: CellRecord) -> tuple[float, float]:
    """How much longer the cell ran and how much higher its peak memory was
    than the last run of its source (negative: less), NaN for a first run."""
    if record.last_run is None or record.summary is None:
        return NAN, NAN
    duration, peak = record.last_run
    now_peak = record.summary.peak_mem_mb
    return record.duration_sec - duration, (now_peak - peak) if None not in (now_peak, peak) else NAN


def history_frame(records):
    """One row per monitored cell: ``records`` are :class:`CellRecord`
    (that ended: they have a summary); start_time becomes a UTC timestamp.
    Columns: HISTORY_COLUMNS, VS_LAST_COLUMNS (:func:`vs_last`), the summary's fields, the recorded figures
    no field holds (:func:`recorded_figures`), then the cell's variables
    (:func:`variable_columns`)."""
    import pandas as pd

    fields = [f.name for f in dataclasses.fields(ResourceSummary)
              if f.name not in ("duration_sec", "start_time", "end_time", "figures", "variables")]
    extra = recorded_figures()
    rows = []
    for r in records:
        s = r.summary
        rows.append({**{c: getattr(r, c) for c in HISTORY_COLUMNS}, **dict(zip(VS_LAST_COLUMNS, vs_last(r))),
                     **{f: getattr(s, f) for f in fields}, **{k: s.figures.get(k) for k in extra},
                     **variable_columns(s.variables)})
    frame = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS) + list(VS_LAST_COLUMNS) + fields + extra
                         + list(VARIABLE_COLUMNS))
    frame["start_time"] = pd.to_datetime(frame["start_time"], unit="s", utc=True)
    return frame
