"""CPU, memory, threads and I/O of a process and all its descendants.

On Linux the tree is read straight from /proc through file descriptors kept
open between samples; elsewhere (and when /proc is unusable) through psutil.
Every figure is a float, NaN where unknown. Units are in the field names.

Peak RSS of the tree (``proc_rss_peak_mb``) is the highest the tree's RSS
can have been within the interval before the sample. Every process that ran
in the interval (its CPU clock moved) gives its own high-water mark since
the previous sample (the kernel's VmHWM, shared with every other nbmon
reader: :mod:`.peaks`); a process that did not run cannot have grown, and
its RSS at the interval's start stands for it. For one process this is
exact. For a tree it is at least the true peak and at most the true peak
plus what the tree's processes released within that one interval (each
process's own peak is exact, but they need not have coincided).
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import NamedTuple

from .. import catalog
from .cgroup import cgroup_dirs, cpu_limit
from .peaks import PeakMark
from .procfs import pread

NAN = math.nan
MIB = 1024.0 * 1024.0
_LOGICAL_CPUS = os.cpu_count() or 1
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

# Less CPU than this used by the monitored process's other threads since the
# last sample counts as none: the two clocks are read a few µs apart, and a
# thread cannot touch more than about 1 MiB of new memory in it.
OTHERS_IDLE_S = 50e-6

# nbmon's own helper processes (the process backend's sampler): never part of
# a watched tree, though they are children of the process they watch.
EXCLUDED: set[int] = set()


def _cpu_clock_id(pid: int) -> int:
    # The kernel's per-process CPU clock (clock_getcpuclockid(3)), readable for
    # any pid: nanosecond CPU time instead of /proc's 10 ms ticks, which would
    # make a 10 Hz CPU % jitter by +/-10 points.
    return ((~pid) << 3) | 2


def allowed_cpus(pid: int, cgroup: dict[str, str]) -> float:
    """The CPUs ``pid`` may use: its affinity, capped by its cgroup's CPU quota."""
    try:
        cpus = float(len(os.sched_getaffinity(pid)))
    except (OSError, AttributeError):  # gone, or no affinity API (macOS)
        cpus = float(_LOGICAL_CPUS)
    quota = cpu_limit(cgroup)
    return min(cpus, quota) if quota == quota else cpus


