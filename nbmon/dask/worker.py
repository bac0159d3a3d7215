"""The worker side: what runs inside each Dask worker (and one hook on the scheduler).

:class:`NbmonPlugin` (a ``distributed`` WorkerPlugin) joins its worker to
the process's *hub*: one :class:`~nbmon.engine.Monitor` (thread backend)
on the worker process and its children, shared by the workers of one
process and one watch. The hub is the monitor's consumer: every period
(``every_s``) it turns the samples taken since its last call into one
process batch (:mod:`nbmon.dask.wire`) and hands it on, so that the
scheduler relays one message per host, not per worker:

- the process that holds the host lock (:class:`HostLock`, one per host
  and watch) takes the batches of the host's other processes from their
  spool (:class:`HostSpool`) and sends them with its own, sealed with the
  watch's key, as one *host batch*: an event of the watch's topic on one
  of its workers, which Dask forwards, through the scheduler, to the
  notebook's subscription. It sends one every period, or less often on
  large clusters (:func:`host_period_s`): the whole cluster sends the
  scheduler at most about ``MAX_EVENTS_PER_S`` host batches a second.
- the host's other processes write theirs into the spool; one sends its
  own itself while no process holds the lock (the private directory is not
  to be had) or when the holder has taken none of its batches for
  ``STUCK_S``.
- every process sends its last batch itself as it stops.

The periods follow the wall clock (hosts are NTP-synchronised, as Dask's
dashboards assume): the spool is written at each period's start and read
``LAG_S`` later, so a batch waits about that long on its host.

The holder also samples the machine (CPU, memory, disk, network of the
host: :class:`HostMachine`). The lock is a file in the user's private
directory (:func:`nbmon.private.private_dir`: another user of the host can
neither hold it nor plant one); the other processes try to take it over
every ``TAKEOVER_S``, so a host stays covered when its holder dies; locks
whose holder was killed are swept. Tearing the plugin down on the last
worker of a process stops the monitor: no nbmon thread is left behind.

:class:`Roster`, a SchedulerPlugin, tells the notebook when a worker joins
or leaves, from the scheduler's own hooks (a killed worker too: the
scheduler sees its connection drop), sealed like the batches: the notebook
takes a worker's departure from nobody else.
"""
from __future__ import annotations

import collections
import fcntl
import hashlib
import math
import os
import secrets
import shutil
import socket
import threading
import time
import weakref

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from .. import catalog, private
from ..engine import Monitor
from ..options import Options
from ..sources.machine import Machine
from ..values import MIB, NAN
from . import wire

TAKEOVER_S = 2.0   # how often a host's other processes try to take the lock over
LAG_S = 0.3        # the holder reads the spool this long after the others wrote it
# The scheduler's share: each host batch costs it about the same, whatever
# it carries (benchmarks/RESULTS_CLUSTER.md), so the whole cluster's are
# kept to about this many a second; a host's period grows past every_s
# only on clusters of more hosts than that.
MAX_EVENTS_PER_S = 50.0
MAX_PERIOD_S = 30.0   # a host's period at most, however large the cluster
STUCK_S = MAX_PERIOD_S + 10.0   # a spooled batch not taken for this long: the holder is stuck

LOCKS = "dask"   # the host locks' directory, in the private one


def cluster_workers(heartbeat_s: float) -> float:
    """The most workers a cluster can have whose scheduler asks for heartbeats
    every ``heartbeat_s`` (Dask: 0.5 s up to 10 workers, 1 s below 50,
    2 s below 200, n / 200 + 1 s beyond); 0 when unknown."""
    if not heartbeat_s > 0:
        return 0.0
    for most, beat in ((10, 0.5), (49, 1.0), (199, 2.0)):
        if heartbeat_s <= beat:
            return float(most)
    return (heartbeat_s - 1.0) * 200.0


def host_period_s(every_s: float, heartbeat_s: float, host_workers: int) -> float:
    """Seconds between a host's batches: ``every_s``, or more on a cluster of
    more workers than ``host_workers`` (this host's) x MAX_EVENTS_PER_S.
    Each host's rate is its share of the cluster's workers times
    MAX_EVENTS_PER_S, so the hosts together stay within it whatever their sizes."""
    share = cluster_workers(heartbeat_s) / (max(1, host_workers) * MAX_EVENTS_PER_S)
    return min(MAX_PERIOD_S, max(every_s, share))


