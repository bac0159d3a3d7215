"""The engine: sources -> sampler -> store, plus consumers on their own thread.

:class:`Monitor` is what the notebook layer, the CLI and both seed APIs
drive, each with an :class:`~nbmon.options.Options`. Consumers (file
senders, the seed's StatsDict publisher, a user's sink) run on one
``nbmon-consumers`` thread at their own cadence, reading the store, so a
slow or stuck consumer never delays a sample or the shutdown.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
import weakref
from typing import Callable, Sequence

from . import catalog
from .sinks.consumers import ConsumerThread, as_consumer
from .sampling.faults import FaultLog
from .format import one_line
from .launch import StartError, check_room, resident_mb
from .options import Options, check_pid
from .sampling.sampler import STOP_GRACE_S, Sampler, Sampling
from .sources import Sources
from .sources.machine import Machine
from .sources.tree import ProcessTree
from .sampling.store import Store, Window
from .report.summary import ResourceSummary, summarize

_running: "weakref.WeakSet[Monitor]" = weakref.WeakSet()


# A cell's first sample read late (engine.Monitor.window): the watched
# process's RSS moved less than this across it, or it was taken this often.
STEADY_MB = 1.0
STEADY_TRIES = 3


class Monitor:
    """Samples a process tree, the machine and its GPUs every ``interval`` seconds.

    ``pid`` defaults to this process; ``options`` (an :class:`Options`), with
    any of its fields given as keywords on top (``Monitor(interval=0.5,
    gpu=False)``). ``extra_sources`` are objects with ``fields``,
    ``start(now)``, ``sample(now)`` returning ``{field: value}`` and
    ``close()``; ``consumers`` are consumers, senders or callables
    (:func:`~nbmon.sinks.consumers.as_consumer`). Restartable: each ``start()``
    begins a new run with a new store; the last run's store and summary
    stay readable after ``stop()``.
    """

    def __init__(self, pid: int | None = None, options: Options | None = None, *,
                 extra_sources: Sequence = (), consumers: Sequence = (),
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 event: Callable[[], object] = threading.Event,
                 **settings):
        self.pid = os.getpid() if pid is None else check_pid(pid)
        self.options = Options.of(options, **settings)
        if self.options.backend == "process" and (extra_sources or clock is not time.monotonic):
            raise ValueError("backend='process' samples in another process: "
                             "extra_sources and a custom clock need backend='thread'")
        self.backend_used: str | None = None   # what the last start() ran: a failed helper falls back
        self.backend_note = ""
        self.extra_sources = list(extra_sources)
        self.consumers = [as_consumer(c) for c in consumers]
        self.clock, self.wall, self.event = clock, wall, event
        self.store: Store | None = None
        self.sources: Sources | None = None   # the thread backend's, for inspection
        self._info: Callable[[], dict] = dict
        self._sampler: Sampling | None = None
        self._consumer_thread: ConsumerThread | None = None
        self._run_window: Window | None = None
        self._consumer_faults = FaultLog()
        self._runs = 0
        self._lock = threading.Lock()

    @property
    def interval(self) -> float:
        return self.options.interval

    @property
    def backend(self) -> str:
        return self.options.backend

    # -- lifecycle -------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._sampler is not None and self._sampler.running

    @property
    def thread(self) -> threading.Thread | None:
        """The current (or last) run's sampling thread; None before start()."""
        return getattr(self._sampler, "_thread", None)

    def start(self) -> "Monitor":
        """Start a new run (a no-op if already running). A run that cannot
        start raises :class:`StartError`, saying why in one sentence, with
        nothing of it left open or running."""
        with self._lock:
            if self.running:
                return self
            self._stop_locked()
            check_room()
            try:
                self._start_locked()
            except (OSError, RuntimeError, MemoryError) as err:
                raise StartError(f"nbmon could not start: {_why(err)}") from err
            return self

    def _start_locked(self) -> None:
        sampler = self._process_sampler() if self.options.backend == "process" else None
        if sampler is None:
            sampler = self._thread_sampler()
        try:
            store = Store(sampler.fields, self.options.max_bytes, t_start=sampler.t_start)
        except BaseException:
            sampler.close_sources()
            raise
        sampler.sink = store.append
        self.store = store
        self._run_window = store.open_window(sampler.t_start)
        self._consumer_faults = FaultLog()
        self._runs += 1
        self._consumer_thread = None
        if self.consumers:
            self._consumer_thread = self._new_consumer_thread(sampler)
        sampler.launch()
        self._sampler = sampler
        if self._consumer_thread is not None:
            try:
                self._consumer_thread.start()
            except BaseException:
                self._consumer_thread = None
                self._stop_locked(timeout=0.0)
                raise
        _running.add(self)

    def _new_consumer_thread(self, sampler) -> ConsumerThread:
        run = self._runs
        thread = ConsumerThread(self.consumers, self.store, self._consumer_faults,
                                retired=lambda: self._runs != run)
        # When the watched process exits, the consumers get their final call at once.
        sampler.on_finish = thread.stop
        return thread

    def attach(self, sink, every_s: float = 1.0):
        """Add a consumer, sender or callable (see
        :func:`~nbmon.sinks.consumers.as_consumer`), also to a running monitor;
        returns the consumer."""
        consumer = as_consumer(sink, every_s)
        with self._lock:
            self.consumers.append(consumer)
            if self.running:
                if self._consumer_thread is None:
                    self._consumer_thread = self._new_consumer_thread(self._sampler)
                    self._consumer_thread.start()
                else:
                    self._consumer_thread.add(consumer)
        return consumer

    def _thread_sampler(self) -> Sampler:
        sources = Sources(self.pid, self.options)
        tree = sources.tree
        sampler = Sampler(sources.all + self.extra_sources, None, self.options.interval,
                          clock=self.clock, wall=self.wall, event=self.event,
                          until=None if self.pid == os.getpid() else lambda: not tree.alive)
        sampler.prime()
        self.backend_used, self.sources = "thread", sources
        self._info = sources.info
        return sampler

    def _process_sampler(self):
        """The helper-process sampler, or None (said once in ``backend_note``
        and a warning) when it cannot start here."""
        try:
            from .sampling.process import ProcessSampler

            sampler = ProcessSampler(self.pid, self.options)
            sampler.prime()
        except Exception as err:
            if not self.backend_note:
                self.backend_note = f"the sampler process could not start ({err}); sampling from a thread instead"
                warnings.warn(f"nbmon: {self.backend_note}", RuntimeWarning, stacklevel=3)
            return None
        self.backend_used, self.sources = "process", None
        self._info = lambda: sampler.info
        return sampler

    def stop(self, timeout: float | None = None) -> bool:
        """Stop sampling and flush the consumers; bounded by ``interval + 0.1`` s
        (or ``timeout``) even when a source or sender is stuck. Returns False
        if a stuck thread had to be left behind (it can never write again)."""
        with self._lock:
            return self._stop_locked(timeout)

    def _stop_locked(self, timeout: float | None = None) -> bool:
        sampler, consumers = self._sampler, self._consumer_thread
        if sampler is None:
            return True
        deadline = time.monotonic() + (self.options.interval + STOP_GRACE_S if timeout is None else timeout)
        # The run ends with its final state, even one shorter than an interval,
        # read by the sampler itself: a source that sticks in it cannot hold us.
        clean = sampler.stop(timeout=max(0.0, deadline - time.monotonic()), final=True)
        if consumers is not None:
            consumers.stop()
            clean = consumers.join(max(0.0, deadline - time.monotonic())) and clean
            self._consumer_thread = None
        if self._run_window is not None:
            self._run_window.close()
        _running.discard(self)
        # Said once per failing source, here in the caller's thread (never from
        # the sampler's): the thread only counts; faults has the details.
        sampler.faults.warn_unreported(stacklevel=3)
        return clean

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- results ---------------------------------------------------------
    @property
    def fields(self) -> tuple[str, ...]:
        return self.store.columns if self.store is not None else ()

    @property
    def faults(self) -> dict:
        """{source or consumer name: Fault} since the run started (empty when none)."""
        out = dict(self._sampler.faults) if self._sampler else {}
        out.update(self._consumer_faults)
        return out

    @property
    def peaks(self) -> str | None:
        """How this run reads peaks (None before start): "high-water marks"
        (read, never reset: nothing changes in the watched processes),
        "reset" (``exact_peaks=True``) or "sampled" (no marks: not Linux)."""
        return self._info().get("peaks")

    @property
    def gpu_state(self) -> str:
        """'ok', or why GPU figures are off."""
        return self._info().get("gpu_state", "not started")

    @property
    def gpu_count(self) -> int:
        return self._info().get("gpu_devices", 0)

    def summary(self) -> ResourceSummary:
        """Summary of the current (or last) run, exact over every sample."""
        if self._run_window is None:
            return ResourceSummary.zeroed()
        return summarize(self._run_window.stats())

    def window(self, rss_at_start_mb: float | None = None) -> "Span":
        """Open a span whose summary covers only what happens from now on.

        A sample is taken at once (and another at ``close()``), so even a
        span shorter than the interval has exact figures: its start RSS for
        the growth, and the kernel's peak since its start.

        ``rss_at_start_mb``: the watched process's RSS when the span really
        began, before this call (a cell opened by a note the helper read
        late). The tree's memory then started where its first sample was
        less how far that RSS moved since, so that a cell that frees at once
        still peaks where it started and shrinks by what it freed; moved by
        more than :data:`STEADY_MB`, its peak up to that sample is bracketed."""
        if self.store is None:
            raise RuntimeError("the monitor has not been started")
        if rss_at_start_mb is None:
            taken = self._sampler is not None and self._sampler.sample_now()
            return Span(self, self.store.open_window(self.clock(), baseline=taken))
        for _ in range(STEADY_TRIES):   # a sample of one moment: the RSS as steady across it
            before = resident_mb(self.pid)
            taken = self._sampler is not None and self._sampler.sample_now()
            rss_mb = resident_mb(self.pid)
            if abs(rss_mb - before) < STEADY_MB:
                break
        span = Span(self, self.store.open_window(self.clock(), baseline=taken))
        moved = rss_at_start_mb - rss_mb
        if taken and moved == moved:
            metrics = [catalog.BY_NAME[name] for name in catalog.WITH_KERNEL_RSS]
            span.window.start_moved(moved, {m.name: tuple(filter(None, (m.peak, m.bound))) for m in metrics},
                                    tuple(m.bound for m in metrics if m.bound) if abs(moved) >= STEADY_MB else ())
        return span

    def rest(self, resting: bool, every_s: float | None = None) -> None:
        """While ``resting`` (a notebook between its cells), sample only
        every ``every_s`` seconds; at the interval again once not. The
        thread sampler's; a helper process samples at its interval."""
        rest = getattr(self._sampler, "rest", None)
        if rest is not None:
            rest(resting, every_s)

    def hurry(self, consumer) -> None:
        """Call ``consumer`` (attached) as soon as the consumer thread can,
        not at its next turn: for one that must see an event at once."""
        thread = self._consumer_thread
        if thread is not None:
            thread.hurry(consumer)

    def sample_now(self) -> bool:
        """Take one sample now, from the calling thread; False if not running."""
        return self._sampler is not None and self._sampler.sample_now()

    def latest(self) -> dict[str, float]:
        return self.store.latest() if self.store is not None else {}


