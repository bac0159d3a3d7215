"""The memory of a process tree: shared pages counted once, peaks without
side effects. :mod:`.linux` reads the processes; this module turns what
it read into the tree's figures.

**Memory, shared pages counted once** (``proc_pss_mb``). Forked workers
(multiprocessing's ``fork``, PyTorch's DataLoader) share their parent's
pages until they write to them, and every process's RSS counts each shared
page in full: a kernel holding a 1 GiB array with 4 forked readers has an
RSS sum of 5 GiB and uses 1 GiB. The kernel's proportional set size (PSS,
``/proc/<pid>/smaps_rollup``) gives each of *n* sharers 1/*n* of a shared
page, so the tree's PSS sum counts it once. A walk of ``smaps_rollup``
costs about 11 ms per GiB of 4 KiB pages here, far too much for every
sample, so the tree is walked on a budget (:data:`WALK_SHARE` of one core
on average, walks paid from a bucket of :data:`WALK_BURST_S` seconds) when
its membership changed or, at most every :data:`REFRESH_WALK_S`, when it
ran; each process's *shared offset* (RSS minus PSS at its last walk) then
stands between walks: ``proc_pss_mb`` is the sum over the tree of RSS minus
the offset. A process found since the last walk that was forked (no exec:
its code sits where its parent's does) counts as all shared until walked;
one that was exec'd is walked at once when small (:data:`WALK_NOW_KB`),
counted in full otherwise. The RSS sum stays as ``proc_rss_mb`` (what
``top`` and psutil add up), split into anonymous, file-backed (page cache
of mapped files: reclaimable) and shared-memory (/dev/shm, tmpfs) pages.


**Peaks without side effects.** The kernel keeps each process's high-water
mark (VmHWM); nbmon reads it and never resets it (a reset also resets what
``getrusage``'s ``ru_maxrss``, ``/usr/bin/time -v`` and the user's own code
read; :mod:`.peaks` does it only when asked, ``exact_peaks=True``). Per
interval and process, the peak is *exact* when the mark rose in the
interval (it then is the interval's peak) or when the process did not run
(it cannot have grown); it is a *bracket* otherwise: at least the larger of
the interval's two samples, at most the mark, and at most what the CPU time
it used could have faulted in (:data:`FAULT_KB_PER_S`).
``proc_pss_peak_mb`` is the sum over the tree of each process's best figure
(exact, or sampled), ``proc_pss_peak_bound_mb`` the sum of the upper ends
(NaN when a process's is unknown: it exited, or was missed). A summary
turns these into "exact" (one process, and no interval's upper end above
the highest peak: the mark rose in the span), "upper bound" (the same for
several processes, whose own peaks need not have coincided) or "sampled".
"""
from __future__ import annotations

import math
from typing import NamedTuple

from ...values import NAN

# The fastest a thread can fault in new memory (zeroed huge pages at memory
# bandwidth): a process that ran t seconds cannot have grown by more than
# t * FAULT_KB_PER_S, which closes the bracket of briefly-woken processes.
# (Measured here: 25 GiB per CPU-second into huge pages; a faster machine does more.)
FAULT_KB_PER_S = 64.0 * 1024 * 1024
# smaps_rollup walks: on average at most this share of one core, ...
WALK_SHARE = 0.005
WALK_BURST_S = 0.25         # ... paid from a bucket this deep (the first walks come at once)
REFRESH_WALK_S = 5.0        # a tree that ran is walked again at most this often (copy-on-write)
WALK_NOW_KB = 64 * 1024.0   # a new exec'd process this small is walked when found
WALK_S_PER_KB = 1.1e-8      # the first guess of a walk's cost (11 ms per GiB), then measured
UNMAP_SLACK_KB = 1024.0    # a process whose shareable RSS fell by more than this is unmapping
SHARED_MOVE_MB = 16.0       # shareable RSS (files, /dev/shm) moved this much since the last walk:
SHARED_MOVE_SHARE = 0.05    # ... or by this share of it: walk again


def take(proc, status: "Status", rss_kb: float) -> None:
    """A process's memory, as last read."""
    proc.rss_kb = rss_kb
    proc.anon_kb, proc.file_kb, proc.shmem_kb = status.anon_kb, status.file_kb, status.shmem_kb
    proc.threads = status.threads


class Status(NamedTuple):
    rss_kb: float
    hwm_kb: float
    anon_kb: float
    file_kb: float
    shmem_kb: float
    threads: float


_STATUS_KEYS = (b"VmRSS:", b"VmHWM:", b"RssAnon:", b"RssFile:", b"RssShmem:")


def parse_status(text: bytes) -> Status:
    """The memory figures of /proc/<pid>/status (kB; a zombie has none: 0)."""
    values = []
    for key in _STATUS_KEYS:
        at = text.find(key)
        values.append(float(text[at + len(key):text.index(b"kB", at)]) if at >= 0 else 0.0)
    at = text.find(b"Threads:")
    threads = float(text[at + 8:text.index(b"\n", at)]) if at >= 0 else 0.0
    return Status(*values, threads)


def rollup_kb(text: bytes, key: bytes) -> float:
    at = text.find(key)
    return float(text[at + len(key):text.index(b"kB", at)]) if at >= 0 else NAN


