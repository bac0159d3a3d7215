"""CPU, memory, threads and I/O of a process and all its descendants.

On Linux the tree is read straight from /proc through file descriptors kept
open between samples; elsewhere (and when /proc is unusable) through psutil.
Every figure is a float, NaN where unknown. Units are in the field names.
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import NamedTuple

from .. import catalog
from .procfs import pread

NAN = math.nan
MIB = 1024.0 * 1024.0
CLEAR_REFS_RESET_PEAK = b"5"  # proc(5): "5" resets the peak RSS (VmHWM) to the current RSS

_LOGICAL_CPUS = os.cpu_count() or 1


def _cpu_clock_id(pid: int) -> int:
    # The kernel's per-process CPU clock (clock_getcpuclockid(3)), readable for
    # any pid: nanosecond CPU time instead of /proc's 10 ms ticks, which would
    # make a 10 Hz CPU % jitter by +/-10 points.
    return ((~pid) << 3) | 2


class _LinuxProc:
    """Kept-open /proc descriptors of one process of the tree."""

    __slots__ = ("pid", "parent", "stat_fd", "statm_fd", "children_fd", "io_fd", "clock",
                 "own_s", "children_s", "threads", "rss_pages", "read_bytes", "write_bytes",
                 "exited")

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
        self.own_s = self.children_s = 0.0
        self.threads = 0.0
        self.rss_pages = 0.0
        self.read_bytes = NAN
        self.write_bytes = NAN
        self.exited = False

    @property
    def cpu_s(self) -> float:
        return self.own_s + self.children_s

    def read(self) -> None:
        """Refresh own CPU and RSS; raises OSError once the process is gone."""
        try:
            self.own_s = time.clock_gettime_ns(self.clock) * 1e-9
        except OSError:  # a zombie has no clock left: read_stat() keeps its final times
            pass
        # The statm fd is bound to this process even if its pid is reused: a
        # successful read after the clock proves the clock was this process's.
        statm = pread(self.statm_fd, 256)
        # No address space for an instant (mid-exec, or exiting before it is a
        # zombie): 0 would not be a measurement; keep the last reading.
        if not statm.startswith(b"0 "):
            self.rss_pages = float(statm.split(b" ", 2)[1])

    def read_stat(self, tick_s: float) -> None:
        """Refresh threads and the CPU of reaped children (cutime + cstime),
        which only change when a child is reaped: read on a cadence."""
        stat = pread(self.stat_fd, 1024)
        fields = stat[stat.rindex(b")") + 2:].split(b" ", 20)
        self.children_s = (int(fields[13]) + int(fields[14])) * tick_s
        self.threads = float(fields[17])
        if fields[0] == b"Z":
            self.own_s = (int(fields[11]) + int(fields[12])) * tick_s
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

    def all_thread_child_pids(self) -> list[int]:
        pids = []
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/children", "rb") as f:
                    pids.extend(int(p) for p in f.read().split())
            except OSError:  # the thread exited while we listed
                continue
        return pids

    def close(self) -> None:
        for fd in (self.stat_fd, self.statm_fd, self.children_fd, self.io_fd):
            if fd >= 0:
                os.close(fd)
        self.stat_fd = self.statm_fd = self.children_fd = self.io_fd = -1


class ProcessTree:
    """Samples a process and, unless ``children=False``, all its descendants.

    Call :meth:`start` first: it primes the CPU baseline so that the first
    :meth:`sample` already gives a true CPU % (psutil's first
    ``cpu_percent()`` returns a meaningless 0.0; this one does not).

    CPU time counts every process of the tree, including time a child used
    before it was discovered and children that already exited and were reaped
    by a tree member (the kernel moves their time into the parent's
    cutime/cstime).

    Every sample reads each process's CPU clock and RSS, and the root's
    reaped-children time. Slower-moving figures are refreshed every
    ``slow_every_s`` and at :meth:`boundary`: a full walk for new children,
    threads, I/O, and the root's exact peak RSS -- the kernel's high-water mark
    (VmHWM, reset through /proc/<pid>/clear_refs after each read), so a spike
    shorter than the interval is still caught, in the sample that reads it.
    ``peak_exact`` says whether that works here or peaks are sampled.
    """

    name = "process tree"

    def __init__(self, pid: int | None = None, *, children: bool = True,
                 exact_peak: bool = True, slow_every_s: float = 1.0,
                 use_proc: bool | None = None):
        self.pid = os.getpid() if pid is None else int(pid)
        self.fields = catalog.names(catalog.TREE)
        self.children = children
        self.slow_every_s = slow_every_s
        if use_proc is None:
            use_proc = sys.platform.startswith("linux") and os.path.exists(f"/proc/{self.pid}/stat")
        self._backend = _ProcBackend(self) if use_proc else _PsutilBackend(self)
        self._want_exact_peak = exact_peak and use_proc
        self.peak_exact = False
        self.gone = 0            # processes of the tree that disappeared since start()
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

    def start(self, now: float | None = None) -> None:
        """Open the tree and prime the CPU baseline. Raises ProcessLookupError
        if the pid does not exist."""
        now = time.monotonic() if now is None else now
        self._backend.open()
        self.peak_exact = self._want_exact_peak and self._backend.reset_peak()
        cpu_s = self._backend.refresh(now, slow=True)
        self._last_t = self._last_slow_t = now
        self._last_cpu_s = self._start_cpu_s = cpu_s
        self._cpu_carry_s = 0.0

    def boundary(self) -> None:
        """Make the next sample a full one (exact peak read and reset), so that
        a span starting or ending there has the exact peak of its own."""
        self._last_slow_t = -math.inf

    def sample(self, now: float) -> dict[str, float]:
        b = self._backend
        slow = now - self._last_slow_t >= self.slow_every_s
        if slow:
            self._last_slow_t = now
        # Never backwards: a child's CPU is read in ns while it lives, but once
        # reaped it moves into its parent's cutime in whole 10 ms ticks, so the
        # total can dip by up to a tick (below 0 early in a run, which the
        # sampler rejects as a fault). The dip is made up when the tick comes.
        cpu_s = max(b.refresh(now, slow=slow), self._last_cpu_s)
        dt = now - self._last_t
        # CPU found late (a child discovered after it ran) cannot have been
        # used within one interval: show at most every CPU busy and carry the
        # rest into the next intervals, so that the mean stays exact.
        used_s = cpu_s - self._last_cpu_s + self._cpu_carry_s
        shown_s = min(max(used_s, 0.0), dt * _LOGICAL_CPUS) if dt > 0 else 0.0
        self._cpu_carry_s = used_s - shown_s
        cpu_percent = shown_s / dt * 100.0 if dt > 0 else NAN
        self._last_t, self._last_cpu_s = now, cpu_s
        rss_mb = b.rss_mb()
        peak_mb = rss_mb
        if slow and self.peak_exact:
            root_peak = b.root_peak_mb()
            if root_peak == root_peak:  # not NaN
                peak_mb = max(rss_mb, rss_mb - b.root_rss_mb() + root_peak)
                b.reset_peak()
        return {
            "proc_cpu_percent": cpu_percent,
            "proc_cpu_norm_percent": cpu_percent / _LOGICAL_CPUS,
            "proc_cpu_time_s": cpu_s - self._start_cpu_s,
            "proc_rss_mb": rss_mb,
            "proc_rss_peak_mb": peak_mb,
            "proc_threads": b.threads(),
            "proc_count": float(b.count()),
            "proc_read_bytes": b.io_total("read_bytes"),
            "proc_write_bytes": b.io_total("write_bytes"),
        }

    def close(self) -> None:
        self._backend.close()


class _ProcBackend:
    """Linux: /proc read through kept-open descriptors."""

    name = "proc"

    def __init__(self, tree: ProcessTree):
        self.tree = tree
        self.procs: dict[int, _LinuxProc] = {}
        self.retained_cpu_s = 0.0   # CPU of gone processes that no tree member reaped
        self.root_alive = False
        self.root_is_self = tree.pid == os.getpid()
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self.page_mb = os.sysconf("SC_PAGE_SIZE") / MIB
        self._status_fd = -1
        self._clear_refs_fd = -1

    def pids(self) -> tuple[int, ...]:
        return tuple(self.procs)

    def open(self) -> None:
        pid = self.tree.pid
        try:
            self.procs[pid] = _LinuxProc(pid, None)
        except FileNotFoundError:
            raise ProcessLookupError(f"no process with pid {pid}") from None
        self.root_alive = True
        self._status_fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._clear_refs_fd = os.open(f"/proc/{pid}/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:  # another user's process, or a kernel without clear_refs
            self._clear_refs_fd = -1

    def reset_peak(self) -> bool:
        """Reset the root's VmHWM to its current RSS."""
        if self._clear_refs_fd < 0:
            return False
        try:
            os.write(self._clear_refs_fd, CLEAR_REFS_RESET_PEAK)
            return True
        except OSError:
            return False

    def root_peak_mb(self) -> float:
        try:
            status = pread(self._status_fd, 4096)
        except OSError:
            return NAN
        at = status.find(b"VmHWM:")
        if at < 0:  # a kernel thread or a zombie has no mm
            return NAN
        return float(status[at + 6:status.index(b"kB", at)]) / 1024.0

    def root_rss_mb(self) -> float:
        root = self.procs.get(self.tree.pid)
        return root.rss_pages * self.page_mb if root else 0.0

    def refresh(self, now: float, *, slow: bool) -> float:
        tick_s, root = self.tick_s, self.tree.pid
        gone = []
        for proc in list(self.procs.values()):
            try:
                if slow:
                    proc.read_stat(tick_s)
                elif proc.pid == root:
                    # Children the root reaps show up in its cutime at once
                    # (short-lived ones are never seen themselves).
                    if self.root_is_self:
                        t = os.times()  # this process: no /proc read needed
                        proc.children_s = t.children_user + t.children_system
                    else:
                        proc.read_stat(tick_s)
                proc.read()
            except OSError:
                gone.append(proc)
        vanished = {proc.pid for proc in gone}
        for proc in gone:
            self._forget(proc, vanished)
        if root in self.procs and self.procs[root].exited:
            self.root_alive = False
        if self.tree.children and self.procs:
            self._find_children(thorough=slow)
        if slow:
            for proc in self.procs.values():
                proc.read_io()
        return self.retained_cpu_s + sum(p.own_s + p.children_s for p in self.procs.values())

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
                parent.read_stat(self.tick_s)
                return
        except OSError:
            pass
        self.retained_cpu_s += proc.cpu_s

    def _find_children(self, thorough: bool) -> None:
        known = self.procs
        queue = list(known.values())
        while queue:
            parent = queue.pop()
            try:
                pids = parent.all_thread_child_pids() if thorough else parent.child_pids()
            except OSError:
                continue
            for pid in pids:
                if pid in known:
                    continue
                try:
                    child = _LinuxProc(pid, parent.pid)
                    child.read_stat(self.tick_s)
                    child.read()
                except OSError:  # exited between the listing and the open
                    continue
                child.read_io()
                known[pid] = child
                queue.append(child)

    def rss_mb(self) -> float:
        return sum(p.rss_pages for p in self.procs.values()) * self.page_mb

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
        for fd in (self._status_fd, self._clear_refs_fd):
            if fd >= 0:
                os.close(fd)
        self._status_fd = self._clear_refs_fd = -1


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

    def reset_peak(self) -> bool:
        return False

    def refresh(self, now: float, *, slow: bool) -> float:
        ps = self.psutil
        if slow and self.tree.children:
            try:
                for child in self.procs[self.tree.pid].children(recursive=True):
                    if child.pid not in self.procs:
                        self.procs[child.pid] = child
                        self.parents[child.pid] = child.ppid()
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
        return self.retained_cpu_s + sum(v.cpu_s for v in self.values.values())

    def rss_mb(self) -> float:
        return sum(v.rss_bytes for v in self.values.values()) / MIB

    def root_rss_mb(self) -> float:
        root = self.values.get(self.tree.pid)
        return root.rss_bytes / MIB if root else 0.0

    def root_peak_mb(self) -> float:
        return NAN

    def threads(self) -> float:
        return sum(v.threads for v in self.values.values())

    def count(self) -> int:
        return len(self.values)

    def io_total(self, field: str) -> float:
        return sum(getattr(v, field) for v in self.values.values()) if self.values else NAN

    def close(self) -> None:
        self.procs.clear()
        self.values.clear()
