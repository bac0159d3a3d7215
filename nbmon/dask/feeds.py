"""The notebook's record of a watched cluster: one nbmon
:class:`~nbmon.sampling.store.Store` per worker, fed with its batches.

Every batch a worker sends (:mod:`nbmon.dask.wire`) becomes one row of
that worker's store (bounded like any store), so views, ``samples`` and
summaries read plain stores. :meth:`Collector.handle` runs on the Dask
client's event loop: it only decodes and appends.

Time: a row stands at its batch's last sample, at ``t`` seconds since the
watch started, from the worker's own wall clock (hosts are assumed to be
NTP-synchronised, as Dask's own dashboards assume). No Dask here.

Any client of the scheduler can log events to the watch's topic, so every
event is checked before it changes anything: text where text belongs (at
most MAX_TEXT characters), a header's columns nbmon's own metrics, a
batch's times finite and within MAX_SKEW_S of the watch and of its
arrival, its arrays the size its header says, its values finite or NaN,
at most MAX_WORKERS workers. Anything else is ignored and counted
(``unread``, with the last ``reason``); an error inside the handler is
caught and counted in ``errors``: the Dask event loop never sees one.
"""
from __future__ import annotations

import collections
import math
import threading
import time

import numpy as np

from .. import catalog
from ..sampling.store import Stats, Store
from ..report.summary import ResourceSummary, summarize
from .wire import Decoder

DEFAULT_WORKER_MAX_BYTES = 1 << 20
MAX_WORKERS = 1024     # feeds of one watch: with worker_max_bytes each, what it can hold at most
MAX_TEXT = 256         # characters of a worker's address, name, host
MAX_SKEW_S = 300.0     # a batch's time: not before the watch started, nor after its arrival, by more
MAX_COLUMNS = 4096     # of a header (a worker's metrics, GPUs included)
_ABOUT = {             # what a header may say of its worker, and how it is checked
    "host": "text", "name": "text", "gpu": "text", "peaks": "text", "pid": "count", "machine": "flag",
    "limit_mb": "size", "period_s": "size", "spill": "fraction", "pause": "fraction", "machine_problem": "sentence",
}


def _text(value, most: int = MAX_TEXT) -> bool:
    return isinstance(value, str) and 0 < len(value) <= most


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_CHECKS = {
    "text": _text, "sentence": lambda v: _text(v, 4 * MAX_TEXT), "flag": lambda v: isinstance(v, bool),
    "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "size": lambda v: _number(v) and v > 0, "fraction": lambda v: _number(v) and 0 < v <= 1,
}


class Refused(ValueError):
    """An event on the topic that is not a valid nbmon message (why, in words)."""


def _about(header: dict) -> dict:
    """What a header says of its worker, its values checked (None when not valid)."""
    return {k: header[k] if header[k] is None or _CHECKS[check](header[k]) else None
            for k, check in _ABOUT.items() if k in header}


def _columns(header) -> tuple[str, ...]:
    if not isinstance(header, dict):
        raise Refused("a header that is not a mapping")
    columns = header.get("cols")
    if not isinstance(columns, (list, tuple)) or not 0 < len(columns) <= MAX_COLUMNS:
        raise Refused(f"a header without a list of 1 to {MAX_COLUMNS} columns")
    if not all(isinstance(c, str) and catalog.metric_of(c) is not None for c in columns) \
            or len(set(columns)) != len(columns):
        raise Refused("a header with columns that are not nbmon's metrics")
    return tuple(columns)


class WorkerFeed:
    """What the notebook knows of one worker: its header and its store."""

    def __init__(self, address: str):
        self.address = address
        self.about: dict = {}        # what its last header said (feeds._ABOUT), checked
        self.decoder: Decoder | None = None
        self.store: Store | None = None
        self.state = "live"          # or "gone" once the scheduler saw it leave
        self.ended = False           # its last batch arrived (its sampler stopped)

    @property
    def name(self) -> str:
        return self.about.get("name") or self.address

    @property
    def host(self) -> str:
        return self.about.get("host") or ""

    def summary(self) -> ResourceSummary | None:
        """The worker's summary over everything its store holds (None before a batch)."""
        if self.store is None or not len(self.store):
            return None
        return summarize(BatchStats(self.store, self.decoder.columns))


class BatchStats:
    """A worker's batches as one window's statistics (the interface of
    :class:`~nbmon.sampling.store.Stats` that :func:`nbmon.report.summary.summarize` reads),
    each statistic of a field read where the batches hold it: the highest
    from ``max_<field>``, the lowest from ``min_<field>``, the others (mean,
    first, last, delta) from the field's own column (each batch's mean, a
    counter's last value)."""

    def __init__(self, store: Store, columns):
        t, wall, values = store.series()
        self._stats = Stats(store.columns)
        self._stats.fold(t, wall, np.array([values[c] for c in store.columns]))
        self.columns = tuple(columns)
        index = {c: j for j, c in enumerate(store.columns)}
        self.n = self._stats.n[[index[c] for c in self.columns]]
        for name in ("count", "t_open", "t_first", "t_last", "wall_first", "wall_last", "duration"):
            setattr(self, name, getattr(self._stats, name))

    def value(self, stat: str, column: str) -> float:
        held = f"{stat}_{column}"
        return self._stats.value(stat, held if stat in ("max", "min") and held in self._stats.columns else column)


