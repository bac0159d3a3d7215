"""The process tree read straight from /proc (Linux): one :class:`Proc`
per process, and :class:`ProcReader`, which finds the tree's processes,
reads them within the fd budget and forgets those that exit. Its figures
become the tree's in :class:`~nbmon.sources.tree.ProcessTree`."""
from __future__ import annotations

import errno
import os
import resource
import threading
import time

from ...private import pid_started
from ...values import NAN
from ..procfs import CHILDREN_SIZE, EXCLUDED, GONE, ProcFile, read_path, read_path_released
from .memory import (FAULT_KB_PER_S, SHARED_MOVE_MB, UNMAP_SLACK_KB, WALK_NOW_KB, Interval, Status, Walker, parse_status,
                     rollup_kb, take)
from .peaks import PeakMark, sweep_at_next_open

LOGICAL_CPUS = os.cpu_count() or 1
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

# Less CPU than this used by the monitored process's other threads since the
# last sample counts as none: the two clocks are read a few µs apart.
OTHERS_IDLE_S = 50e-6
BUSY_SHARE = 0.01           # a process that used less of one CPU than this in an interval barely ran
def _cpu_clock_id(pid: int) -> int:
    # The kernel's per-process CPU clock (clock_getcpuclockid(3)), readable for
    # any pid: nanosecond CPU time instead of /proc's 10 ms ticks, which would
    # make a 10 Hz CPU % jitter by +/-10 points.
    return ((~pid) << 3) | 2


def _own_children_s() -> float:
    # This process's reaped children: getrusage has microseconds where
    # os.times() and /proc have 10 ms ticks (a tick in a 0.1 s interval is 10 %).
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def affinity(pid: int) -> frozenset:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except (OSError, AttributeError):  # gone, or no affinity API (macOS)
        return frozenset(range(LOGICAL_CPUS))


def capped(cpus: float, quota: float) -> float:
    return min(cpus, quota) if quota == quota else cpus


