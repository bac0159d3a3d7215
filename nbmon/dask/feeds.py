"""The notebook's record of a watched cluster: one nbmon
:class:`~nbmon.sampling.store.Store` per worker, fed with its batches.

Every process batch (:mod:`nbmon.dask.wire`) becomes one row of the store
of each worker of its process (bounded like any store), so views,
``samples`` and summaries read plain stores. :meth:`Collector.handle` runs
on the Dask client's event loop: it only opens, decodes and appends.

Time: a row stands at its batch's last sample, at ``t`` seconds since the
watch started, from the worker's own wall clock (hosts are assumed to be
NTP-synchronised, as Dask's own dashboards assume), but never before the
watch started nor after the batch arrived: no worker can have sampled
then. No Dask here.

Memory: a worker's store takes ``worker_max_bytes`` (1 MiB) on clusters of
up to ``STORES_BYTES // worker_max_bytes`` (128) workers; beyond, each new
one takes its share of ``STORES_BYTES`` (128 KiB at 1,000 workers), never
less than a store's least. At ``MAX_WORKERS`` workers, the one that left
first makes room for the next.

Any client of the scheduler can log events to the watch's topic, so
nothing changes anything unless the watch's key sealed it (the watch's own
plugins: :func:`nbmon.dask.wire.opened`), and each numbered thing (a
process's batch, the scheduler's word on a worker) is taken once. What
was sealed is checked all the same: text where text belongs (at most
MAX_TEXT characters), a header's columns nbmon's own metrics, a batch's
times finite and within MAX_SKEW_S of the watch and of its arrival, its
arrays the size its header says, its values within what a worker can
report (:data:`CEILINGS`). Anything else is ignored and counted
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
from .wire import Decoder, opened, unpack

DEFAULT_WORKER_MAX_BYTES = 1 << 20
STORES_BYTES = 128 << 20   # the workers' stores together, on clusters of more than 128 workers
MAX_WORKERS = 4096     # feeds of one watch
MAX_TEXT = 256         # characters of a worker's address, name, host; a process's ident
MAX_SKEW_S = 300.0     # a batch's time: not before the watch started, nor after its arrival, by more
MAX_COLUMNS = 4096     # of a header (a worker's metrics, GPUs included)
MAX_BATCHES = 1 << 16  # process batches in one host batch
# What a worker can report, per unit: nothing below 0, nor above these
# (percentages of one CPU on the largest hosts Linux runs, memory and
# bytes far beyond any machine). A float32 reaches 3e38.
CEILINGS = {"%": 100.0 * 8192, "CPUs": 8192.0, "MiB": 2.0 ** 40, "B": 2.0 ** 63, "B/s": 2.0 ** 50,
            "s": 1e12, "W": 1e6, "MHz": 1e6, "°C": 1e3, "": 1e9}
_ABOUT = {             # what a header may say of its process and workers, and how it is checked
    "host": "text", "name": "text", "gpu": "text", "peaks": "text", "pid": "count", "machine": "flag",
    "limit_mb": "size", "period_s": "size", "spill": "fraction", "pause": "fraction", "machine_problem": "sentence",
}


def _text(value, most: int = MAX_TEXT) -> bool:
    return isinstance(value, str) and 0 < len(value) <= most


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_CHECKS = {
    "text": _text, "sentence": lambda v: _text(v, 4 * MAX_TEXT), "flag": lambda v: isinstance(v, bool),
    "count": _count, "size": lambda v: _number(v) and v > 0, "fraction": lambda v: _number(v) and 0 < v <= 1,
}


class Refused(ValueError):
    """An event on the topic that is not a valid nbmon message (why, in words)."""


def _about(said: dict) -> dict:
    """What a header says of a process or worker, its values checked (None when not valid)."""
    return {k: said[k] if said[k] is None or _CHECKS[check](said[k]) else None
            for k, check in _ABOUT.items() if k in said}


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


def _workers(header: dict) -> dict[str, dict]:
    workers = header.get("workers")
    if not isinstance(workers, dict) or not 0 < len(workers) <= MAX_WORKERS \
            or not all(_text(a) and isinstance(w, dict) for a, w in workers.items()):
        raise Refused(f"a header without 1 to {MAX_WORKERS} workers")
    return {address: _about(said) for address, said in workers.items()}


def ceilings(columns) -> np.ndarray:
    """The most a worker can report in each store column (:data:`CEILINGS`)."""
    return np.array([CEILINGS.get(catalog.unit_of(c.removeprefix("min_").removeprefix("max_")), CEILINGS[""])
                     for c in columns])


class _Process:
    """What the notebook knows of one worker process: its last header and batch."""

    __slots__ = ("seq", "decoder", "ceilings", "about", "workers")

    def __init__(self):
        self.seq = -1
        self.decoder: Decoder | None = None
        self.ceilings: np.ndarray | None = None
        self.about: dict = {}
        self.workers: dict[str, dict] = {}


class WorkerFeed:
    """What the notebook knows of one worker: its header and its store."""

    def __init__(self, address: str):
        self.address = address
        self.about: dict = {}        # what its process's last header said of both (feeds._ABOUT), checked
        self.decoder: Decoder | None = None
        self.store: Store | None = None
        self.state = "live"          # or "gone" once the scheduler saw it leave
        self.ended = False           # its last batch arrived (its sampler stopped)
        self.t_last = -math.inf      # its newest row's t

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
    """Per-worker stores fed with the batches of one watch, sealed with
    ``key`` (thread-safe). ``expected``: how many workers the watch starts
    with (their stores' size is set by it)."""

    def __init__(self, key: bytes, max_bytes: int = DEFAULT_WORKER_MAX_BYTES, t0: float | None = None):
        self.key = key
        self.max_bytes = max_bytes
        self.t0 = time.time() if t0 is None else t0
        self.expected = 0
        self.feeds: dict[str, WorkerFeed] = {}
        self.seq = 0                 # changes a view has to draw (batches, joins, leaves)
        self.unread = 0              # events ignored: not valid nbmon messages, or before their header
        self.reason: str | None = None   # why the last one was ignored
        self.errors = 0              # errors inside the handler (caught)
        self.last_error: str | None = None
        self.latency = collections.deque(maxlen=4096)   # arrival - newest sample, s
        self._processes: dict[str, _Process] = {}
        self._said = 0               # the scheduler's last word on a worker (wire: "r")
        self._gone: dict[str, None] = {}   # workers that left, in order
        self._lock = threading.Lock()

    def workers(self) -> list[WorkerFeed]:
        with self._lock:
            return list(self.feeds.values())

    def _feed(self, address) -> WorkerFeed:
        feed = self.feeds.get(address)
        if feed is None:
            if len(self.feeds) >= MAX_WORKERS:
                if not self._gone:
                    raise Refused(f"more than {MAX_WORKERS} workers")
                first = next(iter(self._gone))   # the first that left makes room
                del self._gone[first], self.feeds[first]
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

    def handle(self, msg, arrived: float | None = None, opened_from=None) -> None:
        """One event of the watch's topic; ``opened_from``: what turns it into
        the envelope first (the helper's copy gets it as text), refused alike."""
        arrived = time.time() if arrived is None else arrived
        with self._lock:
            try:
                try:
                    body = opened(self.key, msg if opened_from is None else opened_from(msg))
                except ValueError as why:
                    raise Refused(str(why)) from None
                if isinstance(body, dict) and "r" in body:
                    self._roster(body)
                elif isinstance(body, dict) and "p" in body:
                    self._host(body, arrived)
                else:
                    raise Refused("a sealed message of no known kind")
            except Refused as why:
                self._refused(why)
                return
            self.seq += 1

    def _refused(self, why: Refused) -> None:
        self.unread += 1
        self.reason = str(why)

    def _roster(self, body: dict) -> None:
        """The scheduler's word on a worker (the only source of a departure)."""
        said = body["r"]
        if not isinstance(said, int) or isinstance(said, bool) or said <= self._said:
            raise Refused("the scheduler's word on a worker taken already (a replay)")
        address = body.get("left", body.get("joined"))
        if not _text(address):
            raise Refused("a worker address that is not text")
        self._said = said
        if "left" in body:
            if address in self.feeds:
                self.feeds[address].state = "gone"
                self._gone[address] = None
        else:
            self._feed(address).state = "live"
            self._gone.pop(address, None)

    def _host(self, body: dict, arrived: float) -> None:
        """A host batch: each process batch in it taken or refused on its own."""
        batches, period = body.get("p"), body.get("period_s")
        if not isinstance(batches, list) or len(batches) > MAX_BATCHES:
            raise Refused("a host batch without a list of process batches")
        period = period if _CHECKS["size"](period) else None
        for data in batches:
            try:
                self._process(data, period, arrived)
            except Refused as why:
                self._refused(why)

    def _process(self, data, period_s: float | None, arrived: float) -> None:
        try:
            msg = unpack(data)
        except Exception:   # msgpack's own errors, of several kinds
            raise Refused("a process batch that is not msgpack") from None
        if not isinstance(msg, dict):
            raise Refused("a process batch that is not a mapping")
        ident, seq = msg.get("i"), msg.get("s")
        if not _text(ident) or not _count(seq):
            raise Refused("a process batch without its process and number")
        known = self._processes.get(ident)
        if known is not None and seq <= known.seq:
            raise Refused("a process batch taken already (a replay)")
        header = msg.get("h")
        if header is None and (known is None or known.decoder is None):
            raise Refused("a batch before its process's header")
        columns, workers = (_columns(header), _workers(header)) if header is not None else (None, None)
        times = msg.get("t")
        if not isinstance(times, (list, tuple)) or len(times) != 2 or not all(map(_number, times)):
            raise Refused("a batch without two finite times")
        wall = float(times[1])
        if not self.t0 - MAX_SKEW_S <= wall <= arrived + MAX_SKEW_S:
            raise Refused(f"a batch timed before the watch started or over {MAX_SKEW_S:g} s after it arrived")
        current = known.decoder if known is not None else None
        decoder = current if columns is None or (current is not None and current.columns == columns) \
            else Decoder(columns)
        try:
            row = decoder.row(msg)
        except (ValueError, KeyError, TypeError) as err:
            raise Refused(f"a batch that does not fit its header ({err})") from None
        process = known if known is not None else self._new_process(ident)
        process.seq = seq
        if header is not None:   # kept even if the values are not: the next batches need it
            most = process.ceilings if decoder is current else ceilings(decoder.store_columns)
            process.decoder, process.ceilings, process.workers = decoder, most, workers
            process.about = _about(header)
        if ((row < 0) | (row > process.ceilings)).any():   # NaN compares False: no figure is fine
            raise Refused("a batch with values no worker can report (below 0, or beyond its unit's ceiling)")
        self.latency.append(arrived - wall)
        # Not before the watch started, nor after it arrived: no worker sampled then.
        wall = min(max(wall, self.t0), arrived)
        end = msg.get("end") is True
        for address, said in process.workers.items():
            feed = self._feed(address)
            if header is not None or period_s is not None:
                about = {**process.about, **said}
                if period_s is not None:   # the host's: its batches come this often
                    about["period_s"] = max(period_s, about.get("period_s") or 0.0)
                feed.about = about
            if feed.decoder is not decoder:
                feed.decoder = decoder
                feed.store = Store(decoder.store_columns, self._store_bytes(len(decoder.store_columns)))
                feed.t_last = -math.inf
            feed.t_last = max(wall - self.t0, feed.t_last)   # a clock step back
            feed.store.append(feed.t_last, wall, row)
            feed.ended = feed.ended or end

    def _new_process(self, ident: str) -> _Process:
        """A new process's record; at MAX_WORKERS of them, the first none of
        whose workers is still here makes room."""
        if len(self._processes) >= MAX_WORKERS:
            done = next((i for i, p in self._processes.items()
                         if all(a not in self.feeds or self.feeds[a].state == "gone" for a in p.workers)), None)
            if done is None:
                raise Refused(f"more than {MAX_WORKERS} worker processes")
            del self._processes[done]
        process = self._processes[ident] = _Process()
        return process

    def _store_bytes(self, columns: int) -> int:
        workers = max(self.expected, len(self.feeds))
        return max(Store.least_bytes(columns), min(self.max_bytes, STORES_BYTES // max(1, workers)))

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
