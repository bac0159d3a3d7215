"""CPU, memory, threads and I/O of a process and all its descendants.

On Linux the tree is read straight from /proc; elsewhere (and when /proc is
unusable) through psutil. Every figure is a float, NaN where unknown. Units
are in the field names.

Memory (shared pages counted once) and peaks without side effects: see
:mod:`.memory`.

**Finding children.** A new process anywhere makes the last pid in
``/proc/loadavg`` change: only then are the children of every thread of
the tree's processes that ran listed (and on the 1 s cadence regardless),
so a child of any thread is found at the next sample, for one small read
when nothing forked.

**Descriptors.** A process's ``stat`` and ``status`` are kept open while
the fd budget of :mod:`..procfs` lasts (64, or 5 % of ``RLIMIT_NOFILE``),
and read by path beyond it (its start time checked, so a reused pid is not
mistaken for it); so are the exact peaks' files (:mod:`.peaks`). A read
that fails for want of descriptors keeps the process and counts a fault,
never drops it from the tree; a child that could not be listed or read
then is looked for again at the next sample.
"""
from __future__ import annotations

import math
import os
import sys
import time

from ... import catalog
from ...options import SLOW_EVERY_S
from ...values import NAN
from ..cgroup import cgroup_dirs, cpu_limit
from .linux import LOGICAL_CPUS, ProcReader, affinity, capped
from .pstree import PsutilReader