class Proc:
    """One process of the tree: its /proc files and what was last read of it."""

    __slots__ = ("pid", "parent", "started", "code", "clock", "stat", "status", "mark",
                 "own_s", "children_s", "counted_s", "carry_s", "ran_s", "own_ran_s", "ran", "busy", "scan",
                 "threads", "rss_kb", "start_kb", "hwm_kb", "anon_kb", "file_kb", "shmem_kb",
                 "off_kb", "walked", "reaped", "reaped_cpus", "grown_s", "read_bytes", "write_bytes", "cpus", "exited",
                 "peak_kb", "bound_kb", "share_kb", "start_off_kb", "shareable_kb", "io_stale")

    def __init__(self, pid: int, parent: int | None, keep: bool):
        self.pid, self.parent = pid, parent
        base = f"/proc/{pid}/"
        self.stat = ProcFile(base + "stat", keep)
        try:
            self.status = ProcFile(base + "status", keep)
        except BaseException:
            self.stat.close()
            raise
        self.mark: PeakMark | None = None
        self.clock = _cpu_clock_id(pid)
        self.started = -1
        self.code = 0
        self.own_s = self.children_s = 0.0
        self.counted_s = 0.0     # CPU already shown in some interval's rate
        self.carry_s = 0.0       # CPU counted but not yet shown (over the process's CPUs)
        self.ran_s = 0.0         # CPU used since the previous read
        self.ran = True          # ran since the previous read (unknown at first: yes)
        self.busy = True         # the same for CPU purposes (nbmon's own thread included)
        self.own_ran_s = 0.0     # its own CPU since the previous read (nbmon's own thread included)
        self.scan = True         # ran since its children were last listed
        self.threads = 0.0
        self.rss_kb = self.start_kb = 0.0
        self.hwm_kb = NAN
        self.anon_kb = self.file_kb = self.shmem_kb = 0.0
        self.off_kb = 0.0        # RSS minus PSS at the last walk: pages others count too
        self.share_kb = 0.0      # its share of shared pages in its PSS at the last walk
        self.walked = False
        self.reaped = 0          # known children it reaped in this refresh
        self.reaped_cpus: frozenset = frozenset()   # ... and the CPUs they could use
        self.grown_s = 0.0       # how much its reaped children's CPU grew in this refresh
        self.read_bytes = self.write_bytes = NAN
        self.io_stale = True     # ran since its I/O counters were last read
        self.cpus = frozenset()
        self.exited = False
        self.peak_kb = self.bound_kb = 0.0   # this interval's peak and its bracket's upper end
        self.start_off_kb = 0.0              # its shared offset at the interval's start
        self.shareable_kb = 0.0              # its file-backed and shared-memory RSS at its last walk

    @property
    def cpu_s(self) -> float:
        return self.own_s + self.children_s

    def read_clock(self) -> None:
        try:
            own_s = time.clock_gettime_ns(self.clock) * 1e-9
        except OSError:
            # Exiting, or a zombie: no clock left. Read it once more (read_stat
            # keeps its final times, status its memory: none) as if it ran.
            self.ran_s, self.own_ran_s, self.ran, self.busy = 0.0, 0.0, True, False
            return
        self.ran_s = self.own_ran_s = max(0.0, own_s - self.own_s)
        self.ran = self.busy = self.ran_s > 0.0
        self.own_s = own_s

    def read_stat(self) -> float:
        """Refresh start time, state and the CPU of reaped children (cutime +
        cstime); returns how much that grew. Raises ProcessLookupError when
        a path read finds another process under the pid (reused)."""
        text = self.stat.read(1024)
        fields = text[text.rindex(b")") + 2:].split(b" ", 24)
        started = int(fields[19])
        if self.started < 0:
            self.started, self.code = started, int(fields[23])
        elif started != self.started:
            raise ProcessLookupError(errno.ESRCH, f"pid {self.pid} was reused")
        children_s = (int(fields[13]) + int(fields[14])) * _TICK_S
        grown = children_s - self.children_s
        self.children_s = children_s
        if fields[0] == b"Z":
            self.own_s = (int(fields[11]) + int(fields[12])) * _TICK_S
            # Exited, only waiting to be reaped (a zombie leader whose other
            # threads still run shows more than one thread).
            self.exited = int(fields[17]) <= 1
        return grown

    def read_status(self) -> Status:
        return parse_status(self.status.read(4096))

    def read_io(self) -> None:
        self.io_stale = False
        try:
            text = read_path(f"/proc/{self.pid}/io", 1024)
        except OSError:  # another user's process (needs ptrace rights), or going
            self.read_bytes = self.write_bytes = NAN
            return
        for line in text.splitlines():
            if line.startswith(b"read_bytes:"):
                self.read_bytes = float(line[11:])
            elif line.startswith(b"write_bytes:"):
                self.write_bytes = float(line[12:])

    def walk(self) -> tuple[float, float, float]:
        """(Rss, Pss, private) in kB from smaps_rollup: the page-table walk (GIL released)."""
        text = read_path_released(f"/proc/{self.pid}/smaps_rollup")
        private = rollup_kb(text, b"\nPrivate_Clean:") + rollup_kb(text, b"\nPrivate_Dirty:")
        return rollup_kb(text, b"\nRss:"), rollup_kb(text, b"\nPss:"), private

    def close(self) -> None:
        self.stat.close()
        self.status.close()
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
            pids.extend(int(p) for p in read_path(f"/proc/{pid}/task/{tid}/children", CHILDREN_SIZE).split())
        except OSError as err:
            if err.errno not in GONE:  # the thread exited while we listed: fine; EMFILE: not
                raise
    return pids


