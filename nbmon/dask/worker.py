"""The worker side: what runs inside each Dask worker (and one hook on the scheduler).

:class:`NbmonPlugin` (a ``distributed`` WorkerPlugin) joins its worker to
the process's *hub*: one :class:`~nbmon.engine.Monitor` (thread backend)
on the worker process and its children, shared by the workers of one
process and one watch. The hub is the monitor's consumer: every
``every_s`` it turns the samples taken since its last call into one batch
(:mod:`nbmon.dask.wire`) and logs it as an event of the watch's topic on
each of its workers, which Dask forwards, through the scheduler, to the
notebook's subscription. Tearing the plugin down on the last worker of a
process stops the monitor: no nbmon thread is left behind.

The machine (CPU, memory, disk, network of the host) is sampled by one
process per host and watch: :class:`HostMachine` holds a lock file in the
user's private directory (:func:`nbmon.private.private_dir`: another user
of the host can neither hold it nor plant one); the others try to take it
over every few seconds, so a host stays covered when its reporter dies;
locks whose holder was killed are swept. :class:`Roster`, a
SchedulerPlugin, tells the notebook when a worker joins or leaves,
including one that was killed.
"""
from __future__ import annotations

import fcntl
import hashlib
import math
import os
import socket
import threading
import weakref

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from .. import catalog, private
from ..engine import Monitor
from ..options import Options
from ..sources.machine import Machine
from ..values import MIB, NAN
from .wire import HEADER_EVERY, Encoder

TAKEOVER_S = 2.0   # how often a host's other processes try to take the machine over
# A batch every 1.5 heartbeats at least. Dask spaces heartbeats out as the
# cluster grows (0.5 s up to 10 workers, 2 s up to 200, n/200 + 1 s beyond),
# so that the scheduler's load stays bounded: nbmon's events follow, at
# two thirds of the heartbeats' rate (benchmarks/RESULTS_CLUSTER.md).
HEARTBEATS_PER_BATCH = 1.5


LOCKS = "dask"   # the host locks' directory, in the private one


class HostMachine:
    """The machine's figures from the one process per host that holds the
    host lock of ``key``; NaN in every other process. ``problem``: why this
    process cannot take part (its private directory is not to be had), in
    words, else None."""

    name = "machine (one process per host)"

    def __init__(self, key: str):
        self.fields = catalog.names(catalog.MACHINE)
        self.digest = hashlib.sha1(key.encode()).hexdigest()[:20]
        self.path: str | None = None
        self.problem: str | None = None
        self._none = dict.fromkeys(self.fields, NAN)
        self._machine: Machine | None = None
        self._fd = -1
        self._next_try = -math.inf
        _host_machines.add(self)

    @property
    def elected(self) -> bool:
        return self._fd >= 0

    def start(self, now: float) -> None:
        try:
            directory = private.private_dir(LOCKS)
        except OSError as err:   # another user's, a link: this process does not report the host
            self.problem = f"no host lock: {err}"
            return
        self.path = os.path.join(directory, f"host-{self.digest}.lock")
        _sweep(directory)
        self._try(now)

    def _try(self, now: float) -> None:
        self._next_try = now + TAKEOVER_S
        try:
            fd = private.open_private(self.path)
        except OSError as err:  # no room there, or not a file of ours: this process does not report the host
            self.problem = f"no host lock: {err}"
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The holder unlinks the file as it leaves: a lock on that old
            # file would make two holders.
            if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                raise BlockingIOError
            machine = Machine()
            machine.start(now)
        except OSError:  # held elsewhere (BlockingIOError), or gone since we opened it
            os.close(fd)
            return
        self._fd, self._machine = fd, machine

    def sample(self, now: float) -> dict[str, float]:
        if self._fd < 0 and self.path is not None and now >= self._next_try:
            self._try(now)
        return self._machine.sample(now) if self._fd >= 0 else self._none

    def close(self) -> None:
        if self._fd >= 0:
            self._machine.close()
            try:
                os.unlink(self.path)   # while still holding it: see _try
            except OSError:
                pass
            os.close(self._fd)
            self._fd, self._machine = -1, None