class ProcessTree:
    """Samples a process and, unless ``children=False``, all its descendants.

    Call :meth:`start` first: it primes the CPU baseline so that the first
    :meth:`sample` already gives a true CPU % (psutil's first
    ``cpu_percent()`` returns a meaningless 0.0; this one does not).

    CPU time counts every process of the tree, including time a child used
    before it was discovered and children that already exited and were
    reaped by a tree member (the kernel moves their time into the parent's
    cutime/cstime, read every sample for a member that ran). A process
    found late adds its earlier CPU time to ``proc_cpu_time_s`` but shows in
    the CPU % only at the rate it really ran since it started. A CPU % is
    never more than the processes could use: each process's rate is capped
    at its own CPUs (affinity, cgroup quota) and the tree's at the CPUs of
    the processes that ran, any excess carried to the next intervals. CPU %
    is of one CPU (100 = one core); ``proc_cpu_norm_percent`` is of the CPUs
    the root may use.

    Memory: see the module's docstring. ``exact_peaks=True`` resets the
    kernel's high-water marks (:mod:`.peaks`) so that every interval's peak
    of every process is exact, at the price of changing what other tools
    read (VmHWM, ``ru_maxrss``); ``peaks`` says what the run could do:
    "reset", "high-water marks" or "sampled".

    ``adopt=True`` (for ``nbmon run``, which makes itself the subreaper of
    what it starts) counts this process's other children too: processes the
    command orphaned, which the kernel hands to us instead of init.
    """

    name = "process tree"
    caller_safe = True  # reads /proc and /sys only: cannot get stuck

    def __init__(self, pid: int | None = None, *, children: bool = True,
                 exact_peaks: bool = False, slow_every_s: float = SLOW_EVERY_S,
                 use_proc: bool | None = None, adopt: bool = False):
        self.pid = os.getpid() if pid is None else int(pid)
        self.fields = catalog.names(catalog.TREE)
        self.children = children
        self.adopt = adopt
        self.slow_every_s = slow_every_s
        if use_proc is None:
            use_proc = sys.platform.startswith("linux") and os.path.exists(f"/proc/{self.pid}/stat")
        self._reader = ProcReader(self) if use_proc else PsutilReader(self)
        self._want_reset = exact_peaks and use_proc
        self.peaks = "sampled"
        self.gone = 0            # processes of the tree that disappeared since start()
        self.excluded_pids: frozenset[int] = frozenset()   # never part of it, like launch.EXCLUDED
        self.cpus = float(LOGICAL_CPUS)
        self.quota = NAN         # the cgroup's CPU quota, in CPUs
        self._cgroup: dict[str, str] = {}
        self._last_t = NAN
        self._last_cpu_s = NAN
        self._start_cpu_s = NAN
        self._cpu_carry_s = 0.0  # CPU counted but not yet shown in a CPU %
        self._last_slow_t = -math.inf

    @property
    def reader(self) -> str:
        """How the tree is read: "proc" (/proc) or "psutil"."""
        return self._reader.name

    @property
    def pids(self) -> tuple[int, ...]:
        return self._reader.pids()

    @property
    def root_alive(self) -> bool:
        return self._reader.root_alive

    @property
    def alive(self) -> bool:
        """The root lives, or (adopting) any process of the tree does."""
        return self._reader.root_alive or (self.adopt and bool(self._reader.pids()))

    def drain_faults(self) -> list[str]:
        """Reads that failed for reasons other than a process exiting (EMFILE,
        say) since the last call, in words (the sampler counts them): the
        processes stay in the tree, their figures as last read."""
        errors, self._reader.errors = self._reader.errors, []
        return errors

    def start(self, now: float | None = None) -> None:
        """Open the tree and prime the CPU baseline. Raises ProcessLookupError
        if the pid does not exist."""
        now = time.monotonic() if now is None else now
        self._reader.open()
        self.peaks = self._reader.peak_mode(self._want_reset)
        self._cgroup = cgroup_dirs(self.pid)
        self._refresh_limits()
        cpu_s, _ = self._reader.refresh(now, 0.0, slow=True)
        self._reader.settle()
        self._last_t = self._last_slow_t = now
        self._last_cpu_s = self._start_cpu_s = cpu_s
        self._cpu_carry_s = 0.0

    def _refresh_limits(self) -> None:
        self.quota = cpu_limit(self._cgroup)
        self.cpus = capped(float(len(affinity(self.pid))), self.quota)

    def boundary(self) -> None:
        """Make the next sample a full one (every process's memory, threads,
        I/O, a full walk for children), so that a span starting or ending
        there has them of its own."""
        self._last_slow_t = -math.inf

    def sample(self, now: float) -> dict[str, float]:
        b = self._reader
        slow = now - self._last_slow_t >= self.slow_every_s
        if slow:
            self._last_slow_t = now
            self._refresh_limits()
        dt = now - self._last_t
        cpu_s, shown_s = b.refresh(now, dt, slow=slow)
        # Never backwards: a child's CPU is read in ns while it lives, but once
        # reaped it moves into its parent's cutime in whole 10 ms ticks, so the
        # total can dip by up to a tick (below 0 early in a run, which the
        # sampler rejects as a fault). The dip is made up when the tick comes.
        cpu_s = max(cpu_s, self._last_cpu_s)
        # The processes' own capped rates, capped again at the CPUs of those
        # that ran (and the container's quota); any excess is carried.
        used_s = shown_s + self._cpu_carry_s
        cap_s = dt * capped(b.busy_cpus(), self.quota) if dt > 0 else 0.0
        shown_s = min(max(used_s, 0.0), cap_s)
        self._cpu_carry_s = max(used_s - shown_s, 0.0)
        cpu_percent = shown_s / dt * 100.0 if dt > 0 else NAN
        self._last_t, self._last_cpu_s = now, cpu_s
        return {
            **dict.fromkeys(self.fields, NAN),   # what a reader cannot read (a newer metric) is unknown alone
            "proc_cpu_percent": cpu_percent,
            "proc_cpu_norm_percent": cpu_percent / self.cpus,
            "proc_cpu_time_s": cpu_s - self._start_cpu_s,
            **b.memory(),
            "proc_read_bytes": b.io_total("read_bytes") if slow else NAN,
            "proc_write_bytes": b.io_total("write_bytes") if slow else NAN,
        }

    def close(self) -> None:
        self._reader.close()

    def abandon(self) -> None:
        """In a forked child: drop the fds, leave the shared peak marks to the parent."""
        self._reader.abandon()
