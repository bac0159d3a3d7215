"""The engine: sources -> sampler -> store, plus consumers on their own thread.

:class:`Monitor` is what the notebook layer, the CLI and both seed APIs
drive. Consumers (file senders, the seed's StatsDict publisher) run on one
``nbmon-sender`` thread at their own cadence, reading the store, so a slow
or stuck sender never delays a sample or the shutdown.
"""
from __future__ import annotations

import atexit
import math
import os
import threading
import time
import warnings
import weakref
from typing import Callable, Sequence

from . import nvml
from .proctree import ProcessTree
from .sampler import Fault, Sampler, source_name
from .senders import Consumer
from .store import DEFAULT_MAX_BYTES, Store, Window
from .summary import ResourceSummary, summarize
from .system import System

_running: "weakref.WeakSet[Monitor]" = weakref.WeakSet()
BACKENDS = ("thread", "process")
MIN_INTERVAL = 0.001


def check_interval(value, name: str = "interval") -> float:
    """A finite positive number of seconds, or ValueError naming the bad value as given."""
    given = value
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of seconds, got {given!r}")
    if not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number of seconds, got {given!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {given!r}")
    if value < MIN_INTERVAL:  # below this the thread would only spin
        raise ValueError(f"{name} must be at least {MIN_INTERVAL:g} s, got {given!r}")
    if value > 86400:
        raise ValueError(f"{name} must be at most a day (86400 s), got {given!r}")
    return float(value)


def check_pid(pid) -> int:
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError(f"pid must be a whole number, got {pid!r}")
    if pid <= 0:
        raise ValueError(f"pid must be a positive process id, got {pid!r}")
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        raise ValueError(f"no process with pid {pid} exists") from None
    except PermissionError:  # exists, owned by another user: /proc still reads it
        pass
    return pid


class _SenderThread:
    def __init__(self, monitor: "Monitor", consumers: Sequence[Consumer], store: Store):
        self.monitor = monitor
        self.consumers = list(consumers)
        # Its own run's store and number: a thread abandoned by stop() never
        # reads a later run's store, nor ticks or closes the consumers once a
        # later run has taken them over.
        self.store = store
        self.run = monitor._runs
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(self.stop_event,),
                                       name="nbmon-sender", daemon=True)

    def _run(self, stop) -> None:
        due = {id(c): time.monotonic() + c.every_s for c in self.consumers}
        try:
            while True:
                wait = min(due.values()) - time.monotonic()
                if stop.wait(max(0.0, wait)):
                    break
                now = time.monotonic()
                for c in self.consumers:
                    if now >= due[id(c)]:
                        self._tick(c, False)
                        due[id(c)] = max(due[id(c)] + c.every_s, now)
            for c in self.consumers:
                if self.retired:
                    break
                self._tick(c, True)
        finally:
            for c in self.consumers:
                if self.retired:
                    break
                try:
                    c.close()
                except Exception as err:
                    self.monitor._consumer_fault(c, err)

    @property
    def retired(self) -> bool:
        return self.monitor._runs != self.run

    def _tick(self, consumer: Consumer, final: bool) -> None:
        try:
            consumer.tick(self.store, final)
        except Exception as err:  # a broken sender must not stop the others
            self.monitor._consumer_fault(consumer, err)


