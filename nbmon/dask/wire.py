"""What a worker sends about itself: one small message per period.

A worker samples at the monitor's interval (10 Hz by default) and sends,
every second (less often on large clusters: see
:data:`~nbmon.dask.worker.HEARTBEATS_PER_BATCH`), one *batch*: per field of its store the minimum,
maximum and mean over the samples taken since the last batch (float32,
packed as bytes: msgpack carries them as one binary blob), and for
cumulative counters (catalog kind COUNTER) the last value (float64, they
run into the billions). Column names travel in a *header* that rides on
the first batch, then every ``HEADER_EVERY`` batches and whenever it
changes, so a notebook that missed the first one catches up.

On the notebook side each batch becomes one row of the worker's store,
whose columns are the field (the mean, or the counter's last value) and,
for other fields, ``min_<field>`` and ``max_<field>`` (:func:`store_columns`):
the unit stays at the end of every name.

No Dask here: the worker plugin, the collector and the benchmark share it.
"""
from __future__ import annotations


import numpy as np

from .. import catalog
from ..values import NAN

VERSION = 1
HEADER_EVERY = 10


def is_counter(column: str) -> bool:
    metric = catalog.metric_of(column)
    return metric is not None and metric.kind == catalog.COUNTER


def store_columns(columns) -> tuple[str, ...]:
    """The notebook-side store columns for a worker's ``columns``."""
    out: list[str] = []
    for c in columns:
        out.extend((c,) if is_counter(c) else (c, "min_" + c, "max_" + c))
    return tuple(out)


def shown_column(column: str) -> str:
    """The store column a chart draws for ``column``: the batch's maximum for
    metrics summarised by their peak (memory), the mean otherwise."""
    metric = catalog.metric_of(column)
    if metric is not None and metric.summary == catalog.PEAK and not is_counter(column):
        return "max_" + column
    return column


class Encoder:
    """Turns a worker store's raw rows into batches."""

    def __init__(self, columns):
        self.columns = tuple(columns)
        counters = np.array([is_counter(c) for c in self.columns], dtype=bool)
        self._gauges, self._counters = ~counters, counters
        self.seq = 0

    def header(self, about: dict) -> dict:
        """A header: what the notebook needs to know of a worker, and the columns."""
        return {**about, "cols": list(self.columns)}

    def encode(self, wall: np.ndarray, rows: np.ndarray, end: bool = False) -> dict:
        """One batch of ``rows`` (fields x samples) taken at ``wall`` (epoch s);
        ``end``: the worker's last one."""
        valid = ~np.isnan(rows)
        count = valid.sum(axis=1)
        with np.errstate(all="ignore"):
            mean = np.where(valid, rows, 0.0).sum(axis=1) / count
        stats = np.stack([np.fmin.reduce(rows, axis=1), np.fmax.reduce(rows, axis=1), mean])
        last_idx = rows.shape[1] - 1 - valid[:, ::-1].argmax(axis=1)
        last = np.where(count > 0, rows[np.arange(rows.shape[0]), last_idx], NAN)
        msg = {"v": VERSION, "s": self.seq, "n": int(rows.shape[1]),
               "t": [float(wall[0]), float(wall[-1])],
               "g": stats[:, self._gauges].astype("<f4").tobytes(),
               "c": last[self._counters].astype("<f8").tobytes()}
        if end:
            msg["end"] = True
        self.seq += 1
        return msg


class Decoder:
    """Turns batches of one worker (with ``columns``) into store rows."""

    def __init__(self, columns):
        self.columns = tuple(columns)
        self.store_columns = store_columns(self.columns)
        where = {c: i for i, c in enumerate(self.store_columns)}
        gauges = [c for c in self.columns if not is_counter(c)]
        self._mean = np.array([where[c] for c in gauges], dtype=np.intp)
        self._min = np.array([where["min_" + c] for c in gauges], dtype=np.intp)
        self._max = np.array([where["max_" + c] for c in gauges], dtype=np.intp)
        self._counter = np.array([where[c] for c in self.columns if is_counter(c)], dtype=np.intp)
        self._k = len(gauges)

    def row(self, msg: dict) -> np.ndarray:
        """The store row of a batch; ValueError if it does not fit these columns."""
        stats = np.frombuffer(msg["g"], dtype="<f4")
        last = np.frombuffer(msg["c"], dtype="<f8")
        if stats.size != 3 * self._k or last.size != self._counter.size:
            raise ValueError(f"a batch of {stats.size // 3} + {last.size} values does not fit "
                             f"{len(self.columns)} columns")
        stats = stats.reshape(3, self._k)
        out = np.empty(len(self.store_columns))
        out[self._min], out[self._max], out[self._mean] = stats
        out[self._counter] = last
        return out
