"""The notebook side: one :class:`Watch` per watched cluster.

A watch subscribes the notebook's Dask client to its own event topic, then
registers two plugins: :class:`~nbmon.dask.worker.Roster` on the scheduler
(joins and leaves) and :class:`~nbmon.dask.worker.NbmonPlugin` on every
worker, present and future, each with the watch's key, which seals what
they send (:mod:`nbmon.dask.wire`). The workers' batches land in a
:class:`~nbmon.dask.feeds.Collector`, which opens only what the key
sealed. Every call to the cluster is bounded in time: a dead or stuck
worker never holds the notebook.
"""
from __future__ import annotations

import asyncio
import math
import os
import secrets
import time
import uuid

from ..options import Options
from ..report.summary import ResourceSummary
from .feeds import DEFAULT_WORKER_MAX_BYTES, Collector
from .worker import NbmonPlugin, Roster, close_span, nbmon_threads, open_span, roster_name

DEFAULT_EVERY_S = 1.0            # one batch a second per worker
CALL_TIMEOUT_S = 10.0            # any one call to the cluster
SPAN_TIMEOUT_S = 5.0             # a worker's answer at a cell's boundary
STOP_WAIT_S = 2.0                # for the workers' last batches
# A worker that did not answer at the end of a cell: known to have no figures.
NO_ANSWER = ResourceSummary(peak_rss_mb=math.nan, mean_rss_mb=math.nan, peak_gpu_mem_mb=None,
                            mean_gpu_util=None, memory_growth_mb=math.nan, num_samples=0,
                            duration_sec=math.nan)