class HostLock:
    """Elects one process per host for the watch of ``key``: the one that
    holds the lock file. ``problem``: why this process cannot take part
    (its private directory is not to be had), in words, else None; ``busy``:
    another process held it at the last try."""

    def __init__(self, key: str):
        self.digest = hashlib.sha1(key.encode()).hexdigest()[:20]
        self.path: str | None = None
        self.spool: str | None = None   # the directory the host's batches wait in for the holder
        self.problem: str | None = None
        self.busy = False
        self._fd = -1
        self._next_try = -math.inf
        _host_locks.add(self)

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def start(self, now: float) -> None:
        try:
            directory = private.private_dir(LOCKS)
            self.spool = private.private_dir(LOCKS, f"host-{self.digest}.spool")
        except OSError as err:   # another user's, a link: this process sends its own batches
            self.problem = f"no host lock: {err}"
            return
        self.path = os.path.join(directory, f"host-{self.digest}.lock")
        _sweep(directory, keep=self.digest)
        self.poll(now)

    def poll(self, now: float) -> None:
        """Try to take the lock, at most every TAKEOVER_S, unless held."""
        if self._fd >= 0 or self.path is None or now < self._next_try:
            return
        self._next_try = now + TAKEOVER_S
        try:
            fd = private.open_private(self.path)
        except OSError as err:  # no room there, or not a file of ours
            self.problem, self.busy = f"no host lock: {err}", False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The holder unlinks the file as it leaves: a lock on that old
            # file would make two holders.
            if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                raise BlockingIOError
        except OSError:  # held elsewhere (BlockingIOError), or gone since we opened it
            os.close(fd)
            self.busy = True
            return
        self._fd, self.busy, self.problem = fd, False, None

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.unlink(self.path)   # while still holding it: see poll
            except OSError:
                pass
            os.close(self._fd)
            self._fd = -1
        if self.spool is not None:
            try:
                os.rmdir(self.spool)   # if empty: the host's last process leaves nothing behind
            except OSError:
                pass


_host_locks: "weakref.WeakSet[HostLock]" = weakref.WeakSet()


def _sweep(directory: str, keep: str) -> None:
    """Remove the host locks (and spools) of watches whose holder died (no
    process holds them), and the spools of watches whose last holder left,
    but the watch ``keep``'s: taken, unlinked while held, as a holder
    leaves its own. (A spool swept while its watch changes holder is made
    again: :class:`HostSpool`.)"""
    try:
        names = [n for n in os.listdir(directory) if n.startswith("host-") and n != f"host-{keep}.lock"
                 and n != f"host-{keep}.spool"]
    except OSError:
        return
    for name in names:
        if name.endswith(".spool") and name.removesuffix(".spool") + ".lock" not in names:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    for name in (n for n in names if n.endswith(".lock")):
        path = os.path.join(directory, name)
        try:
            fd = private.open_private(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path.removesuffix(".lock") + ".spool", ignore_errors=True)
            os.unlink(path)
        except OSError:   # held: a live watch's
            pass
        finally:
            os.close(fd)


def _drop_locks_in_child() -> None:
    # A forked child (a task's multiprocessing worker) shares the lock with
    # its parent: were it to keep its copy, the host would stay locked after
    # the worker died, and nobody could take the machine over.
    for lock in list(_host_locks):
        if lock._fd >= 0:
            os.close(lock._fd)
            lock._fd = -1


os.register_at_fork(after_in_child=_drop_locks_in_child)


class HostMachine:
    """The machine's figures from the process that holds the host lock;
    NaN in every other process (a source of the hub's monitor)."""

    name = "machine (one process per host)"

    def __init__(self, lock: HostLock):
        self.fields = catalog.names(catalog.MACHINE)
        self.lock = lock
        self._none = dict.fromkeys(self.fields, NAN)
        self._machine: Machine | None = None

    def start(self, now: float) -> None:
        pass   # the hub starts the lock

    def sample(self, now: float) -> dict[str, float]:
        if not self.lock.held:
            return self._none
        if self._machine is None:   # just taken over
            self._machine = Machine()
            self._machine.start(now)
        return self._machine.sample(now)

    def close(self) -> None:
        if self._machine is not None:
            self._machine.close()
            self._machine = None