_host_machines: "weakref.WeakSet[HostMachine]" = weakref.WeakSet()


def _sweep(directory: str) -> None:
    """Remove the host locks of watches whose holder died (no process holds
    them): taken, unlinked while held, as a holder leaves its own."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith("host-") and n.endswith(".lock")]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = private.open_private(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
        except OSError:   # held: a live watch's
            pass
        finally:
            os.close(fd)


def _drop_locks_in_child() -> None:
    # A forked child (a task's multiprocessing worker) shares the lock with
    # its parent: were it to keep its copy, the host would stay locked after
    # the worker died, and nobody could take the machine over.
    for machine in list(_host_machines):
        if machine._fd >= 0:
            os.close(machine._fd)
            machine._fd, machine._machine = -1, None


os.register_at_fork(after_in_child=_drop_locks_in_child)


def log_event(worker, topic: str, msg: dict) -> None:
    """The transport: an event on the worker's batched stream to the scheduler
    (thread-safe), forwarded to the topic's subscribers. Measured against a
    heartbeat ``metrics`` entry and a ``client.run`` pull
    (benchmarks/RESULTS_CLUSTER.md): the fewest bytes and the lowest latency,
    pushed and never lost while a worker lives, at a scheduler CPU cost
    close to the heartbeats'."""
    worker.log_event(topic, msg)


class _Hub:
    """The monitor of one process for one watch, and its batches."""

    def __init__(self, topic: str, options: Options, every_s: float, send):
        self.topic, self.send = topic, send
        self.least_every_s = self.every_s = every_s   # every_s: read by the consumer thread before each call
        self.machine = HostMachine(topic) if options.system else None
        self.monitor = Monitor(os.getpid(), Options.of(options, system=False, backend="thread"),
                               extra_sources=[self.machine] if self.machine else [],
                               consumers=[self])
        self.workers: dict[str, object] = {}
        self.spans: dict[tuple[str, str], object] = {}
        self.host = socket.gethostname()
        self._encoder: Encoder | None = None
        self._cursor = 0
        self._headed: dict[str, tuple] = {}   # worker -> what its last header said that can change
        self._lock = threading.Lock()

    def add(self, worker) -> None:
        with self._lock:
            self.workers[worker.address] = worker
        if not self.monitor.running:
            self.monitor.start()
            self._encoder = Encoder(self.monitor.store.columns)
            self._cursor = 0

    def remove(self, worker) -> bool:
        """Leave the hub; True when it was the last worker (the monitor is stopped)."""
        if len(self.workers) == 1 and worker.address in self.workers:
            self.monitor.stop()   # its final batch still goes to this worker
        with self._lock:
            self.workers.pop(worker.address, None)
            self._headed.pop(worker.address, None)
            for key in [k for k in self.spans if k[1] == worker.address]:
                del self.spans[key]
            return not self.workers

    def _about(self, worker) -> dict:
        memory = getattr(worker, "memory_manager", None)

        def fraction(name):
            value = getattr(memory, name, False)
            return None if value is False or value is None else float(value)

        limit = getattr(memory, "memory_limit", None)
        return {"host": self.host, "name": str(worker.name), "pid": os.getpid(),
                "limit_mb": limit / MIB if limit else None,
                "spill": fraction("memory_spill_fraction"), "pause": fraction("memory_pause_fraction"),
                "machine": self.machine is not None and self.machine.elected, "period_s": self.every_s,
                "machine_problem": self.machine.problem if self.machine is not None else None,
                "peaks": self.monitor.peaks, "gpu": self.monitor.gpu_state}

    def _pace(self, workers) -> None:
        """The batch period: every_s, or more when Dask spaces heartbeats out."""
        beats = [getattr(w, "periodic_callbacks", {}).get("heartbeat") for w in workers]
        beat_s = max((b.callback_time / 1000.0 for b in beats if b is not None), default=0.0)
        self.every_s = max(self.least_every_s, HEARTBEATS_PER_BATCH * beat_s)

    # -- consumer of the monitor's store --------------------------------------
    def consume(self, store, final: bool) -> None:
        t, wall, rows, self._cursor, _lost = store.rows_since(self._cursor)
        if not len(t):
            return
        batch = self._encoder.encode(wall, rows, end=final)
        with self._lock:
            workers = list(self.workers.items())
        self._pace(worker for _, worker in workers)
        changing = (self.machine is not None and self.machine.elected, self.every_s)
        if batch["s"] % HEADER_EVERY == 0:
            self._headed.clear()
        for address, worker in workers:
            msg = dict(batch, w=address)
            if self._headed.get(address) != changing:
                msg["h"] = self._encoder.header(self._about(worker))
                self._headed[address] = changing
            self.send(worker, self.topic, msg)

    def close(self) -> None:
        pass