class Walker:
    """When to walk the tree's smaps_rollup: a bucket of CPU seconds filled
    at WALK_SHARE of wall time, and a per-kB cost learned from each walk."""

    def __init__(self):
        self.credit_s = WALK_BURST_S
        self.s_per_kb = WALK_S_PER_KB
        self.last_t = NAN
        self.walked_t = -math.inf
        self.wanted = True        # membership changed since the last walk
        self.spent_s = 0.0        # CPU of every walk so far (benchmarks read it)
        self.walks = 0
        self.shared_mb = NAN      # file-backed and shared-memory RSS of the tree at the last walk
        self._shared_now_mb = 0.0

    def shared_now(self, mb: float) -> None:
        """The tree's shareable RSS now: a walk is wanted once it moved by
        more than SHARED_MOVE_MB or SHARED_MOVE_SHARE since the last walk."""
        self._shared_now_mb = mb
        if self.shared_mb == self.shared_mb and \
                abs(mb - self.shared_mb) > max(SHARED_MOVE_MB, SHARED_MOVE_SHARE * self.shared_mb):
            self.wanted = True

    def cost_s(self, kb: float) -> float:
        return kb * self.s_per_kb

    def due(self, now: float, kb: float, ran: bool) -> bool:
        if self.last_t == self.last_t:
            self.credit_s = min(WALK_BURST_S, self.credit_s + (now - self.last_t) * WALK_SHARE)
        self.last_t = now
        if not (self.wanted or (ran and now - self.walked_t >= REFRESH_WALK_S)):
            return False
        return self.credit_s >= self.cost_s(kb)

    def paid(self, now: float, cpu_s: float, kb: float, done: bool = True) -> None:
        """A walk cost ``cpu_s``; ``done``: its figures were kept (else one is still wanted)."""
        self.credit_s -= cpu_s
        self.spent_s += cpu_s
        self.walks += 1
        if kb > 0:
            self.s_per_kb = max(cpu_s / kb, 1e-12)
        if done:
            self.walked_t, self.wanted = now, False
            self.shared_mb = self._shared_now_mb


class Interval:
    """One interval's memory figures of a tree: each process's peak and the
    upper end of its bracket are set on it (:meth:`add`); those of the
    processes that went in the interval are kept here."""

    __slots__ = ("gone", "ran", "missed", "floor_kb", "winding")

    def __init__(self):
        self.gone: list = []
        self.winding = False      # a process is exiting or unmapping shared pages
        self.ran = False          # a process ran (memory-wise) in the interval
        self.missed = False       # a process lived in the interval unseen: no upper bound
        self.floor_kb = 0.0       # the tree was at least this big at some moment

    @staticmethod
    def add(proc, peak_kb: float, bound_kb: float) -> None:
        """A process's best peak and its bracket's upper end in the interval (kB of RSS)."""
        proc.peak_kb, proc.bound_kb = peak_kb, bound_kb

    def figures(self, procs, shared_start_kb: float, shared_kb: float) -> dict[str, float]:
        """The interval's figures. ``shared_start_kb`` and ``shared_kb``:
        what the tree held at the interval's start and end beyond (or, when
        negative, short of) what its processes' last walks say: the shares of
        processes gone since (``orphan_share_kb``), less shared pages mapped
        again (``unproven_kb``).

        The tree's peak is the larger of its two sums -- at the interval's
        start and at its end, each process with its own shared offset then
        -- plus what each process went above both of its own samples (its
        high-water mark). Adding each process's own maximum instead would
        count pages twice whenever they move between processes (a reader
        mapping a shared segment takes a share from its creator); that sum
        is the upper end of the bracket: the processes' own highs may have
        coincided."""
        rss = anon = file = shmem = threads = 0.0
        at_start, at_end, rss_start = shared_start_kb, shared_kb, 0.0
        excess = bound = 0.0
        count = 0
        for group in (procs, self.gone):
            live = group is procs
            for proc in group:
                if live:
                    rss += proc.rss_kb
                    anon += proc.anon_kb
                    file += proc.file_kb
                    shmem += proc.shmem_kb
                    threads += proc.threads
                    at_end += max(proc.rss_kb - proc.off_kb, 0.0)
                    count += 1
                self.ran = self.ran or proc.ran
                at_start += max(proc.start_kb - proc.start_off_kb, 0.0)
                rss_start += proc.start_kb
                sampled = max(proc.start_kb, proc.rss_kb if live else 0.0)
                excess += max(proc.peak_kb - sampled, 0.0)
                # Its own highest: at either end, or above both (then with the
                # smaller of its two offsets: an upper end).
                own = max(proc.start_kb - proc.start_off_kb, proc.rss_kb - proc.off_kb if live else 0.0,
                          proc.bound_kb - min(proc.start_off_kb, proc.off_kb))
                bound += max(own, 0.0)
        peak = max(at_start, at_end) + excess
        peak = max(peak, self.floor_kb)
        bound = NAN if self.missed else max(bound + max(shared_start_kb, shared_kb), peak)
        mem, rss_peak = at_end, max(rss_start, rss) + excess
        return {
            "proc_pss_mb": mem / 1024.0,
            "proc_pss_peak_mb": peak / 1024.0,
            "proc_pss_peak_bound_mb": bound / 1024.0,
            "proc_rss_mb": rss / 1024.0,
            "proc_rss_peak_mb": rss_peak / 1024.0,
            "proc_rss_anon_mb": anon / 1024.0,
            "proc_rss_file_mb": file / 1024.0,
            "proc_rss_shmem_mb": shmem / 1024.0,
            "proc_threads": threads,
            "proc_count": float(count),
        }
