"""What a monitor feeds besides its store: consumers, all on one thread.

A *consumer* has ``every_s`` (seconds between calls), ``consume(store,
final)`` -- called on the run's ``nbmon-consumers`` thread every
``every_s`` seconds (the first time as the run starts if it has
``at_start = True``) and once more with ``final=True`` when the run ends --
and ``close()``. It reads what it needs from the store, so a slow or stuck
consumer never delays a sample nor the shutdown.

A *sender* (``publish(event)``, the scaffold seed's interface; see
:mod:`nbmon.sinks.senders`) receives every sample as an event through
:class:`SampleForwarder`. :func:`as_consumer` takes a consumer, a sender
or a plain callable, so a user's own sink attaches to any monitor (the
notebook's too: ``nbmon.monitor().attach(sink)``).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol, Sequence, runtime_checkable

from ..sampling.faults import FaultLog, source_name
from .senders import CallbackSender

THREAD_NAME = "nbmon-consumers"
DEFAULT_EVERY_S = 1.0


@runtime_checkable
class Consumer(Protocol):
    every_s: float

    def consume(self, store, final: bool) -> None:
        """Read what is new in ``store``; ``final``: the run has ended."""

    def close(self) -> None:
        """The run is over (called once, after the final consume)."""


CHUNK_ROWS = 1024      # samples per publish: the most one attempt of a failing sender costs
RETRY_MAX_S = 60.0     # the longest wait between two attempts of a failing sender


class SamplesLost(Exception):
    """Samples the store decimated before a failing sender could take them."""


class SampleForwarder:
    """Sends every sample of the store to ``sender`` as one event each:
    ``{"time": epoch s, "elapsed_s": s since the run started, <column>: value, ...}``,
    in order, each exactly once.

    At most ``chunk`` samples go in one publish. A publish that raises is
    tried again with the same samples, after twice the wait of the last
    failure (from ``every_s`` up to ``retry_max_s``), so an outage costs one
    bounded attempt now and then, not a growing backlog every second; once
    the sender works again the backlog goes out, chunk after chunk.
    Nothing is lost while the store still holds the samples (its raw ring:
    tens of minutes at 10 Hz by default). Samples it decimated before they
    could be sent are counted in ``lost`` and reported as a fault of
    ``<sender> backlog`` (:class:`SamplesLost`)."""

    def __init__(self, sender, every_s: float = DEFAULT_EVERY_S, *, chunk: int = CHUNK_ROWS,
                 retry_max_s: float = RETRY_MAX_S):
        self.sender = sender
        self.every_s = self.base_every_s = every_s   # every_s: read by the consumer thread after each call
        self.chunk, self.retry_max_s = chunk, retry_max_s
        self.cursor = 0
        self.lost = 0
        self.sent = 0
        self.failures = 0   # failed publishes in a row
        self._unreported = 0
        self._store = None

    @property
    def name(self) -> str:
        return source_name(self.sender)

    def consume(self, store, final: bool) -> None:
        if store is not self._store:
            # A new run (the monitor restarted): its store counts from 0 again;
            # the last run's cursor would skip its first samples.
            self.cursor, self._store = 0, store
        t, wall, rows, next_seq, lost = store.rows_since(self.cursor)
        self.cursor += lost
        self.lost += lost
        self._unreported += lost
        columns = store.columns
        for lo in range(0, len(t), self.chunk):
            hi = min(lo + self.chunk, len(t))
            events = [{"time": w, "elapsed_s": ti - store.t_start, **dict(zip(columns, row))}
                      for ti, w, row in zip(t[lo:hi].tolist(), wall[lo:hi].tolist(), rows[:, lo:hi].T.tolist())]
            try:
                self._publish(events, store)
            except Exception:
                self.failures += 1
                self.every_s = max(self.base_every_s, min(self.base_every_s * 2 ** min(self.failures, 32),
                                                          self.retry_max_s))
                raise
            self.failures, self.every_s = 0, self.base_every_s
            if self._store is not store:
                return
        if self._store is store:
            self.cursor = max(self.cursor, next_seq)
        if self._unreported:   # said once the sender works again: it is the cause
            lost, self._unreported = self._unreported, 0
            raise SamplesLost(f"{lost} samples were decimated by the store before {self.name} could take "
                              f"them (it failed for that long); {self.lost} lost in all")

    def _publish(self, events: list[dict], store) -> None:
        many = getattr(self.sender, "publish_many", None)
        if many is not None:
            many(events)
            self._advance(store, len(events))
        else:
            for event in events:
                self.sender.publish(event)
                self._advance(store, 1)

    def _advance(self, store, count: int) -> None:
        # Only past what was published, so a failed publish is retried; and
        # not if a later run's call took over while this publish was stuck.
        if self._store is store:
            self.cursor += count
            self.sent += count

    def close(self) -> None:
        close = getattr(self.sender, "close", None)
        if close is not None:
            close()


def as_consumer(sink, every_s: float = DEFAULT_EVERY_S):
    """A consumer as is; a sender (``publish``) or a callable (called with
    each sample's event) wrapped in a :class:`SampleForwarder`."""
    if callable(getattr(sink, "consume", None)) and hasattr(sink, "every_s"):
        return sink
    if callable(getattr(sink, "publish", None)):
        return SampleForwarder(sink, every_s)
    if callable(sink):
        return SampleForwarder(CallbackSender(sink), every_s)
    raise TypeError(f"{sink!r} is not a consumer (every_s, consume(store, final)), "
                    f"a sender (publish(event)) nor a callable")


def _first_due(consumer, now: float) -> float:
    return now if getattr(consumer, "at_start", False) else now + consumer.every_s


class ConsumerThread:
    """Runs one run's consumers on a daemon thread. ``retired()`` turns True
    once a later run has taken the consumers over: a thread that stop()
    abandoned (stuck in a consumer) then never calls them again."""

    def __init__(self, consumers: Sequence, store, faults: FaultLog, retired: Callable[[], bool]):
        self.consumers = list(consumers)
        self.store = store
        self.faults = faults
        self.retired = retired
        self._cond = threading.Condition()
        self._stopping = False
        self._due: dict[int, float] = {}
        self.thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def add(self, consumer) -> None:
        with self._cond:
            self.consumers.append(consumer)
            self._due[id(consumer)] = _first_due(consumer, time.monotonic())
            self._cond.notify()

    def hurry(self, consumer) -> None:
        """Make ``consumer`` due now."""
        with self._cond:
            if id(consumer) in self._due:
                self._due[id(consumer)] = time.monotonic()
                self._cond.notify()

    def stop(self) -> None:
        """Ask for the final round; returns at once."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def join(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _run(self) -> None:
        with self._cond:
            now = time.monotonic()
            for c in self.consumers:
                self._due.setdefault(id(c), _first_due(c, now))
        try:
            while True:
                with self._cond:
                    wait = min(self._due.values(), default=time.monotonic() + 3600.0) - time.monotonic()
                    if not self._stopping and wait > 0:
                        self._cond.wait(wait)
                    if self._stopping:
                        break
                    due_now = [c for c in self.consumers if self._due[id(c)] <= time.monotonic()]
                for c in due_now:
                    self._call(c, False)
                    with self._cond:
                        self._due[id(c)] = max(self._due[id(c)] + c.every_s, time.monotonic())
            for c in list(self.consumers):
                if self.retired():
                    break
                self._call(c, True)
        finally:
            for c in list(self.consumers):
                if self.retired():
                    break
                try:
                    c.close()
                except Exception as err:
                    self.faults.record(c, err)

    def _call(self, consumer, final: bool) -> None:
        try:
            consumer.consume(self.store, final)
        except SamplesLost as err:  # its own fault: the sender's first error stays what it was
            self.faults.record(f"{source_name(consumer)} backlog", err)
        except Exception as err:  # a broken consumer must not stop the others
            self.faults.record(consumer, err)
