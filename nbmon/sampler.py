"""The sampling thread: reads every source on a drift-free schedule.

A :class:`Sampler` runs once: ``start()`` primes the sources in the calling
thread (so a bad pid raises there), then one daemon thread named
``nbmon-sampler`` calls each source's ``sample(now)`` every ``interval``
seconds and hands the row to ``sink(t_mono, t_wall, row)``. Sources take the
pid they watch and return plain floats, so nothing here assumes that the
sampler lives in the monitored process.

Faults never kill the thread: a source that raises, or returns the wrong
number of values, or values that are not non-negative numbers, gives NaN for
its fields and is counted in :attr:`faults`; the other sources go on.
Nothing is printed from the thread: callers read :attr:`faults`.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable, Sequence

import numpy as np

NAN = math.nan


class Fault:
    """How often one source failed, and its first error in words."""

    __slots__ = ("source", "count", "first_error", "reported")

    def __init__(self, source: str, first_error: str):
        self.source = source
        self.count = 0
        self.first_error = first_error
        self.reported = False

    def __repr__(self) -> str:
        return f"Fault({self.source!r}, count={self.count}, first_error={self.first_error!r})"


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
        self.faults: dict[str, Fault] = {}
        self.t_start = NAN
        self.fields: tuple[str, ...] = ()
        self._stop = event()
        self._final = False      # stop() asked the thread for the run's final sample
        self._abandoned = False  # stop() gave up on the thread: it must never write again
        self._sink_lock = threading.Lock()
        # Serialises the thread's samples with sample_now(): sources are not thread-safe.
        self._step_lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._slices: list[tuple[object, slice]] = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def prime(self) -> None:
        """Open the sources and take their baselines; fixes :attr:`fields`."""
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
            width = len(source.fields)
            self._slices.append((source, slice(at, at + width)))
            fields.extend(source.fields)
            at += width
        self.fields = tuple(fields)

    def start(self) -> None:
        self.prime()
        self.launch()

    def launch(self) -> None:
        """Start the thread on primed sources."""
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
        thread = self._thread
        if thread is None:
            return True
        thread.join(self.interval + 0.1 if timeout is None else timeout)
        if thread.is_alive():
            with self._sink_lock:  # a final sample still being read is not stored
                self._abandoned = True
            return False
        return True

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
            self._fault(self.sink, err)
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
                    self._fault(source, err)
            now = self.clock()
            row = self.read(now)
            with self._sink_lock:
                if self._abandoned or (self.until is not None and self.until()):
                    return
                try:
                    self.sink(now, self.wall(), row)
                except Exception as err:
                    self._fault(self.sink, err)

    def read(self, now: float) -> np.ndarray:
        values: list = []
        for source, cols in self._slices:
            try:
                got = source.sample(now)
                if len(got) != cols.stop - cols.start:
                    raise ValueError(f"returned {len(got)} values for {cols.stop - cols.start} fields")
                values.extend(got)
            except Exception as err:  # a source must never take the thread down
                self._fault(source, err)
                values.extend([NAN] * (cols.stop - cols.start))
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
        for source, cols in self._slices:
            for i in range(cols.start, cols.stop):
                try:
                    if isinstance(values[i], (str, bytes)):  # float() would parse "12"
                        raise TypeError
                    row[i] = float(values[i])
                except (TypeError, ValueError):
                    row[i] = NAN
                    self._fault(source, TypeError(f"{source_name(source)} gave {values[i]!r} "
                                                  f"for {self.fields[i]}"))
        return row

    def _reject_negative(self, row: np.ndarray) -> None:
        for source, cols in self._slices:
            part = row[cols]
            bad = part < 0
            if bad.any():
                field = self.fields[cols.start + int(np.argmax(bad))]
                self._fault(source, ValueError(f"negative value for {field}"))
                part[bad] = NAN

    def _fault(self, source, err: BaseException) -> None:
        name = source_name(source)
        fault = self.faults.get(name)
        if fault is None:
            fault = self.faults[name] = Fault(name, f"{type(err).__name__}: {err}")
        fault.count += 1

    def _run(self, stop) -> None:
        interval, clock, t_start = self.interval, self.clock, self.t_start
        tick = 1
        try:
            while True:
                next_t = t_start + tick * interval  # not summed: no rounding drift
                delay = next_t - clock()
                if (delay > 0 and stop.wait(delay)) or stop.is_set():
                    break
                # Time is read under the lock: a sample_now() that got it first
                # appends first and earlier, so the store's times never go back.
                with self._step_lock:
                    now = clock()
                    try:
                        self.step(now)
                    except Exception as err:  # a failing sink must not end sampling either
                        self._fault(self.sink, err)
                if self.until is not None and self.until():
                    stop.set()
                    break
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
                self._fault(source, err)


def source_name(source) -> str:
    return getattr(source, "name", None) or type(source).__name__