_hubs: dict[str, _Hub] = {}
_hubs_lock = threading.Lock()


class NbmonPlugin(WorkerPlugin):
    """Samples the worker for the watch of ``topic``; see the module's doc.
    ``send(worker, topic, msg)`` is the transport (the benchmark swaps it)."""

    def __init__(self, topic: str, options_json: str, every_s: float, send=log_event):
        self.topic, self.options_json, self.every_s, self.send = topic, options_json, every_s, send

    def setup(self, worker) -> None:
        with _hubs_lock:
            hub = _hubs.get(self.topic)
            if hub is None:
                hub = _hubs[self.topic] = _Hub(self.topic, Options.from_json(self.options_json),
                                               self.every_s, self.send)
        hub.add(worker)

    def teardown(self, worker) -> None:
        with _hubs_lock:
            hub = _hubs.get(self.topic)
            if hub is not None and hub.remove(worker):
                del _hubs[self.topic]


def roster_name(topic: str) -> str:
    return topic + "-roster"


class Roster(SchedulerPlugin):
    """On the scheduler: tells the watch's topic which workers join and leave
    (a killed worker too: the scheduler sees its connection drop), and stops
    the watch everywhere if the notebook's client (``client_id``) goes away
    without unwatching (a killed kernel)."""

    def __init__(self, topic: str, client_id: str):
        self.topic, self.client_id = topic, client_id
        self.name = roster_name(topic)

    def add_worker(self, scheduler, worker: str) -> None:
        scheduler.log_event(self.topic, {"joined": worker})

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        scheduler.log_event(self.topic, {"left": worker})

    def remove_client(self, scheduler, client: str) -> None:
        if client != self.client_id:
            return
        scheduler.remove_plugin(self.name)
        if self.topic in scheduler.worker_plugins:
            scheduler.loop.add_callback(scheduler.unregister_worker_plugin, None, self.topic)


# -- called on the workers through client.run --------------------------------------

def open_span(topic: str, token: str, dask_worker=None) -> bool:
    """Open the exact span ``token`` of this worker (a notebook cell)."""
    hub = _hubs.get(topic)
    if hub is None or not hub.monitor.running:
        return False
    hub.spans[(token, dask_worker.address)] = hub.monitor.window()
    return True


def close_span(topic: str, token: str, dask_worker=None) -> dict | None:
    """Close span ``token``: its ResourceSummary as a dict, with the host."""
    hub = _hubs.get(topic)
    span = hub.spans.pop((token, dask_worker.address), None) if hub else None
    if span is None:
        return None
    return {"host": hub.host, "summary": span.close().to_dict()}


def nbmon_threads(notebook_pid: int | None = None) -> list[str]:
    """Names of the nbmon threads alive in this process; none are reported
    for the notebook's own process (``LocalCluster(processes=False)``), whose
    threads are the notebook's."""
    if os.getpid() == notebook_pid:
        return []
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("nbmon-"))
