"""What goes over the wire: process batches, host batches, sealed envelopes.

A worker process samples at the monitor's interval (10 Hz by default) and
makes, every period (a second by default), one *process batch*: per field
of its store the minimum, maximum and mean over the samples taken since
the last batch (float32, packed as bytes), and for cumulative counters
(catalog kind COUNTER) the last value (float64, they run into the
billions). The process's figures are its workers' (they share it). Its
*header* -- the columns, the host, and each of its workers (address, name,
memory limit) -- rides on the first batch, then every ``HEADER_EVERY``
batches and whenever it changes. A process batch is msgpack bytes, packed
once by the process that made it.

The processes of one host hand their batches to the one that holds the
host lock (:mod:`nbmon.dask.worker`), which sends them together: one
*host batch* per host and period, the only thing the scheduler relays.

Everything on the watch's topic is *sealed*: ``{"v", "b": body (msgpack
bytes), "k": MAC}``, the MAC an HMAC-SHA256 of the body with the watch's
key, which only the watch's own plugins hold. A body is a host batch
``{"p": [process batch, ...], "period_s"}`` or the scheduler's word on a
worker ``{"r": number, "joined" | "left": address}``. The notebook opens
(:func:`opened`) only what the key sealed, so no other client of the
scheduler can speak for a worker, and takes each numbered thing once.

On the notebook side each process batch becomes one row of each of its
workers' stores, whose columns are the field (the mean, or the counter's
last value) and, for other fields, ``min_<field>`` and ``max_<field>``
(:func:`store_columns`): the unit stays at the end of every name.

No Dask here: the worker plugin, the collector and the benchmark share it.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

import numpy as np

from .. import catalog
from ..values import NAN

VERSION = 2
HEADER_EVERY = 10
MAC_BYTES = 16
MAX_BODY_BYTES = 64 << 20   # an envelope's body: a host of thousands of processes stays below


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


# -- sealing -------------------------------------------------------------------------

def pack(body) -> bytes:
    import msgpack

    return msgpack.packb(body, use_bin_type=True)


def unpack(data: bytes):
    import msgpack

    return msgpack.unpackb(data, raw=False, strict_map_key=True)


def _mac(key: bytes, body: bytes) -> bytes:
    return hmac.digest(key, body, hashlib.sha256)[:MAC_BYTES]


def seal(key: bytes, body) -> dict:
    """The envelope of ``body`` (packed here unless it is bytes already) for the topic."""
    data = body if isinstance(body, bytes) else pack(body)
    return {"v": VERSION, "b": data, "k": _mac(key, data)}


def opened(key: bytes, msg):
    """The body of an envelope sealed with ``key``; ValueError (in words) for
    anything else."""
    if not isinstance(msg, dict) or msg.get("v") != VERSION:
        raise ValueError("not an nbmon envelope (someone else's event on the topic)")
    data, mac = msg.get("b"), msg.get("k")
    if not isinstance(data, bytes) or not isinstance(mac, bytes) or len(data) > MAX_BODY_BYTES:
        raise ValueError("not an nbmon envelope (someone else's event on the topic)")
    if not hmac.compare_digest(_mac(key, data), mac):
        raise ValueError("not sealed with the watch's key (someone else's event on the topic)")
    return unpack(data)


def as_text(msg) -> dict | None:
    """An envelope in JSON's types (its bytes in base64), to pass on to the
    session's helper; None for what is no envelope of this version."""
    if not isinstance(msg, dict) or msg.get("v") != VERSION or not isinstance(msg.get("b"), bytes) \
            or not isinstance(msg.get("k"), bytes):
        return None
    return {"v": VERSION, "b": base64.b64encode(msg["b"]).decode(), "k": base64.b64encode(msg["k"]).decode()}


def from_text(text: dict) -> dict:
    """The envelope :func:`as_text` passed on; ValueError for anything else."""
    try:
        return {"v": text["v"], "b": base64.b64decode(text["b"], validate=True),
                "k": base64.b64decode(text["k"], validate=True)}
    except (TypeError, KeyError, binascii.Error) as err:
        raise ValueError(f"not an envelope passed on ({type(err).__name__})") from None


# -- batches -------------------------------------------------------------------------

class Encoder:
    """Turns a worker process's raw rows into batches; ``ident`` names the
    process's batches (their numbers count from 0 for each ident)."""

    def __init__(self, columns, ident: str = ""):
        self.columns = tuple(columns)
        self.ident = ident
        counters = np.array([is_counter(c) for c in self.columns], dtype=bool)
        self._gauges, self._counters = ~counters, counters
        self.seq = 0

    def header(self, about: dict, workers: dict[str, dict]) -> dict:
        """A header: what the notebook needs to know of the process (``about``),
        each of its ``workers`` ({address: what it says of itself}), and the columns."""
        return {**about, "workers": workers, "cols": list(self.columns)}

    def encode(self, wall: np.ndarray, rows: np.ndarray, end: bool = False) -> dict:
        """One batch of ``rows`` (fields x samples) taken at ``wall`` (epoch s);
        ``end``: the process's last one."""
        valid = ~np.isnan(rows)
        count = valid.sum(axis=1)
        with np.errstate(all="ignore"):
            mean = np.where(valid, rows, 0.0).sum(axis=1) / count
        stats = np.stack([np.fmin.reduce(rows, axis=1), np.fmax.reduce(rows, axis=1), mean])
        last_idx = rows.shape[1] - 1 - valid[:, ::-1].argmax(axis=1)
        last = np.where(count > 0, rows[np.arange(rows.shape[0]), last_idx], NAN)
        msg = {"i": self.ident, "s": self.seq, "n": int(rows.shape[1]),
               "t": [float(wall[0]), float(wall[-1])],
               "g": stats[:, self._gauges].astype("<f4").tobytes(),
               "c": last[self._counters].astype("<f8").tobytes()}
        if end:
            msg["end"] = True
        self.seq += 1
        return msg


class Decoder:
    """Turns batches of one worker process (with ``columns``) into store rows."""

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