class Watch:
    """Watching one cluster: see the module's doc. Made by :func:`nbmon.dask.watch`."""

    def __init__(self, client, options: Options, every_s: float = DEFAULT_EVERY_S,
                 worker_max_bytes: int = DEFAULT_WORKER_MAX_BYTES, mirror=None):
        self.client, self.options, self.every_s = client, options, every_s
        self.topic = f"nbmon-{uuid.uuid4().hex[:16]}"
        self.key = secrets.token_bytes(32)   # only the watch's plugins get it: through the scheduler, never on the topic
        self.collector = Collector(self.key, worker_max_bytes)
        # A second collector elsewhere (the session's helper, which draws the view): told
        # begin(watch) before the plugins start, then event(message, arrival time) for every event.
        self.mirror = mirror
        self.running = False
        self.registered: list[str] = []   # workers that had the plugin at start

    @property
    def address(self) -> str:
        return self.client.scheduler.address

    def start(self) -> "Watch":
        client = self.client
        client.subscribe_topic(self.topic, self._on_event)
        try:
            # The workers' stores are sized by how many there are: known before the first batch.
            self.collector.expected = len(self._call(client.nthreads))
            if self.mirror is not None:
                self.mirror.begin(self)
            roster = Roster(self.topic, client.id, self.key)
            self._call(lambda: client.register_plugin(roster, name=roster.name))
            answers = self._call(lambda: client.register_plugin(
                NbmonPlugin(self.topic, self.options.to_json(), self.every_s, self.key), name=self.topic))
        except Exception as err:
            self._undo()
            raise RuntimeError(f"nbmon could not start on the cluster at {self.address}: "
                               f"{type(err).__name__}: {err}") from None
        self.registered = list(answers)
        self.running = True
        return self

    def _on_event(self, event) -> None:
        """Dask's topic handler (on the client's event loop): the event to the
        collector, and to the mirror, whose failure is counted, never raised."""
        self.collector.on_event(event)
        if self.mirror is not None:
            try:
                self.mirror.event(event[1], time.time())
            except Exception as err:   # nothing of ours reaches Dask's event loop
                self.collector.errors += 1
                self.collector.last_error = f"the mirror: {type(err).__name__}: {err}"

    def _call(self, call, timeout: float = CALL_TIMEOUT_S):
        """``call()`` on the client's event loop (where Client methods return
        awaitables), bounded by ``timeout`` seconds."""
        return self.client.sync(call, callback_timeout=timeout)

    def _undo(self, worker_plugin: bool = True) -> None:
        client = self.client
        steps = [lambda: client.unregister_scheduler_plugin(roster_name(self.topic))]
        if worker_plugin:
            steps.insert(0, lambda: client.unregister_worker_plugin(self.topic))
        for step in steps:
            try:
                self._call(step)
            except Exception:  # not registered, or the cluster is gone: nothing to undo there
                pass
        try:
            client.unsubscribe_topic(self.topic)
        except Exception:
            pass

    def ready(self, timeout: float = 5.0) -> bool:
        """Wait (bounded) until every worker the plugin started on has sent its header."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            feeds = self.collector.feeds
            if all(a in feeds and feeds[a].decoder is not None for a in self.registered):
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> dict[str, list[str]]:
        """Stop sampling on every worker (their last batches are drawn) and
        return ``{worker: [nbmon threads still alive there]}`` for the workers
        that have any: empty when every worker is clean."""
        if not self.running:
            return {}
        self.running = False
        live = [f for f in self.collector.workers() if f.state == "live" and f.decoder is not None]
        try:
            self._call(lambda: self.client.unregister_worker_plugin(self.topic))
        except Exception:  # the cluster is gone, or a worker hung: its plugin dies with it
            pass
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline and not all(f.ended or f.state == "gone" for f in live):
            time.sleep(0.02)
        self._undo(worker_plugin=False)
        left = self.run_each(nbmon_threads, os.getpid())
        return {w: names for w, names in left.items() if isinstance(names, list) and names}

    def run_each(self, fn, *args, workers=None, timeout: float = CALL_TIMEOUT_S) -> dict:
        """``fn(*args)`` on each worker (default: every worker the watch knows
        of that has not left) that the scheduler has -- an address that only
        an event named is not asked --, each answer bounded by ``timeout``:
        ``{worker: result, or the exception it raised or timed out with}``."""
        if workers is None:
            feeds = self.collector.feeds
            known = dict.fromkeys(self.registered + [f.address for f in self.collector.workers()])
            workers = [a for a in known if a not in feeds or feeds[a].state == "live"]
        client = self.client

        async def one(address, scheduled):
            if address not in scheduled:
                return LookupError(f"the scheduler has no worker {address}")
            try:
                answers = await asyncio.wait_for(client.run(fn, *args, workers=[address]), timeout)
                return answers[address]
            except Exception as err:
                return err

        async def each():
            scheduled = (await asyncio.wait_for(client.scheduler.identity(n_workers=-1), timeout))["workers"]
            return dict(zip(workers, await asyncio.gather(*(one(a, scheduled) for a in workers))))

        if not workers:
            return {}
        try:
            return self._call(each, timeout + 5.0)
        except Exception as err:  # the client itself is gone
            return dict.fromkeys(workers, err)

    # -- one notebook cell -------------------------------------------------------
    def open_spans(self) -> tuple[str, list[str]]:
        """Open an exact span on every worker: (token, the workers that opened one)."""
        token = uuid.uuid4().hex
        opened = self.run_each(open_span, self.topic, token, timeout=SPAN_TIMEOUT_S)
        return token, [w for w, ok in opened.items() if ok is True]

    def close_spans(self, token: str, workers: list[str]) -> list[dict]:
        """Close the spans: one ``{worker, host, summary}`` per worker that
        opened one; ``summary`` is NO_ANSWER for a worker that did not answer."""
        feeds = self.collector.feeds
        alive = [w for w in workers if w not in feeds or feeds[w].state != "gone"]   # the gone cannot answer
        closed = self.run_each(close_span, self.topic, token, workers=alive, timeout=SPAN_TIMEOUT_S)
        rows = []
        for worker in workers:
            answer = closed.get(worker)
            feed = feeds.get(worker)
            if isinstance(answer, dict):
                rows.append({"worker": worker, "host": answer["host"],
                             "summary": ResourceSummary.from_dict(answer["summary"])})
            else:
                rows.append({"worker": worker, "host": feed.host if feed else "", "summary": NO_ANSWER})
        return rows