class HostSpool:
    """The batches of a host's processes on their way to the lock's holder:
    a file each in the watch's spool (a private directory), named so that
    the holder knows whose and for how many workers without reading it."""

    SUFFIX = ".b"

    def __init__(self, directory: str, ident: str):
        self.directory, self.ident = directory, ident
        self._mine: collections.deque = collections.deque()   # (path, bytes, written at) not yet taken

    def _remake(self) -> None:
        """The spool again, after a sweep took it (its watch was between holders)."""
        private.private_dir(LOCKS, os.path.basename(self.directory))

    def put(self, seq: int, workers: int, data: bytes, now: float) -> None:
        name = f"{self.ident}-{seq:012d}-{workers}{self.SUFFIX}"
        path, part = os.path.join(self.directory, name), os.path.join(self.directory, "." + name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(part, flags, private.FILE_MODE)
        except FileNotFoundError:
            self._remake()
            fd = os.open(part, flags, private.FILE_MODE)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(part, path)   # whole or not at all, for the holder
        self._mine.append((path, data, now))

    def take(self) -> list[tuple[str, int, bytes]]:
        """Every batch waiting, oldest first per process, as (its process,
        its workers, its bytes); each taken once."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(self.SUFFIX) and n[0] != ".")
        except OSError:
            try:
                self._remake()
            except OSError:
                pass
            return []
        out = []
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                ident, _seq, workers = name.removesuffix(self.SUFFIX).split("-")
                fd = private.open_private(path, os.O_RDONLY)
            except (ValueError, OSError):   # not a name put() gives, taken meanwhile, not a file of ours
                continue
            try:
                data = os.read(fd, wire.MAX_BODY_BYTES)
                os.unlink(path)
            except OSError:
                continue
            finally:
                os.close(fd)
            out.append((ident, int(workers) if workers.isdigit() else 1, data))
        return out

    def stuck(self, now: float) -> list[bytes]:
        """This process's batches the holder has not taken for STUCK_S, taken
        back (to be sent directly), or none."""
        while self._mine and not os.path.exists(self._mine[0][0]):
            self._mine.popleft()
        if not self._mine or now - self._mine[0][2] < STUCK_S:
            return []
        back = []
        for path, data, _ in self._mine:
            try:
                os.unlink(path)
                back.append(data)
            except OSError:   # the holder took it after all
                pass
        self._mine.clear()
        return back


def log_event(worker, topic: str, msg: dict) -> None:
    """The transport: an event on the worker's batched stream to the scheduler
    (thread-safe), forwarded to the topic's subscribers. Measured against a
    heartbeat ``metrics`` entry and a ``client.run`` pull
    (benchmarks/RESULTS_CLUSTER.md): the fewest bytes and the lowest latency,
    pushed and never lost while a worker lives; its cost on the scheduler is
    per event, hence one event per host."""
    worker.log_event(topic, msg)


class _Hub:
    """The monitor of one process for one watch, and its batches."""

    def __init__(self, topic: str, options: Options, every_s: float, key: bytes, send):
        self.topic, self.key, self.send = topic, key, send
        self.base_every_s = self.every_s = every_s   # every_s: read by the consumer thread after each call
        self.period_s = every_s                      # between this process's sends
        self.ident = secrets.token_hex(8)
        self.lock = HostLock(topic)
        self.machine = HostMachine(self.lock) if options.system else None
        self.monitor = Monitor(os.getpid(), Options.of(options, system=False, backend="thread"),
                               extra_sources=[self.machine] if self.machine else [],
                               consumers=[self])
        self.workers: dict[str, object] = {}
        self.spans: dict[tuple[str, str], object] = {}
        self.host = socket.gethostname()
        self._encoder: wire.Encoder | None = None
        self._spool: HostSpool | None = None
        self._cursor = 0
        self._headed: tuple | None = None   # what the last header said that can change
        self._pending: list[bytes] = []     # process batches to send: this one's, the host's when holding the lock
        self._host_workers: dict[str, int] = {}   # process -> its workers, of the batches pending
        self._sent_at = -math.inf
        self._lock = threading.Lock()

    def add(self, worker) -> None:
        with self._lock:
            self.workers[worker.address] = worker
        if not self.monitor.running:
            self.lock.start(time.monotonic())
            if self.lock.spool is not None:
                self._spool = HostSpool(self.lock.spool, self.ident)
            self.monitor.start()
            self._encoder = wire.Encoder(self.monitor.store.columns, self.ident)
            self._cursor = 0

    def remove(self, worker) -> bool:
        """Leave the hub; True when it was the last worker (the monitor is stopped, the lock let go)."""
        last = len(self.workers) == 1 and worker.address in self.workers
        if last:
            self.monitor.stop()   # its final batch still goes through this worker
            self.lock.close()
        with self._lock:
            self.workers.pop(worker.address, None)
            for key in [k for k in self.spans if k[1] == worker.address]:
                del self.spans[key]
            return not self.workers

    def _about(self) -> dict:
        system = self.machine is not None
        return {"host": self.host, "pid": os.getpid(), "period_s": self.base_every_s,
                "machine": system and self.lock.held, "machine_problem": self.lock.problem if system else None,
                "peaks": self.monitor.peaks, "gpu": self.monitor.gpu_state}

    @staticmethod
    def _worker_about(worker) -> dict:
        memory = getattr(worker, "memory_manager", None)

        def fraction(name):
            value = getattr(memory, name, False)
            return None if value is False or value is None else float(value)

        limit = getattr(memory, "memory_limit", None)
        return {"name": str(worker.name), "limit_mb": limit / MIB if limit else None,
                "spill": fraction("memory_spill_fraction"), "pause": fraction("memory_pause_fraction")}

    def _heartbeat_s(self, workers) -> float:
        beats = [getattr(w, "periodic_callbacks", {}).get("heartbeat") for w in workers]
        return max((b.callback_time / 1000.0 for b in beats if b is not None), default=0.0)

    # -- consumer of the monitor's store --------------------------------------
    def consume(self, store, final: bool) -> None:
        now, mono = time.time(), time.monotonic()
        self.lock.poll(mono)
        with self._lock:
            workers = dict(self.workers)
        t, wall, rows, self._cursor, _lost = store.rows_since(self._cursor)
        if workers and len(t):
            batch = self._encoder.encode(wall, rows, end=final)
            changing = (self.lock.held, self.lock.problem, tuple(workers))
            if batch["s"] % wire.HEADER_EVERY == 0 or changing != self._headed:
                batch["h"] = self._encoder.header(self._about(), {a: self._worker_about(w) for a, w in workers.items()})
                self._headed = changing
            self._hand_on(batch["s"], len(workers), wire.pack(batch), now, final)
        # The workers of what is pending: this host's when holding the lock, else this process's.
        self.period_s = host_period_s(self.base_every_s, self._heartbeat_s(workers.values()),
                                      sum(self._host_workers.values()) or len(workers))
        if workers and self._pending and (final or now >= self._sent_at + self.period_s - self.base_every_s / 2):
            body = {"p": self._pending, "period_s": self.period_s}
            self._pending, self._host_workers, self._sent_at = [], {}, now
            self.send(next(iter(workers.values())), self.topic, wire.seal(self.key, body))
        self._next_call(time.time())

    def _hand_on(self, seq: int, workers: int, data: bytes, now: float, final: bool) -> None:
        """This process's batch: to the spool when another process holds the
        lock, else (or when it is the last) with what this one sends."""
        spool = self._spool
        if self.lock.held and spool is not None:
            for ident, count, taken in spool.take():
                self._pending.append(taken)
                self._host_workers[ident] = count
        elif spool is not None and self.lock.busy and not final:
            back = spool.stuck(now)
            if not back:
                try:
                    spool.put(seq, workers, data, now)
                    return
                except OSError:   # no room in the spool: sent directly
                    pass
            self._pending.extend(back)
        self._pending.append(data)
        self._host_workers[self.ident] = workers

    def _next_call(self, now: float) -> None:
        """The consumer thread's next call: at the next period's start (the
        holder LAG_S later), at least half a period away."""
        phase = LAG_S if self.lock.held else 0.0
        ticks = math.floor((now - phase) / self.base_every_s + 0.5) + 1
        self.every_s = ticks * self.base_every_s + phase - now

    def close(self) -> None:
        pass


_hubs: dict[str, _Hub] = {}
_hubs_lock = threading.Lock()


class NbmonPlugin(WorkerPlugin):
    """Samples the worker for the watch of ``topic``; see the module's doc.
    ``key`` seals its batches; ``send(worker, topic, msg)`` is the transport."""

    def __init__(self, topic: str, options_json: str, every_s: float, key: bytes, send=log_event):
        self.topic, self.options_json, self.every_s, self.key, self.send = topic, options_json, every_s, key, send

    def setup(self, worker) -> None:
        with _hubs_lock:
            hub = _hubs.get(self.topic)
            if hub is None:
                hub = _hubs[self.topic] = _Hub(self.topic, Options.from_json(self.options_json),
                                               self.every_s, self.key, self.send)
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
    (a killed worker too: the scheduler sees its connection drop), numbered
    and sealed with ``key``; and stops the watch everywhere if the
    notebook's client (``client_id``) goes away without unwatching (a
    killed kernel)."""

    def __init__(self, topic: str, client_id: str, key: bytes):
        self.topic, self.client_id, self.key = topic, client_id, key
        self.name = roster_name(topic)
        self.said = 0

    def _say(self, scheduler, **what) -> None:
        self.said += 1
        scheduler.log_event(self.topic, wire.seal(self.key, {"r": self.said, **what}))

    def add_worker(self, scheduler, worker: str) -> None:
        self._say(scheduler, joined=worker)

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        self._say(scheduler, left=worker)

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