class Monitor:
    """Samples a process tree, the machine and NVIDIA GPUs every ``interval`` seconds.

    ``pid`` defaults to this process. ``extra_sources`` are objects with
    ``fields``, ``start(now)``, ``sample(now)`` and ``close()``. Restartable:
    each ``start()`` begins a new run with a new store; the last run's store
    and summary stay readable after ``stop()``.
    """

    def __init__(self, pid: int | None = None, interval: float = 0.1, *,
                 children: bool = True, system: bool = True, gpu: bool = True,
                 extra_sources: Sequence = (), consumers: Sequence[Consumer] = (),
                 max_bytes: int = DEFAULT_MAX_BYTES, exact_peak: bool = True,
                 backend: str = "thread",
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 event: Callable[[], object] = threading.Event):
        self.pid = os.getpid() if pid is None else check_pid(pid)
        self.interval = check_interval(interval)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive whole number of bytes, got {max_bytes!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if backend == "process" and (extra_sources or clock is not time.monotonic):
            raise ValueError("backend='process' samples in another process: "
                             "extra_sources and a custom clock need backend='thread'")
        self.backend = backend
        self.backend_used: str | None = None   # what the last start() ran: a failed helper falls back
        self.backend_note = ""
        self.children, self.system, self.gpu = children, system, gpu
        self.extra_sources = list(extra_sources)
        self.consumers = list(consumers)
        self.max_bytes = max_bytes
        self.exact_peak = exact_peak
        self.clock, self.wall, self.event = clock, wall, event
        self.store: Store | None = None
        self.tree: ProcessTree | None = None   # the thread backend's sources, for inspection
        self.gpus: nvml.GPUs | None = None
        self._info: Callable[[], dict] = dict
        self._sampler: Sampler | None = None
        self._senders: _SenderThread | None = None
        self._run_window: Window | None = None
        self._consumer_faults: dict[str, Fault] = {}
        self._runs = 0
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._sampler is not None and self._sampler.running

    def start(self) -> "Monitor":
        """Start a new run (a no-op if already running)."""
        with self._lock:
            if self.running:
                return self
            self._stop_locked()
            sampler = self._process_sampler() if self.backend == "process" else None
            if sampler is None:
                sampler = self._thread_sampler()
            try:
                store = Store(sampler.fields, self.max_bytes)
            except BaseException:
                sampler.close_sources()
                raise
            sampler.sink = store.append
            self.store = store
            self._run_window = store.open_window(sampler.t_start)
            self._consumer_faults = {}
            self._runs += 1
            senders = _SenderThread(self, self.consumers, store) if self.consumers else None
            if senders is not None:
                # When the watched process exits, the consumers get their final tick at once.
                sampler.on_finish = senders.stop_event.set
            sampler.launch()
            self._sampler, self._senders = sampler, senders
            if senders is not None:
                senders.thread.start()
            _running.add(self)
            return self

    def _thread_sampler(self) -> Sampler:
        tree = ProcessTree(self.pid, children=self.children, exact_peak=self.exact_peak)
        sources: list = [tree]
        if self.system:
            sources.append(System())
        gpus = None
        if self.gpu:
            gpus = nvml.GPUs(tree_pids=lambda: tree.pids)
            sources.append(gpus)
        sources.extend(self.extra_sources)
        sampler = Sampler(sources, None, self.interval, clock=self.clock, wall=self.wall, event=self.event,
                          until=None if self.pid == os.getpid() else lambda: not tree.root_alive)
        sampler.prime()
        self.backend_used, self.tree, self.gpus = "thread", tree, gpus
        self._info = lambda: {"peak_exact": tree.peak_exact,
                              "gpu_state": gpus.state if gpus else "off (gpu=False)",
                              "gpu_devices": len(gpus.devices) if gpus else 0}
        return sampler

    def _process_sampler(self):
        """The helper-process sampler, or None (said once in ``backend_note``
        and a warning) when it cannot start here."""
        try:
            from .procsampler import ProcessSampler

            sampler = ProcessSampler(self.pid, self.interval, children=self.children, system=self.system,
                                     gpu=self.gpu, exact_peak=self.exact_peak)
            sampler.prime()
        except Exception as err:
            if not self.backend_note:
                self.backend_note = f"the sampler process could not start ({err}); sampling from a thread instead"
                warnings.warn(f"nbmon: {self.backend_note}", RuntimeWarning, stacklevel=3)
            return None
        self.backend_used, self.tree, self.gpus = "process", None, None
        self._info = lambda: sampler.info
        return sampler

    def stop(self, timeout: float | None = None) -> bool:
        """Stop sampling and flush the consumers; bounded by ``interval + 0.1`` s
        (or ``timeout``) even when a source or sender is stuck. Returns False
        if a stuck thread had to be left behind (it can never write again)."""
        with self._lock:
            return self._stop_locked(timeout)

    def _stop_locked(self, timeout: float | None = None) -> bool:
        sampler, senders = self._sampler, self._senders
        if sampler is None:
            return True
        deadline = time.monotonic() + (self.interval + 0.1 if timeout is None else timeout)
        # The run ends with its final state, even one shorter than an interval,
        # read by the sampler itself: a source that sticks in it cannot hold us.
        clean = sampler.stop(timeout=max(0.0, deadline - time.monotonic()), final=True)
        if senders is not None:
            senders.stop_event.set()
            senders.thread.join(max(0.0, deadline - time.monotonic()))
            clean = clean and not senders.thread.is_alive()
            self._senders = None
        if self._run_window is not None:
            self._run_window.close()
        _running.discard(self)
        # Said once per failing source, here in the caller's thread (never from
        # the sampler's): the thread only counts; faults has the details.
        for fault in list(sampler.faults.values()):
            if not fault.reported:
                fault.reported = True
                warnings.warn(f"nbmon: {fault.source} failed {fault.count} time(s) in this run, "
                              f"first: {fault.first_error}", RuntimeWarning, stacklevel=3)
        return clean

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- results ---------------------------------------------------------
    @property
    def fields(self) -> tuple[str, ...]:
        return self.store.columns if self.store else ()

    @property
    def faults(self) -> dict[str, Fault]:
        """Failures per source or sender since the run started (empty when none)."""
        out = dict(self._sampler.faults) if self._sampler else {}
        out.update(self._consumer_faults)
        return out

    def _consumer_fault(self, consumer, err: BaseException) -> None:
        name = source_name(consumer)
        fault = self._consumer_faults.get(name)
        if fault is None:
            fault = self._consumer_faults[name] = Fault(name, f"{type(err).__name__}: {err}")
        fault.count += 1

    @property
    def peak_exact(self) -> bool | None:
        """Whether peak RSS is the kernel's exact high-water mark (None before start)."""
        return self._info().get("peak_exact")

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
        return summarize(self._run_window.stats(), peak_exact=self.peak_exact)

    def window(self) -> "Span":
        """Open a span whose summary covers only what happens from now on.

        A sample is taken at once (and another at ``close()``), so even a
        span shorter than the interval has exact figures: its start RSS for
        the growth, and the kernel's peak since its start."""
        if self.store is None:
            raise RuntimeError("the monitor has not been started")
        taken = self._sampler is not None and self._sampler.sample_now()
        return Span(self, self.store.open_window(self.clock(), baseline=taken))

    def sample_now(self) -> bool:
        """Take one sample now, from the calling thread; False if not running."""
        return self._sampler is not None and self._sampler.sample_now()

    def latest(self) -> dict[str, float]:
        return self.store.latest() if self.store else {}


class Span:
    """A part of a run (one notebook cell, say) with its own exact summary."""

    def __init__(self, monitor: Monitor, window: Window):
        self.monitor = monitor
        self.window = window
        self.t_open = window.folded.t_open

    def summary(self) -> ResourceSummary:
        return summarize(self.window.stats(), peak_exact=self.monitor.peak_exact)

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
        monitor._senders = None
        if monitor.store is not None:
            monitor.store._lock = threading.Lock()
        # The child's copies of the parent's descriptors: the helper's pipes
        # (the helper would never see EOF while the child lives) and the
        # /proc files of nbmon's own sources. User sources are left alone.
        after_fork = getattr(sampler, "after_fork_in_child", None)
        if after_fork is not None:
            after_fork()
        for source in getattr(sampler, "sources", ()):
            if isinstance(source, (ProcessTree, System)):
                try:
                    source.close()
                except OSError:
                    pass
    _running.clear()


atexit.register(_signal_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)