def _why(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        where = err.filename if isinstance(err.filename, str) else ""
        return one_line(f"{err.strerror} ({where})" if where else err.strerror)
    return one_line(str(err) or type(err).__name__)


class Span:
    """A part of a run (one notebook cell, say) with its own exact summary."""

    def __init__(self, monitor: Monitor, window: Window):
        self.monitor = monitor
        self.window = window
        self.t_open = window.folded.t_open

    def summary(self) -> ResourceSummary:
        return summarize(self.window.stats())

    def close(self) -> ResourceSummary:
        if self.window.closed is None:
            self.monitor.sample_now()
        self.window.close()
        return self.summary()

    def __enter__(self) -> "Span":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _signal_all_at_exit() -> None:
    # Only signal: joining here could block interpreter exit behind a stuck source.
    for monitor in list(_running):
        stop = getattr(monitor._sampler, "_stop", None)  # a helper process ends on the EOF of our exit
        if stop is not None:
            stop.set()


def _forget_all_in_child() -> None:
    # Threads do not survive fork; the child starts with no sampler and fresh locks.
    for monitor in list(_running):
        monitor._lock = threading.Lock()
        sampler, monitor._sampler = monitor._sampler, None
        monitor._consumer_thread = None
        if monitor.store is not None:
            monitor.store._lock = threading.Lock()
        # The child's copies of the parent's descriptors: the helper's pipes
        # (the helper would never see EOF while the child lives) and the
        # /proc files of nbmon's own sources. User sources are left alone.
        after_fork = getattr(sampler, "after_fork_in_child", None)
        if after_fork is not None:
            after_fork()
        for source in getattr(sampler, "sources", ()):
            if isinstance(source, (ProcessTree, Machine)):
                try:
                    source.close()
                except OSError:
                    pass
    _running.clear()


atexit.register(_signal_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)
