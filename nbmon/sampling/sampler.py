"""The sampling thread: reads every source on a drift-free schedule.

A :class:`Sampler` runs once: ``prime()`` opens the sources in the calling
thread (so a bad pid raises there), ``launch()`` starts one daemon thread
named ``nbmon-sampler`` that calls each source's ``sample(now)`` every
``interval`` seconds and hands the row (in the order of :attr:`fields`) to
``sink(t_mono, t_wall, row)``. Sources take the pid they watch and return
``{field: float}``, so nothing here assumes that the sampler lives in the
monitored process.

Faults never kill the thread: a source that raises, leaves out one of its
fields, or gives values that are not non-negative numbers, gives NaN for
its fields and is counted in :attr:`faults`; the other sources go on. A
source whose figures failed only in part says so through an optional
``drain_faults()`` (a list of sentences, read after each sample).
Nothing is printed from the thread: callers read :attr:`faults`.
"""
from __future__ import annotations

import math
import operator
import threading
import time
from typing import Callable, Protocol, Sequence

import numpy as np

from .faults import FaultLog, source_name
from ..values import NAN

STOP_GRACE_S = 0.1  # stop() waits one interval plus this for the thread to end


class Sampling(Protocol):
    """What the engine drives: this module's :class:`Sampler` (a thread) and
    :class:`nbmon.sampling.process.ProcessSampler` (a helper process) alike."""

    fields: tuple[str, ...]
    t_start: float
    faults: FaultLog
    sink: Callable | None
    on_finish: Callable[[], None] | None

    @property
    def running(self) -> bool: ...

    def prime(self) -> None: ...

    def launch(self) -> None: ...

    def stop(self, timeout: float | None = None, *, final: bool = False) -> bool: ...

    def sample_now(self) -> bool: ...

    def close_sources(self) -> None: ...


