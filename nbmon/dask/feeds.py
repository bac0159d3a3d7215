"""The notebook's record of a watched cluster: one nbmon
:class:`~nbmon.store.Store` per worker, fed with its batches.

Every batch a worker sends (:mod:`nbmon.dask.wire`) becomes one row of
that worker's store (bounded like any store), so views, ``samples`` and
summaries read plain stores. :meth:`Collector.handle` runs on the Dask
client's event loop: it only decodes and appends.

Time: a row stands at its batch's last sample, at ``t`` seconds since the
watch started, from the worker's own wall clock (hosts are assumed to be
NTP-synchronised, as Dask's own dashboards assume). No Dask here.
"""
from __future__ import annotations

import collections
import math
import threading
import time

from ..store import Store
from .wire import Decoder

DEFAULT_WORKER_MAX_BYTES = 1 << 20


class WorkerFeed:
    """What the notebook knows of one worker: its header and its store."""

    def __init__(self, address: str):
        self.address = address
        self.about: dict = {}        # the last header, less the columns
        self.decoder: Decoder | None = None
        self.store: Store | None = None
        self.state = "live"          # or "gone" once the scheduler saw it leave
        self.ended = False           # its last batch arrived (its sampler stopped)

    @property
    def name(self) -> str:
        return self.about.get("name") or self.address

    @property
    def host(self) -> str:
        return self.about.get("host", "")


class Collector:
    """Per-worker stores fed with the batches of one watch (thread-safe)."""

    def __init__(self, max_bytes: int = DEFAULT_WORKER_MAX_BYTES, t0: float | None = None):
        self.max_bytes = max_bytes
        self.t0 = time.time() if t0 is None else t0
        self.feeds: dict[str, WorkerFeed] = {}
        self.seq = 0                 # changes a view has to draw (batches, joins, leaves)
        self.unread = 0              # batches that came before their worker's header, or did not fit it
        self.latency = collections.deque(maxlen=4096)   # arrival - newest sample, s
        self._lock = threading.Lock()

    def workers(self) -> list[WorkerFeed]:
        with self._lock:
            return list(self.feeds.values())

    def _feed(self, address: str) -> WorkerFeed:
        feed = self.feeds.get(address)
        if feed is None:
            feed = self.feeds[address] = WorkerFeed(address)
        return feed

    def on_event(self, event) -> None:
        """Dask's topic handler: ``event`` is (scheduler time, message)."""
        self.handle(event[1])

    def handle(self, msg: dict, arrived: float | None = None) -> None:
        arrived = time.time() if arrived is None else arrived
        with self._lock:
            if "left" in msg:
                self._feed(msg["left"]).state = "gone"
            elif "joined" in msg:
                self._feed(msg["joined"]).state = "live"
            elif "w" in msg:
                self._batch(self._feed(msg["w"]), msg, arrived)
            else:  # not nbmon's: someone else logged to the topic
                self.unread += 1
                return
            self.seq += 1

    def _batch(self, feed: WorkerFeed, msg: dict, arrived: float) -> None:
        header = msg.get("h")
        if header is not None:
            columns = tuple(header["cols"])
            feed.about = {k: v for k, v in header.items() if k != "cols"}
            if feed.decoder is None or feed.decoder.columns != columns:
                feed.decoder = Decoder(columns)
                feed.store = Store(feed.decoder.store_columns, self.max_bytes)
        if feed.decoder is None:
            self.unread += 1
            return
        try:
            row = feed.decoder.row(msg)
        except (ValueError, KeyError, TypeError):
            self.unread += 1
            return
        wall = float(msg["t"][1])
        latest = feed.store.latest()
        t = max(wall - self.t0, latest["t"] if latest else -math.inf)   # a clock step back
        feed.store.append(t, wall, row)
        feed.ended = feed.ended or bool(msg.get("end"))
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