class _LinuxProc:
    """Kept-open /proc descriptors of one process of the tree."""

    __slots__ = ("pid", "parent", "stat_fd", "statm_fd", "children_fd", "io_fd", "clock", "mark",
                 "own_s", "ran", "ran_s", "children_s", "threads", "rss_pages", "start_pages",
                 "read_bytes", "write_bytes", "exited", "started_s")

    def __init__(self, pid: int, parent: int | None):
        self.pid = pid
        self.parent = parent
        base = f"/proc/{pid}/"
        self.stat_fd = os.open(base + "stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.statm_fd = os.open(base + "statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(self.stat_fd)
            raise
        try:
            # Only the main thread's children are read every sample; the other
            # threads' are walked on the discovery cadence.
            self.children_fd = os.open(f"{base}task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.children_fd = -1
        try:
            self.io_fd = os.open(base + "io", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # another user's process: /proc/<pid>/io needs ptrace rights
            self.io_fd = -1
        self.clock = _cpu_clock_id(pid)
        self.mark: PeakMark | None = None
        self.own_s = self.children_s = 0.0
        self.ran = True            # used CPU since the previous read (unknown at first: yes)
        self.ran_s = 0.0           # how much
        self.threads = 0.0
        self.rss_pages = 0.0
        self.start_pages = 0.0     # RSS at the start of the current interval
        self.read_bytes = NAN
        self.write_bytes = NAN
        self.exited = False
        self.started_s = NAN       # seconds after boot

    @property
    def cpu_s(self) -> float:
        return self.own_s + self.children_s

    def read(self) -> None:
        """Refresh own CPU and RSS; raises OSError once the process is gone."""
        self.start_pages = self.rss_pages
        try:
            own_s = time.clock_gettime_ns(self.clock) * 1e-9
            self.ran_s = own_s - self.own_s
            self.ran = self.ran_s != 0.0
            self.own_s = own_s
        except OSError:  # a zombie has no clock left: read_stat() keeps its final times
            self.ran = False
        # The statm fd is bound to this process even if its pid is reused: a
        # successful read after the clock proves the clock was this process's.
        statm = pread(self.statm_fd, 256)
        # No address space for an instant (mid-exec, or exiting before it is a
        # zombie): 0 would not be a measurement; keep the last reading.
        if not statm.startswith(b"0 "):
            self.rss_pages = float(statm.split(b" ", 2)[1])

    def read_stat(self) -> None:
        """Refresh threads, start time and the CPU of reaped children (cutime +
        cstime), which only changes when a child is reaped: read on a cadence."""
        stat = pread(self.stat_fd, 1024)
        fields = stat[stat.rindex(b")") + 2:].split(b" ", 20)
        self.children_s = (int(fields[13]) + int(fields[14])) * _TICK_S
        self.threads = float(fields[17])
        self.started_s = int(fields[19]) * _TICK_S
        if fields[0] == b"Z":
            self.own_s = (int(fields[11]) + int(fields[12])) * _TICK_S
            self.rss_pages = 0.0  # a zombie holds no memory
            # Exited, only waiting to be reaped (a zombie leader whose other
            # threads still run shows more than one thread).
            self.exited = self.threads <= 1

    def read_io(self) -> None:
        try:
            if self.io_fd < 0:
                raise PermissionError
            text = pread(self.io_fd, 1024)
        except OSError:  # no rights to it, or the process is going
            self.read_bytes = self.write_bytes = NAN
            return
        for line in text.splitlines():
            if line.startswith(b"read_bytes:"):
                self.read_bytes = float(line[11:])
            elif line.startswith(b"write_bytes:"):
                self.write_bytes = float(line[12:])

    def child_pids(self) -> list[int]:
        if self.children_fd < 0:
            return []
        return [int(p) for p in pread(self.children_fd, 65536).split()]

    def close(self) -> None:
        for fd in (self.stat_fd, self.statm_fd, self.children_fd, self.io_fd):
            if fd >= 0:
                os.close(fd)
        self.stat_fd = self.statm_fd = self.children_fd = self.io_fd = -1
        if self.mark is not None:
            self.mark.close()
            self.mark = None

    def abandon(self) -> None:
        """A forked child's copy: close the fds, leave the shared marks alone."""
        if self.mark is not None:
            self.mark.abandon()
            self.mark = None
        self.close()


def all_thread_child_pids(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (/proc/<pid>/task/*/children)."""
    pids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError:  # the thread exited while we listed
            continue
    return pids


class ProcessTree:
    """Samples a process and, unless ``children=False``, all its descendants.

    Call :meth:`start` first: it primes the CPU baseline so that the first
    :meth:`sample` already gives a true CPU % (psutil's first
    ``cpu_percent()`` returns a meaningless 0.0; this one does not).

    CPU time counts every process of the tree, including time a child used
    before it was discovered and children that already exited and were reaped
    by a tree member (the kernel moves their time into the parent's
    cutime/cstime). A process found late (a child of a non-main thread is
    found by the walk every ``slow_every_s``) adds its earlier CPU time to
    ``proc_cpu_time_s`` but shows in the CPU % only at the rate it really ran
    since it started: a CPU % is never more than the processes could use.
    CPU % is of one CPU (100 = one core); ``proc_cpu_norm_percent`` is of the
    CPUs the root may use (its affinity, capped by its cgroup's CPU quota).

    Every sample reads each process's CPU clock and RSS, the high-water mark
    of each process that ran (see the module's docstring), and the root's
    reaped-children time. Threads and I/O are read every ``slow_every_s``
    and at :meth:`boundary` (NaN in the samples in between), with a full
    walk for new children. ``peak_exact`` says whether high-water marks
    can be read here or peaks are sampled.

    ``adopt=True`` (for ``nbmon run``, which makes itself the subreaper of
    what it starts) counts this process's other children too: processes the
    command orphaned, which the kernel hands to us instead of init.
    """

    name = "process tree"
    caller_safe = True  # reads /proc and /sys only: cannot get stuck

    def __init__(self, pid: int | None = None, *, children: bool = True,
                 exact_peak: bool = True, slow_every_s: float = 1.0,
                 use_proc: bool | None = None, adopt: bool = False):
        self.pid = os.getpid() if pid is None else int(pid)
        self.fields = catalog.names(catalog.TREE)
        self.children = children
        self.adopt = adopt
        self.slow_every_s = slow_every_s
        if use_proc is None:
            use_proc = sys.platform.startswith("linux") and os.path.exists(f"/proc/{self.pid}/stat")
        self._backend = _ProcBackend(self) if use_proc else _PsutilBackend(self)
        self._want_exact_peak = exact_peak and use_proc
        self.peak_exact = False
        self.gone = 0            # processes of the tree that disappeared since start()
        self.cpus = float(_LOGICAL_CPUS)
        self._cgroup: dict[str, str] = {}
        self._last_t = NAN
        self._last_cpu_s = NAN
        self._start_cpu_s = NAN
        self._cpu_carry_s = 0.0  # CPU counted but not yet shown in a CPU %
        self._last_slow_t = -math.inf

    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def pids(self) -> tuple[int, ...]:
        return self._backend.pids()

    @property
    def root_alive(self) -> bool:
        return self._backend.root_alive

    @property
    def alive(self) -> bool:
        """The root lives, or (adopting) any process of the tree does."""
        return self._backend.root_alive or (self.adopt and bool(self._backend.pids()))

    def start(self, now: float | None = None) -> None:
        """Open the tree and prime the CPU baseline. Raises ProcessLookupError
        if the pid does not exist."""
        now = time.monotonic() if now is None else now
        self._backend.open()
        self.peak_exact = self._want_exact_peak and self._backend.open_marks()
        self._cgroup = cgroup_dirs(self.pid)
        self.cpus = allowed_cpus(self.pid, self._cgroup)
        cpu_s, _ = self._backend.refresh(now, 0.0, slow=True)
        self._last_t = self._last_slow_t = now
        self._last_cpu_s = self._start_cpu_s = cpu_s
        self._cpu_carry_s = 0.0

    def boundary(self) -> None:
        """Make the next sample a full one (threads, I/O, a full walk), so that
        a span starting or ending there has them of its own."""
        self._last_slow_t = -math.inf

    def sample(self, now: float) -> dict[str, float]:
        b = self._backend
        slow = now - self._last_slow_t >= self.slow_every_s
        if slow:
            self._last_slow_t = now
            self.cpus = allowed_cpus(self.pid, self._cgroup)
        dt = now - self._last_t
        cpu_s, backfill_s = b.refresh(now, dt, slow=slow)
        # Never backwards: a child's CPU is read in ns while it lives, but once
        # reaped it moves into its parent's cutime in whole 10 ms ticks, so the
        # total can dip by up to a tick (below 0 early in a run, which the
        # sampler rejects as a fault). The dip is made up when the tick comes.
        cpu_s = max(cpu_s, self._last_cpu_s)
        # What a late-found process used before this interval is in the CPU
        # time but not in this interval's %; the rest is capped at every
        # allowed CPU busy, any excess carried to the next intervals.
        used_s = cpu_s - self._last_cpu_s - backfill_s + self._cpu_carry_s
        shown_s = min(max(used_s, 0.0), dt * self.cpus) if dt > 0 else 0.0
        self._cpu_carry_s = max(used_s - shown_s, 0.0)
        cpu_percent = shown_s / dt * 100.0 if dt > 0 else NAN
        self._last_t, self._last_cpu_s = now, cpu_s
        return {
            "proc_cpu_percent": cpu_percent,
            "proc_cpu_norm_percent": cpu_percent / self.cpus,
            "proc_cpu_time_s": cpu_s - self._start_cpu_s,
            "proc_rss_mb": b.rss_mb(),
            "proc_rss_peak_mb": b.peak_mb(),
            "proc_threads": b.threads() if slow else NAN,
            "proc_count": float(b.count()),
            "proc_read_bytes": b.io_total("read_bytes") if slow else NAN,
            "proc_write_bytes": b.io_total("write_bytes") if slow else NAN,
        }

    def close(self) -> None:
        self._backend.close()

    def abandon(self) -> None:
        """In a forked child: drop the fds, leave the shared peak marks to the parent."""
        self._backend.abandon()


class _ProcBackend:
    """Linux: /proc read through kept-open descriptors."""

    name = "proc"

    def __init__(self, tree: ProcessTree):
        self.tree = tree
        self.procs: dict[int, _LinuxProc] = {}
        self.retained_cpu_s = 0.0   # CPU of gone processes that no tree member reaped
        self.gone_pages = 0.0       # RSS at the interval's start of processes gone in it
        self.root_alive = False
        self.root_is_self = tree.pid == os.getpid()
        self.page_mb = os.sysconf("SC_PAGE_SIZE") / MIB
        self.pages_per_kb = 1024.0 / os.sysconf("SC_PAGE_SIZE")
        self._marks = False
        self._peak_pages = 0.0
        self._reader, self._reader_s = 0, 0.0   # the thread that read the tree last, its CPU then

    def pids(self) -> tuple[int, ...]:
        return tuple(self.procs)

    def open(self) -> None:
        pid = self.tree.pid
        try:
            root = self.procs[pid] = _LinuxProc(pid, None)
        except FileNotFoundError:
            raise ProcessLookupError(f"no process with pid {pid}") from None
        root.read_stat()
        self.root_alive = True

    def open_marks(self) -> bool:
        """Join the shared high-water mark of every process of the tree; False
        (peaks sampled) when the root's cannot be read and reset here."""
        root = self.procs[self.tree.pid]
        mark = PeakMark(root.pid)
        self._marks = mark.open()
        if self._marks:
            root.mark = mark
        return self._marks

    def _join(self, proc: _LinuxProc) -> float:
        """Join a newly found process's mark; its peak (pages) before we joined."""
        mark = PeakMark(proc.pid)
        if not mark.open():
            return 0.0
        proc.mark = mark
        return mark.joined_kb * self.pages_per_kb if mark.joined_kb == mark.joined_kb else 0.0

    def refresh(self, now: float, dt: float, *, slow: bool) -> tuple[float, float]:
        """Read the tree as of ``now``, ``dt`` after the previous read: (its
        CPU seconds, of which used before this interval by processes found
        now). The interval's peak is kept for :meth:`peak_mb`."""
        root = self.tree.pid
        gone = []
        self.gone_pages = 0.0
        for proc in list(self.procs.values()):
            try:
                if slow:
                    proc.read_stat()
                elif proc.pid == root:
                    # Children the root reaps show up in its cutime at once
                    # (short-lived ones are never seen themselves).
                    if self.root_is_self:
                        t = os.times()  # this process: no /proc read needed
                        proc.children_s = t.children_user + t.children_system
                    else:
                        proc.read_stat()
                if proc.pid == root and self.root_is_self:
                    reader_s = time.thread_time()  # just before the process's clock: the same window
                proc.read()
            except OSError:
                gone.append(proc)
        if self.root_is_self and root in self.procs:
            self._discount_reader(self.procs[root], reader_s)
        vanished = {proc.pid for proc in gone}
        for proc in gone:
            self.gone_pages += proc.rss_pages
            self._forget(proc, vanished)
        if root in self.procs and self.procs[root].exited:
            self.root_alive = False
        peak_pages = self._interval_peak(every=slow)
        backfill_s = 0.0
        if self.tree.children and (self.procs or self.tree.adopt):
            for proc in self._find_children(thorough=slow):
                backfill_s += self._backfill_s(proc, dt)
                peak_pages += max(proc.rss_pages, self._join(proc) if self._marks else 0.0)
        self._peak_pages = peak_pages
        if slow:
            for proc in self.procs.values():
                proc.read_io()
        return self.retained_cpu_s + sum(p.own_s + p.children_s for p in self.procs.values()), backfill_s

    def _discount_reader(self, root: _LinuxProc, reader_s: float) -> None:
        """This process ran if a thread other than nbmon's reading one ran:
        nbmon's sampler runs every sample and runs no user code, so it
        cannot have made a spike between two samples (any other thread can).
        ``reader_s``: the reading thread's CPU clock as the process's was read."""
        thread = threading.current_thread()
        if thread.ident == self._reader and thread.name.startswith("nbmon-"):
            root.ran = root.ran_s - (reader_s - self._reader_s) > OTHERS_IDLE_S
        self._reader, self._reader_s = thread.ident, reader_s

    def _interval_peak(self, every: bool) -> float:
        """Pages: each known process's highest RSS within the interval (the
        high-water mark of every process that ran, of ``every`` one on the
        slow cadence)."""
        total = self.gone_pages
        for proc in self.procs.values():
            top = max(proc.start_pages, proc.rss_pages)
            if (every or proc.ran) and proc.mark is not None:
                kb = proc.mark.take_kb()
                if kb == kb:
                    top = max(top, kb * self.pages_per_kb)
            total += top
        return total

    @staticmethod
    def _backfill_s(proc: _LinuxProc, dt: float) -> float:
        """What a process found now used before the last ``dt`` seconds: its
        CPU spread evenly over its life, from its start time."""
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - proc.started_s
        if not age_s > dt > 0:  # born within the interval: all of it is the interval's
            return 0.0
        return proc.cpu_s * (1.0 - dt / age_s)

    def _forget(self, proc: _LinuxProc, vanished=()) -> None:
        del self.procs[proc.pid]
        proc.close()
        self.tree.gone += 1
        if proc.pid == self.tree.pid:
            self.root_alive = False
        if proc.parent in vanished:
            # Its parent went in the same interval, after reaping it: the time
            # is in the parent's cutime, and goes wherever the parent's goes.
            return
        parent = self.procs.get(proc.parent)
        try:
            if parent is not None:
                # Reaped by a live tree member: its time moved to the parent's cutime.
                parent.read_stat()
                return
        except OSError:
            pass
        self.retained_cpu_s += proc.cpu_s

    def _find_children(self, thorough: bool) -> list[_LinuxProc]:
        """Add the processes new to the tree; returns them."""
        known = self.procs
        found = []
        queue = list(known.values())
        if self.tree.adopt:  # orphans handed to us, the subreaper
            queue.append(None)
        while queue:
            parent = queue.pop()
            try:
                if parent is None:
                    pids, parent_pid = all_thread_child_pids(os.getpid()), None
                else:
                    pids = all_thread_child_pids(parent.pid) if thorough else parent.child_pids()
                    parent_pid = parent.pid
            except OSError:
                continue
            for pid in pids:
                if pid in known or pid in EXCLUDED:
                    continue
                try:
                    child = _LinuxProc(pid, parent_pid)
                    child.read_stat()
                    child.read()
                except OSError:  # exited between the listing and the open
                    continue
                child.read_io()
                known[pid] = child
                found.append(child)
                queue.append(child)
        return found

    def rss_mb(self) -> float:
        return sum(p.rss_pages for p in self.procs.values()) * self.page_mb

    def peak_mb(self) -> float:
        return max(self._peak_pages * self.page_mb, self.rss_mb())

    def threads(self) -> float:
        return sum(p.threads for p in self.procs.values())

    def count(self) -> int:
        return len(self.procs)

    def io_total(self, field: str) -> float:
        return sum(getattr(p, field) for p in self.procs.values()) if self.procs else NAN

    def close(self) -> None:
        for proc in self.procs.values():
            proc.close()
        self.procs.clear()

    def abandon(self) -> None:
        for proc in self.procs.values():
            proc.abandon()
        self.procs.clear()


class _PsReading(NamedTuple):
    cpu_s: float        # own and reaped children's CPU seconds
    rss_bytes: float
    threads: float
    read_bytes: float
    write_bytes: float


class _PsutilBackend:
    """Portable fallback through psutil; peaks are sampled."""

    name = "psutil"

    def __init__(self, tree: ProcessTree):
        import psutil

        self.psutil = psutil
        self.tree = tree
        self.procs: dict = {}
        self.parents: dict[int, int] = {}
        self.values: dict[int, _PsReading] = {}
        self.retained_cpu_s = 0.0
        self.root_alive = False

    def pids(self) -> tuple[int, ...]:
        return tuple(self.procs)

    def open(self) -> None:
        try:
            root = self.psutil.Process(self.tree.pid)
        except self.psutil.NoSuchProcess:
            raise ProcessLookupError(f"no process with pid {self.tree.pid}") from None
        self.procs = {root.pid: root}
        self.root_alive = True

    def open_marks(self) -> bool:
        return False

    def refresh(self, now: float, dt: float, *, slow: bool) -> tuple[float, float]:
        ps = self.psutil
        found = []
        if slow and self.tree.children:
            try:
                for child in self.procs[self.tree.pid].children(recursive=True):
                    if child.pid not in self.procs and child.pid not in EXCLUDED:
                        self.procs[child.pid] = child
                        self.parents[child.pid] = child.ppid()
                        found.append(child)
            except (ps.NoSuchProcess, ps.AccessDenied, KeyError):
                pass
        vanished = []
        for pid, proc in list(self.procs.items()):
            try:
                with proc.oneshot():
                    t = proc.cpu_times()
                    old = self.values.get(pid)
                    read_bytes = write_bytes = NAN
                    if slow:
                        try:
                            c = proc.io_counters()
                            read_bytes, write_bytes = float(c.read_bytes), float(c.write_bytes)
                        except (ps.AccessDenied, AttributeError, NotImplementedError):
                            pass
                    elif old:
                        read_bytes, write_bytes = old.read_bytes, old.write_bytes
                    threads = float(proc.num_threads())
                    self.values[pid] = _PsReading(
                        cpu_s=t.user + t.system + t.children_user + t.children_system,
                        rss_bytes=float(proc.memory_info().rss), threads=threads,
                        read_bytes=read_bytes, write_bytes=write_bytes)
                    if pid == self.tree.pid and threads <= 1 and proc.status() == ps.STATUS_ZOMBIE:
                        self.root_alive = False  # exited, only waiting to be reaped
            except (ps.NoSuchProcess, ps.ZombieProcess, ps.AccessDenied):
                vanished.append(pid)
        for pid in vanished:
            del self.procs[pid]
            last = self.values.pop(pid, None)
            self.tree.gone += 1
            if pid == self.tree.pid:
                self.root_alive = False
            # Reaped by a tree member (one gone in the same interval included):
            # its time is in that member's children times.
            parent = self.parents.pop(pid, None)
            if last and parent not in self.procs and parent not in vanished:
                self.retained_cpu_s += last.cpu_s
        backfill_s = 0.0
        for child in found:  # as the /proc backend: spread over the child's life
            try:
                age_s = time.time() - child.create_time()
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue
            if child.pid in self.values and age_s > dt > 0:
                backfill_s += self.values[child.pid].cpu_s * (1.0 - dt / age_s)
        return self.retained_cpu_s + sum(v.cpu_s for v in self.values.values()), backfill_s

    def rss_mb(self) -> float:
        return sum(v.rss_bytes for v in self.values.values()) / MIB

    def peak_mb(self) -> float:
        return self.rss_mb()

    def threads(self) -> float:
        return sum(v.threads for v in self.values.values())

    def count(self) -> int:
        return len(self.values)

    def io_total(self, field: str) -> float:
        return sum(getattr(v, field) for v in self.values.values()) if self.values else NAN

    def close(self) -> None:
        self.procs.clear()
        self.values.clear()

    abandon = close