class Sampler:
    """Samples ``sources`` into ``sink`` from a daemon thread.

    ``clock`` (monotonic seconds), ``wall`` (epoch seconds) and ``event``
    (an object with ``wait(timeout)``, ``set()`` and ``is_set()``) are
    injectable so tests can drive the schedule without sleeping.
    """

    def __init__(self, sources: Sequence, sink: Callable | None, interval: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 event: Callable[[], object] = threading.Event,
                 name: str = "nbmon-sampler",
                 until: Callable[[], bool] | None = None):
        self.sources = list(sources)
        self.sink = sink
        self.interval = float(interval)
        self.clock = clock
        self.wall = wall
        self.name = name
        self.until = until  # checked at each sample: True ends the run (the watched pid exited)
        self.on_finish: Callable[[], None] | None = None  # called by the thread as it ends
        self.faults = FaultLog()
        self.t_start = NAN
        self.fields: tuple[str, ...] = ()
        self._stop = event()
        self._pace = event()     # set when the pace changes (rest()) or the run stops: wakes the thread
        self._resting = False
        self.rest_s = self.interval
        self._final = False      # stop() asked the thread for the run's final sample
        self._abandoned = False  # stop() gave up on the thread: it must never write again
        self._sink_lock = threading.Lock()
        # Serialises the thread's samples with sample_now(): sources are not thread-safe.
        self._step_lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._slices: list[tuple[object, slice, Callable]] = []
        self._first: tuple | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def prime(self) -> None:
        """Open the sources and take their baselines; fixes :attr:`fields`.
        The baseline is also the run's first sample, at :attr:`t_start`
        (rates unknown there; sources not ``caller_safe`` NaN), handed to the
        sink by :meth:`launch`: what happens right after start() counts from it."""
        self.t_start = now = self.clock()
        opened = []
        try:
            for source in self.sources:
                source.start(now)
                opened.append(source)
        except BaseException:
            for source in opened:
                source.close()
            raise
        fields, at = [], 0
        for source in self.sources:
            names = tuple(source.fields)
            self._slices.append((source, slice(at, at + len(names)), _values_of(names)))
            fields.extend(names)
            at += len(names)
        self.fields = tuple(fields)
        row = self.read(now, caller=True)
        self._first = (now, self.wall(), row)

    def launch(self) -> None:
        """Hand the baseline sample to the sink and start the thread on primed sources."""
        try:
            self.sink(*self._first)
        except Exception as err:  # counted, as in the thread
            self.faults.record(self.sink, err)
        thread = threading.Thread(target=self._run, args=(self._stop,), name=self.name, daemon=True)
        try:
            thread.start()
        except BaseException:
            self.close_sources()
            raise
        self._thread = thread

    def stop(self, timeout: float | None = None, *, final: bool = False) -> bool:
        """Stop sampling; returns within ``interval + 0.1`` s (or ``timeout``)
        even if a source is stuck. With ``final`` the thread takes one last
        sample as it ends (never the caller: a source that sticks in it must
        not hold up the caller). Returns False if the thread had to be
        abandoned: it is a daemon, owns its sources, and exits (closing them)
        when the stuck call returns, without writing to the sink again."""
        self._final = final
        self._stop.set()
        self._pace.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(self.interval + STOP_GRACE_S if timeout is None else timeout)
        if thread.is_alive():
            with self._sink_lock:  # a final sample still being read is not stored
                self._abandoned = True
            return False
        return True

    def rest(self, resting: bool, every_s: float | None = None) -> None:
        """Sample only every ``every_s`` seconds (on the same grid, at least
        every interval) while ``resting``, at every interval otherwise: a
        notebook between its cells. A change wakes the thread at once."""
        if every_s is not None:
            self.rest_s = max(float(every_s), self.interval)
        if resting != self._resting:
            self._resting = resting
            self._pace.set()

    def step(self, now: float) -> None:
        """Take one sample at ``now`` and hand it to the sink."""
        with self._step_lock:
            row = self.read(now)
            # A row read once the run is over (the watched process exited: an
            # empty tree, RSS 0) is not part of the run.
            if not self._stop.is_set() and not (self.until is not None and self.until()):
                self.sink(now, self.wall(), row)

    def sample_now(self) -> bool:
        """Take one extra sample from the calling thread (at a cell's start or
        end, say); False if the thread holds the sources for over an interval."""
        if not self.running or not self._step_lock.acquire(timeout=self.interval):
            return False
        try:
            if self._stop.is_set():  # stopped while we waited: the sources may be closed
                return False
            for source in self.sources:
                boundary = getattr(source, "boundary", None)
                if boundary is not None:  # e.g. read the exact peak at this very sample
                    boundary()
            self.step(self.clock())  # re-entrant: the lock is an RLock
        except Exception as err:  # a failing sink is counted, as in the thread
            self.faults.record(self.sink, err)
            return False
        finally:
            self._step_lock.release()
        return True

    def _final_step(self) -> None:
        """The run's last sample, asked for by stop(final=True), with the
        boundary reads of sample_now() (the exact peak up to the end)."""
        with self._step_lock:
            for source in self.sources:
                try:
                    boundary = getattr(source, "boundary", None)
                    if boundary is not None:
                        boundary()
                except Exception as err:
                    self.faults.record(source, err)
            now = self.clock()
            row = self.read(now)
            with self._sink_lock:
                if self._abandoned or (self.until is not None and self.until()):
                    return
                try:
                    self.sink(now, self.wall(), row)
                except Exception as err:
                    self.faults.record(self.sink, err)

    def read(self, now: float, *, caller: bool = False) -> np.ndarray:
        """One row. With ``caller`` (read by the caller's thread, not the
        sampler's), only sources marked ``caller_safe`` are read: nbmon's own
        /proc readers cannot get stuck, a user's source or a lost GPU can."""
        values: list = []
        for source, cols, values_of in self._slices:
            if caller and not getattr(source, "caller_safe", False):
                values.extend([NAN] * (cols.stop - cols.start))
                continue
            try:
                values.extend(values_of(source.sample(now)))
            except Exception as err:  # a source must never take the thread down
                self.faults.record(source, err)
                values.extend([NAN] * (cols.stop - cols.start))
            drain = getattr(source, "drain_faults", None)
            if drain is not None:  # a part of its figures failed, the rest stand
                for error in drain():
                    self.faults.record(source, error)
        try:
            row = np.array(values)
        except (TypeError, ValueError):  # ragged
            row = None
        # Plain numbers only: with dtype=float numpy would also parse text like "12".
        if row is None or row.dtype.kind not in "fiub" or row.shape != (len(values),):
            row = self._coerce(values)
        else:
            row = row.astype(np.float64, copy=False)
        if (row < 0).any():
            self._reject_negative(row)
        return row

    def _coerce(self, values: list) -> np.ndarray:
        row = np.empty(len(values))
        for source, cols, _ in self._slices:
            for i in range(cols.start, cols.stop):
                try:
                    if isinstance(values[i], (str, bytes)):  # float() would parse "12"
                        raise TypeError
                    row[i] = float(values[i])
                except (TypeError, ValueError):
                    row[i] = NAN
                    self.faults.record(source, TypeError(f"{source_name(source)} gave {values[i]!r} "
                                                  f"for {self.fields[i]}"))
        return row

    def _reject_negative(self, row: np.ndarray) -> None:
        for source, cols, _ in self._slices:
            part = row[cols]
            bad = part < 0
            if bad.any():
                field = self.fields[cols.start + int(np.argmax(bad))]
                self.faults.record(source, ValueError(f"negative value for {field}"))
                part[bad] = NAN

    def _run(self, stop) -> None:
        interval, clock, t_start = self.interval, self.clock, self.t_start
        tick = 1   # the next tick on the grid; a resting run samples on every ``every``-th
        try:
            while True:
                if self.until is not None and self.until():  # (possibly at the baseline already)
                    stop.set()
                    break
                every = max(1, round(self.rest_s / interval)) if self._resting else 1
                next_t = t_start + -(-tick // every) * every * interval  # not summed: no rounding drift
                delay = next_t - clock()
                if delay > 0 and self._pace.wait(delay):
                    if stop.is_set():
                        break
                    self._pace.clear()   # the pace changed: the next tick at the new one
                    tick = max(tick, math.floor((clock() - t_start) / interval) + 1)
                    continue
                if stop.is_set():
                    break
                # Time is read under the lock: a sample_now() that got it first
                # appends first and earlier, so the store's times never go back.
                with self._step_lock:
                    now = clock()
                    try:
                        self.step(now)
                    except Exception as err:  # a failing sink must not end sampling either
                        self.faults.record(self.sink, err)
                # Fell behind (suspended, GIL held, a slow source): skip the
                # missed ticks, never burst, and stay on the same grid.
                tick = max(tick + 1, math.floor((clock() - t_start) / interval) + 1)
                if t_start + tick * interval <= now:  # rounding put the next tick on this sample
                    tick += 1
            if self._final and not self._abandoned:  # abandoned: its sources may be in use again
                self._final_step()
        finally:
            with self._step_lock:  # not while a sample_now() is reading them
                self.close_sources()
            if self.on_finish is not None:
                self.on_finish()

    def close_sources(self) -> None:
        for source in self.sources:
            try:
                source.close()
            except Exception as err:
                self.faults.record(source, err)


def _values_of(names: tuple[str, ...]) -> Callable:
    """A function from a source's {field: value} to its values in ``names``
    order; a field left out raises ValueError naming it."""
    if not names:
        return lambda got: ()
    pick = operator.itemgetter(*names)
    one = len(names) == 1

    def values_of(got):
        try:
            picked = pick(got)
        except KeyError as err:
            raise ValueError(f"gave no value for {err.args[0]!r}") from None
        return (picked,) if one else picked
    return values_of
