"""What a monitor feeds besides its store: consumers, all on one thread.

A *consumer* has ``every_s`` (seconds between calls), ``consume(store,
final)`` -- called on the run's ``nbmon-consumers`` thread every
``every_s`` seconds (the first time as the run starts if it has
``at_start = True``) and once more with ``final=True`` when the run ends --
and ``close()``. It reads what it needs from the store, so a slow or stuck
consumer never delays a sample nor the shutdown.

A *sender* (``publish(event)``, the scaffold seed's interface; see
:mod:`nbmon.senders`) receives every sample as an event through
:class:`SampleForwarder`. :func:`as_consumer` takes a consumer, a sender
or a plain callable, so a user's own sink attaches to any monitor (the
notebook's too: ``nbmon.monitor().attach(sink)``).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Protocol, Sequence, runtime_checkable

from .faults import FaultLog, source_name
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


class SampleForwarder:
    """Sends every sample of the store to ``sender`` as one event each:
    ``{"time": epoch s, "elapsed_s": s since the run started, <column>: value, ...}``.

    ``lost`` counts samples the store had decimated before they could be
    sent (only possible when a sender blocks for hours)."""

    def __init__(self, sender, every_s: float = DEFAULT_EVERY_S):
        self.sender = sender
        self.every_s = every_s
        self.cursor = 0
        self.lost = 0
        self.sent = 0
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
        self.lost += lost
        if len(t) == 0:
            self.cursor = next_seq
            return
        columns = store.columns
        events = [{"time": w, "elapsed_s": ti - store.t_start, **dict(zip(columns, row))}
                  for ti, w, row in zip(t.tolist(), wall.tolist(), rows.T.tolist())]
        many = getattr(self.sender, "publish_many", None)
        if many is not None:
            many(events)
        else:
            for event in events:
                self.sender.publish(event)
        # Advance only after a successful publish, so a failed write is retried;
        # and not if a later run's call took over while this publish was stuck.
        if self._store is store:
            self.cursor = next_seq
        self.sent += len(events)

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
        except Exception as err:  # a broken consumer must not stop the others
            self.faults.record(consumer, err)