class ProcReader:
    """Linux: /proc read directly (see the module's docstring)."""

    name = "proc"

    def __init__(self, tree):   # the ProcessTree it reads for
        self.tree = tree
        self.procs: dict[int, Proc] = {}
        self.retained_cpu_s = 0.0   # CPU of gone processes that no tree member reaped
        self.root_alive = False
        self.root_is_self = tree.pid == os.getpid()
        self.errors: list[str] = []
        self.walker = Walker()
        self._reset = False
        self._loadavg: ProcFile | None = None
        self._last_pid = b""
        self._last_boot_s = NAN
        self._reader, self._reader_s = 0, 0.0   # the thread that read the tree last, its CPU then
        self._memory: dict[str, float] = {}
        self._cap_cpus: set = set()
        # The shares of shared pages of walked processes gone since the last
        # walk: the pages stay, now counted by the others (a pool's workers
        # leaving a parent that still holds what they shared).
        self.orphan_share_kb = 0.0
        self.unproven_kb = 0.0      # see _unproven_kb
        self._meminfo: ProcFile | None = None
        self._mapped_kb = NAN

    def pids(self) -> tuple[int, ...]:
        return tuple(self.procs)

    # -- opening -------------------------------------------------------------
    def open(self) -> None:
        pid = self.tree.pid
        try:
            root = self._new(pid, None)
        except FileNotFoundError:
            raise ProcessLookupError(f"no process with pid {pid}") from None
        self.procs[pid] = root
        self.root_alive = True
        try:
            self._loadavg = ProcFile("/proc/loadavg")
        except OSError:
            self._loadavg = None
        try:
            self._meminfo = ProcFile("/proc/meminfo")
        except OSError:
            self._meminfo = None

    def _new(self, pid: int, parent: int | None) -> Proc:
        """A process's files opened and its stat read; closed again on failure."""
        proc = Proc(pid, parent, keep=True)
        try:
            proc.read_stat()
            proc.cpus = affinity(pid)
        except BaseException:
            proc.close()
            raise
        return proc

    def peak_mode(self, reset: bool) -> str:
        """Join the shared high-water marks when asked to reset them ("reset",
        or, when they cannot be had, the marks read as they are)."""
        if reset:
            sweep_at_next_open()
            mark = PeakMark(self.tree.pid)
            self._reset = mark.open()
            if self._reset:
                self.procs[self.tree.pid].mark = mark
            else:
                self.errors.append(f"exact peaks are off (high-water marks cannot be reset here: "
                                   f"{mark.error or 'another user’s process'}); peaks are read without resets")
        return "reset" if self._reset else "high-water marks"

    # -- one sample ----------------------------------------------------------
    def refresh(self, now: float, dt: float, *, slow: bool) -> tuple[float, float]:
        """Read the tree as of ``now``, ``dt`` after the previous read:
        (its CPU seconds, the CPU its processes may show in this interval's
        rate). The interval's memory figures are kept for :meth:`memory`."""
        boot_s = time.clock_gettime(time.CLOCK_BOOTTIME)
        root_pid = self.tree.pid
        adjust_start_kb = self.orphan_share_kb - self.unproven_kb
        gone: list[Proc] = []
        interval = Interval()
        shown_s = 0.0
        reader_s = None
        for proc in list(self.procs.values()):
            proc.reaped, proc.grown_s, proc.reaped_cpus = 0, 0.0, frozenset()
            try:
                if proc.pid == root_pid and self.root_is_self:
                    reader_s = time.thread_time()  # just before the process's clock: the same window
                proc.read_clock()
                if proc.pid == root_pid and self.root_is_self:
                    self._discount_reader(proc, reader_s)
                if proc.ran or proc.busy:  # only a process that runs reaps, exits, does I/O
                    self._read_cpu(proc, interval, root_pid)
                    proc.io_stale = True
                self._read_memory(proc, interval, slow)
            except OSError as err:
                if err.errno in GONE:
                    gone.append(proc)
                else:  # EMFILE, ENFILE, ...: the process is still there, its figures are not
                    self._failed(proc, err, interval)
        for proc in gone:
            self._forget(proc, gone, interval)
        self._unseen_children(interval)
        # After the reaped are forgotten: a parent's cutime then holds only their new CPU.
        self._cap_cpus = set()
        for proc in self.procs.values():
            shown_s += self._shown_s(proc, dt)
        if root_pid in self.procs and self.procs[root_pid].exited:
            self.root_alive = False
        if self.tree.children and (self.procs or self.tree.adopt) and self._forked(slow):
            for proc in self._find_children(interval=interval, boot_s=boot_s):
                shown_s += self._shown_s(proc, dt, backfill_s=self._backfill_s(proc, dt))
        self._last_boot_s = boot_s
        if slow:
            for proc in self.procs.values():
                if proc.io_stale:
                    proc.read_io()
        self.unproven_kb = self._unproven_kb()
        self._memory = figures = interval.figures(self.procs.values(), adjust_start_kb,
                                                  self.orphan_share_kb - self.unproven_kb)
        # Pages that can be shared (mapped files, /dev/shm) came or went: a
        # segment three processes map would count three times until walked.
        self.walker.shared_now(figures["proc_rss_file_mb"] + figures["proc_rss_shmem_mb"])
        # Not while a process winds down: its pages leave the others' shares
        # during the walk, and a walk is one snapshot only when nothing moves.
        if not interval.winding and self.walker.due(now, figures["proc_rss_mb"] * 1024.0, interval.ran):
            self._walk(now)
            self._memory = interval.figures(self.procs.values(), adjust_start_kb,
                                            self.orphan_share_kb - self.unproven_kb)
        total = self.retained_cpu_s + sum(p.own_s + p.children_s for p in self.procs.values())
        return total, shown_s

    def _discount_reader(self, root: Proc, reader_s: float) -> None:
        """This process ran, memory-wise, if a thread other than nbmon's
        reading one ran: nbmon's sampler runs no user code, so it cannot have
        made a spike between two samples (any other thread can). Its CPU
        still counts as CPU (``busy``). ``reader_s``: the reading thread's
        CPU clock as the process's was read."""
        thread = threading.current_thread()
        if thread.ident == self._reader and thread.name.startswith("nbmon-"):
            others_s = root.ran_s - (reader_s - self._reader_s)
            root.ran = others_s > OTHERS_IDLE_S
            root.ran_s = max(others_s, 0.0) if root.ran else 0.0
        self._reader, self._reader_s = thread.ident, reader_s

    def _read_cpu(self, proc: Proc, interval: Interval, root_pid: int) -> None:
        """Children's CPU of a process that ran (only a process that runs can
        reap), and whether it reaped a child nbmon never saw."""
        if proc.pid == root_pid and self.root_is_self:
            children_s = _own_children_s()
            grown, proc.children_s = children_s - proc.children_s, children_s
        else:
            grown = proc.read_stat()
        proc.grown_s += grown
        proc.scan = True

    def _unseen_children(self, interval: Interval) -> None:
        """A process whose reaped children's CPU grew though it reaped none
        that nbmon knew of had a child that lived and died between samples."""
        for proc in self.procs.values():
            if proc.grown_s > 0 and not proc.reaped:
                interval.missed = True
                if proc.pid == self.tree.pid and self.root_is_self:
                    interval.floor_kb = max(interval.floor_kb, self._own_children_maxrss())

    @staticmethod
    def _own_children_maxrss() -> float:
        """The largest peak of this process's reaped children (kB): at least
        what any of them held, at most what a new one can have held."""
        return float(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)

    def _read_memory(self, proc: Proc, interval: Interval, slow: bool) -> None:
        proc.start_kb, proc.start_off_kb = proc.rss_kb, proc.off_kb
        if not (proc.ran or slow or proc.start_kb == 0.0):
            interval.add(proc, proc.rss_kb, proc.rss_kb)  # did not run: it cannot have grown
            return
        status = proc.read_status()
        if status.rss_kb == 0.0 and not proc.exited:
            # No address space for an instant (mid-exec, or exiting before it
            # is a zombie): 0 would not be a measurement; keep the last reading.
            status = status._replace(rss_kb=proc.rss_kb, hwm_kb=proc.hwm_kb, anon_kb=proc.anon_kb,
                                     file_kb=proc.file_kb, shmem_kb=proc.shmem_kb)
        rss = status.rss_kb if not proc.exited else 0.0
        lo = max(proc.start_kb, rss)
        # A child that did not run cannot have raised its mark: it is not taken
        # (beyond the fd budget a take opens three files). The root is taken on
        # the cadence too: its "ran" leaves out the others' CPU under OTHERS_IDLE_S.
        if proc.mark is not None and (proc.ran or (slow and proc.pid == self.tree.pid)):
            taken = proc.mark.take_kb()   # exact_peaks: the mark since the last take, reset
            peak = bound = max(lo, taken) if taken == taken else lo
        elif status.hwm_kb < proc.hwm_kb:
            # Lower than before: something reset it (another tool, or an nbmon
            # with exact_peaks), or the process is exiting (no memory left):
            # what it reached since the last read is unknown.
            peak, bound = lo, NAN
        elif status.hwm_kb > proc.hwm_kb or not proc.ran:
            # Rose since the last read: this interval reached it. Or did not run.
            peak = bound = max(lo, status.hwm_kb) if proc.ran else lo
        else:
            peak = lo
            bound = lo + proc.ran_s * FAULT_KB_PER_S
            if status.hwm_kb == status.hwm_kb:
                bound = min(bound, max(lo, status.hwm_kb))
        proc.hwm_kb = status.hwm_kb
        # Unmapping shared pages (exiting, or munmap): the others' shares move
        # while it happens, so no walk now.
        if status.file_kb + status.shmem_kb < proc.file_kb + proc.shmem_kb - UNMAP_SLACK_KB or \
                status.hwm_kb == 0.0:
            interval.winding = True
        take(proc, status, rss)
        interval.add(proc, peak, bound)

    def _failed(self, proc: Proc, err: OSError, interval: Interval) -> None:
        self.errors.append(f"pid {proc.pid}: {err.strerror or err}")
        interval.add(proc, proc.rss_kb, NAN)

    def _shown_s(self, proc: Proc, dt: float, backfill_s: float = 0.0) -> float:
        """The CPU ``proc`` shows in this interval's rate: what it used since
        it was last counted (less what a late-found one used before the
        interval), capped at its own CPUs, the rest carried."""
        cpu_s = proc.own_s + proc.children_s
        if cpu_s == proc.counted_s and not proc.carry_s and not backfill_s:
            return 0.0  # idle: the common case in a big pool
        used_s = cpu_s - proc.counted_s - backfill_s + proc.carry_s
        proc.counted_s = cpu_s
        if used_s > dt:  # more than one CPU's worth: the cap matters, and affinity can change (taskset)
            proc.cpus = affinity(proc.pid)
        cpus = self._cpus_of(proc, dt)
        self._cap_cpus |= cpus
        # Its own CPU (its clock) ran on its CPUs; the rest (its reaped
        # children's, carried CPU) on the children's when it reaped any.
        own_s = min(max(used_s, 0.0), proc.own_ran_s)
        shown_s = min(own_s, self._cap_s(proc.cpus, dt)) + \
            min(max(used_s, 0.0) - own_s, self._cap_s(proc.reaped_cpus or proc.cpus, dt))
        shown_s = min(shown_s, self._cap_s(cpus, dt))
        proc.carry_s = max(used_s - shown_s, 0.0)
        return shown_s

    def _cap_s(self, cpus, dt: float) -> float:
        return dt * capped(float(len(cpus) or LOGICAL_CPUS), self.tree.quota) if dt > 0 else 0.0

    def settle(self) -> None:
        """The CPU used before the run's start is no interval's."""
        for proc in self.procs.values():
            proc.counted_s, proc.carry_s = proc.cpu_s, 0.0

    @staticmethod
    def _cpus_of(proc: Proc, dt: float) -> frozenset:
        """Where the CPU a process shows in an interval ran: on its own CPUs,
        and on those of the children it reaped in it, whose CPU arrives in
        its cutime -- on theirs only, if it barely ran itself (a parent
        waiting for a pinned child does not lend its CPUs to the child)."""
        if proc.reaped_cpus and proc.own_ran_s <= BUSY_SHARE * dt:
            return proc.reaped_cpus
        return proc.cpus | proc.reaped_cpus

    def busy_cpus(self) -> float:
        """The CPUs the tree's CPU of the interval ran on (:meth:`_cpus_of`
        of each of its processes)."""
        return float(len(self._cap_cpus))

    # -- processes that went -------------------------------------------------
    def _forget(self, proc: Proc, gone: list[Proc], interval: Interval) -> None:
        del self.procs[proc.pid]
        proc.close()
        self.tree.gone += 1
        self.walker.wanted = True
        if proc.pid == self.tree.pid:
            self.root_alive = False
        # It was there at the interval's start; what it did before it went is
        # unknown (no bound), unless this process reaped it: its ru_maxrss for
        # reaped children is then the most it can have held.
        bound = NAN
        parent = self.procs.get(proc.parent)
        if any(p.pid == proc.parent for p in gone):
            # Its parent went in the same interval, after reaping it: the time
            # is in the parent's cutime, and goes wherever the parent's goes.
            pass
        elif parent is not None:
            try:
                if parent.pid == self.tree.pid and self.root_is_self:
                    grown = _own_children_s() - parent.children_s
                    parent.children_s += grown
                    parent.grown_s += grown
                else:
                    grown = parent.read_stat()
                parent.grown_s += grown
                # Counted already: its CPU up to our last read of it.
                parent.counted_s += proc.cpu_s
                parent.reaped += 1
                parent.reaped_cpus |= proc.cpus
            except OSError:
                self.retained_cpu_s += proc.cpu_s
        else:
            self.retained_cpu_s += proc.cpu_s
        if proc.parent == os.getpid() and self.root_is_self:
            bound = max(proc.start_kb, self._own_children_maxrss())
        interval.add(proc, proc.start_kb, bound)
        interval.gone.append(proc)
        self.orphan_share_kb += proc.share_kb

    # -- processes that came -------------------------------------------------
    def _forked(self, slow: bool) -> bool:
        """Whether a process was created on this machine (the last pid in
        /proc/loadavg moved) since the previous look; always on the cadence."""
        if self._loadavg is None:
            return True
        try:
            last = self._loadavg.read(128).rsplit(b" ", 1)[-1]
        except OSError:
            return True
        changed, self._last_pid = last != self._last_pid, last
        return changed or slow or self.tree.adopt

    def _find_children(self, interval: Interval, boot_s: float) -> list[Proc]:
        """Add the processes new to the tree (children of every thread of the
        members that ran since they were last listed: a process that did not
        run forked nothing); returns them."""
        known = self.procs
        found = []
        queue = [p for p in known.values() if p.scan]
        for proc in queue:
            proc.scan = False
        if self.tree.adopt:  # orphans handed to us, the subreaper
            queue.append(None)
        while queue:
            parent = queue.pop()
            parent_pid = os.getpid() if parent is None else parent.pid
            try:
                pids = all_thread_child_pids(parent_pid)
            except OSError as err:
                if err.errno not in GONE:   # EMFILE, say: counted, and listed again next time
                    self.errors.append(f"children of pid {parent_pid}: {err.strerror or err}")
                    interval.missed = True
                    if parent is not None:
                        parent.scan = True
                continue
            for pid in pids:
                if pid in known or pid in EXCLUDED or pid in self.tree.excluded_pids:
                    continue
                child = None
                try:
                    child = self._new(pid, None if parent is None else parent.pid)
                    child.read_clock()
                    status = child.read_status()
                    self._join(child, parent, status, interval, boot_s)
                except OSError as err:  # exited between the listing and a read
                    if child is not None:
                        child.close()
                    if err.errno not in GONE:   # EMFILE, say: counted, and read again next time
                        self.errors.append(f"pid {pid}: {err.strerror or err}")
                        interval.missed = True
                        if parent is not None:
                            parent.scan = True
                    continue
                known[pid] = child
                found.append(child)
                queue.append(child)
        return found

    def _join(self, child: Proc, parent: Proc | None, status: Status, interval: Interval,
              boot_s: float) -> None:
        child.read_io()
        self.walker.wanted = True
        child.hwm_kb = status.hwm_kb
        child.rss_kb = child.start_kb = status.rss_kb
        if parent is not None and child.code == parent.code and child.code:
            child.off_kb = status.rss_kb   # forked, no exec: what it has is its parent's pages
            child.shareable_kb = status.file_kb + status.shmem_kb
        elif status.rss_kb <= WALK_NOW_KB:
            self._walk_one(child)
        child.start_off_kb = child.off_kb
        if self._reset:
            mark = PeakMark(child.pid)
            if mark.open():
                child.mark = mark
            elif pid_started(child.pid) is not None:   # there, but its peaks are read without resets
                self.errors.append(f"exact peaks are off for pid {child.pid}: {mark.error}")
        # Born since the previous sample: its mark is its peak in this interval.
        # Found late: it was missed in the samples before.
        born_s = child.started * _TICK_S
        late = not (self._last_boot_s != self._last_boot_s or born_s >= self._last_boot_s - _TICK_S)
        peak = max(status.rss_kb, status.hwm_kb) if status.hwm_kb == status.hwm_kb else status.rss_kb
        take(child, status, status.rss_kb)
        interval.add(child, peak, NAN if late else peak)

    @staticmethod
    def _backfill_s(proc: Proc, dt: float) -> float:
        """What a process found now used before the last ``dt`` seconds: its
        CPU spread evenly over its life, from its start time."""
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - proc.started * _TICK_S
        if not age_s > dt > 0:  # born within the interval: all of it is the interval's
            return 0.0
        return proc.cpu_s * (1.0 - dt / age_s)

    # -- shared pages --------------------------------------------------------
    def _walk(self, now: float) -> None:
        """Every process's shared offset from a walk of its smaps_rollup --
        kept only if no process's RSS shrank meanwhile (one that was exiting
        as it was walked makes the others' shares wrong too)."""
        cpu0 = time.thread_time()
        procs = list(self.procs.values())
        before = [(p.off_kb, p.share_kb, p.shareable_kb, p.walked) for p in procs]
        kb, steady = 0.0, True
        for proc in procs:
            rss = self._walk_one(proc)
            kb += rss
            # Grown meanwhile: its new pages count at the next walk. Shrunk: it
            # was unmapping (exiting) under the walk, and the shares are wrong.
            steady = steady and rss >= proc.rss_kb - max(UNMAP_SLACK_KB, 0.02 * proc.rss_kb)
        paid_s = time.thread_time() - cpu0
        if not steady:
            for proc, kept in zip(procs, before):
                proc.off_kb, proc.share_kb, proc.shareable_kb, proc.walked = kept
            self.walker.paid(now, paid_s, kb, done=False)
            return
        self.orphan_share_kb = self.unproven_kb = 0.0
        self._mapped_kb = self._machine_mapped_kb()
        self.walker.paid(now, paid_s, kb)

    def _machine_mapped_kb(self) -> float:
        """The machine's file and shared-memory pages mapped by some process
        (meminfo's Mapped: each page once, however many map it)."""
        if self._meminfo is None:
            return NAN
        try:
            text = self._meminfo.read(4096)
        except OSError:
            return NAN
        return rollup_kb(text, b"\nMapped:")

    def _unproven_kb(self) -> float:
        """Shared pages the tree's processes mapped since their last walk
        that are not new to the machine: a reader mapping a segment another
        process of the tree holds adds RSS, not memory. Counted out until
        the next walk says whose they are (new pages, which the machine's
        Mapped grew by, stay counted)."""
        grown = sum(max(0.0, p.file_kb + p.shmem_kb - p.shareable_kb) for p in self.procs.values())
        if grown <= SHARED_MOVE_MB * 1024.0:
            return 0.0
        new = self._machine_mapped_kb() - self._mapped_kb
        return max(0.0, grown - max(new, 0.0)) if new == new else 0.0

    def _walk_one(self, proc: Proc) -> float:
        try:
            rss, pss, private = proc.walk()
        except OSError:  # gone (the next sample forgets it), or no smaps_rollup (kernel < 4.14)
            return 0.0
        if rss == rss and pss == pss:
            proc.off_kb, proc.walked = max(0.0, rss - pss), True
            proc.share_kb = max(0.0, pss - private) if private == private else 0.0
            proc.shareable_kb = proc.file_kb + proc.shmem_kb
        return rss if rss == rss else 0.0

    def memory(self) -> dict[str, float]:
        return self._memory

    def io_total(self, field: str) -> float:
        return sum(getattr(p, field) for p in self.procs.values()) if self.procs else NAN

    def close(self) -> None:
        for proc in self.procs.values():
            proc.close()
        self.procs.clear()
        for file in (self._loadavg, self._meminfo):
            if file is not None:
                file.close()
        self._loadavg = self._meminfo = None

    def abandon(self) -> None:
        for proc in self.procs.values():
            proc.abandon()
        self.procs.clear()
        for file in (self._loadavg, self._meminfo):
            if file is not None:
                file.close()
        self._loadavg = self._meminfo = None