class Collector:
    """Per-worker stores fed with the batches of one watch (thread-safe)."""

    def __init__(self, max_bytes: int = DEFAULT_WORKER_MAX_BYTES, t0: float | None = None):
        self.max_bytes = max_bytes
        self.t0 = time.time() if t0 is None else t0
        self.feeds: dict[str, WorkerFeed] = {}
        self.seq = 0                 # changes a view has to draw (batches, joins, leaves)
        self.unread = 0              # events ignored: not valid nbmon messages, or before their header
        self.reason: str | None = None   # why the last one was ignored
        self.errors = 0              # errors inside the handler (caught)
        self.last_error: str | None = None
        self.latency = collections.deque(maxlen=4096)   # arrival - newest sample, s
        self._lock = threading.Lock()

    def workers(self) -> list[WorkerFeed]:
        with self._lock:
            return list(self.feeds.values())

    def _feed(self, address) -> WorkerFeed:
        if not _text(address):
            raise Refused("a worker address that is not text")
        feed = self.feeds.get(address)
        if feed is None:
            if len(self.feeds) >= MAX_WORKERS:
                raise Refused(f"more than {MAX_WORKERS} workers")
            feed = self.feeds[address] = WorkerFeed(address)
        return feed

    def on_event(self, event) -> None:
        """Dask's topic handler: ``event`` is (scheduler time, message). Never raises."""
        try:
            self.handle(event[1])
        except Exception as err:   # a bug of ours must not reach Dask's event loop
            with self._lock:
                self.errors += 1
                self.last_error = f"{type(err).__name__}: {err}"

    def handle(self, msg, arrived: float | None = None) -> None:
        arrived = time.time() if arrived is None else arrived
        with self._lock:
            try:
                if not isinstance(msg, dict):
                    raise Refused("not a mapping")
                if "left" in msg:
                    self._feed(msg["left"]).state = "gone"
                elif "joined" in msg:
                    self._feed(msg["joined"]).state = "live"
                elif "w" in msg:
                    self._batch(msg, arrived)
                else:
                    raise Refused("not nbmon's (someone else logged to the topic)")
            except Refused as why:
                self.unread += 1
                self.reason = str(why)
                return
            self.seq += 1

    def _batch(self, msg: dict, arrived: float) -> None:
        address = msg["w"]
        if not _text(address):
            raise Refused("a worker address that is not text")
        header = msg.get("h")
        columns = _columns(header) if header is not None else None
        known = self.feeds.get(address)
        current = known.decoder if known is not None else None
        if columns is None and current is None:
            raise Refused("a batch before its worker's header")
        times = msg.get("t")
        if not isinstance(times, (list, tuple)) or len(times) != 2 or not all(map(_number, times)):
            raise Refused("a batch without two finite times")
        wall = float(times[1])
        if not self.t0 - MAX_SKEW_S <= wall <= arrived + MAX_SKEW_S:
            raise Refused(f"a batch timed before the watch started or over {MAX_SKEW_S:g} s after it arrived")
        decoder = current if columns is None or (current is not None and current.columns == columns) \
            else Decoder(columns)
        try:
            row = decoder.row(msg)
        except (ValueError, KeyError, TypeError) as err:
            raise Refused(f"a batch that does not fit its header ({err})") from None
        if np.isinf(row).any():
            raise Refused("a batch with infinite values")
        feed = self._feed(address)   # only now: a refused event makes no feed
        if header is not None:
            feed.about = _about(header)
        if decoder is not current:
            feed.decoder = decoder
            feed.store = Store(decoder.store_columns, self.max_bytes)
        latest = feed.store.latest()
        t = max(wall - self.t0, latest["t"] if latest else -math.inf)   # a clock step back
        feed.store.append(t, wall, row)
        feed.ended = feed.ended or msg.get("end") is True
        self.latency.append(arrived - wall)

    def samples_frame(self):
        """One long DataFrame of every worker's rows: UTC time index,
        ``elapsed_s`` since the watch started, ``worker``, ``host``, then the
        store columns (mean, ``min_``/``max_`` per batch, counters' last value)."""
        import pandas as pd

        frames = []
        for feed in self.workers():
            if feed.store is None or not len(feed.store):
                continue
            t, wall, values = feed.store.series()
            frame = pd.DataFrame(values, index=pd.to_datetime(wall, unit="s", utc=True))
            frame.insert(0, "elapsed_s", t)
            frame.insert(1, "worker", feed.address)
            frame.insert(2, "host", feed.host)
            frames.append(frame)
        if not frames:
            return pd.DataFrame(columns=["elapsed_s", "worker", "host"],
                                index=pd.DatetimeIndex([], name="time", tz="UTC"))
        frame = pd.concat(frames).sort_index(kind="stable")
        frame.index.name = "time"
        return frame
