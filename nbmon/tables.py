"""pandas DataFrames of samples and of per-cell history (pandas imported lazily)."""
from __future__ import annotations

import dataclasses

from . import catalog
from .summary import COUNTS_FROM_WINDOW, FROM_WINDOW, ResourceSummary


def samples_frame(store):
    """Every sample the store holds, indexed by UTC time (column ``time``),
    with ``elapsed_s`` since the first and one column per metric (units in
    the names). Samples older than the ring are min/max pairs per bucket."""
    import pandas as pd

    if store is None:
        return pd.DataFrame(index=pd.DatetimeIndex([], name="time", tz="UTC"))
    t, wall, values = store.series()
    frame = pd.DataFrame(values, index=pd.to_datetime(wall, unit="s", utc=True))
    frame.index.name = "time"
    frame.insert(0, "elapsed_s", t - t[0] if len(t) else t)
    return frame


# Per-cell columns before the summary's own fields.
HISTORY_COLUMNS = ("execution_count", "label", "start_time", "duration_sec", "status")


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


def history_frame(records):
    """One row per monitored cell: ``records`` are dicts with HISTORY_COLUMNS
    and a ``summary`` (ResourceSummary); start_time becomes a UTC timestamp.
    Columns: HISTORY_COLUMNS, the summary's fields, then the recorded
    figures no field holds (:func:`recorded_figures`)."""
    import pandas as pd

    fields = [f.name for f in dataclasses.fields(ResourceSummary)
              if f.name not in ("duration_sec", "start_time", "end_time", "figures")]
    extra = recorded_figures()
    rows = []
    for r in records:
        s = r["summary"]
        rows.append({**{c: r[c] for c in HISTORY_COLUMNS}, **{f: getattr(s, f) for f in fields},
                     **{k: s.figures.get(k) for k in extra}})
    frame = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS) + fields + extra)
    frame["start_time"] = pd.to_datetime(frame["start_time"], unit="s", utc=True)
    return frame
