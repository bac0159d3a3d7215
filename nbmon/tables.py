"""pandas DataFrames of samples and of per-cell history (pandas imported lazily)."""
from __future__ import annotations

import dataclasses

from .summary import ResourceSummary


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


def history_frame(records):
    """One row per monitored cell: ``records`` are dicts with HISTORY_COLUMNS
    and a ``summary`` (ResourceSummary); start_time becomes a UTC timestamp."""
    import pandas as pd

    fields = [f.name for f in dataclasses.fields(ResourceSummary)
              if f.name not in ("duration_sec", "start_time", "end_time")]
    rows = []
    for r in records:
        s = r["summary"]
        rows.append({**{c: r[c] for c in HISTORY_COLUMNS}, **{f: getattr(s, f) for f in fields}})
    frame = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS) + fields)
    frame["start_time"] = pd.to_datetime(frame["start_time"], unit="s", utc=True)
    return frame
