"""The process tree through psutil: the portable fallback of
:class:`~nbmon.sources.tree.ProcessTree` where /proc cannot be read.
Memory is the RSS sum, and peaks are sampled (no high-water marks, no PSS)."""
from __future__ import annotations

import os
import time
from typing import NamedTuple

from ...values import MIB, NAN
from ..procfs import EXCLUDED

_LOGICAL_CPUS = os.cpu_count() or 1


class _PsReading(NamedTuple):
    cpu_s: float        # own and reaped children's CPU seconds
    rss_bytes: float
    threads: float
    read_bytes: float
    write_bytes: float


class PsutilReader:
    """Portable fallback through psutil: memory is the RSS sum and peaks are
    sampled (no high-water marks, no PSS)."""

    name = "psutil"

    def __init__(self, tree):
        import psutil

        self.psutil = psutil
        self.tree = tree
        self.procs: dict = {}
        self.parents: dict[int, int] = {}
        self.values: dict[int, _PsReading] = {}
        self.retained_cpu_s = 0.0
        self.root_alive = False
        self.errors: list[str] = []
        self._last_total_s = NAN

    def pids(self) -> tuple[int, ...]:
        return tuple(self.procs)

    def open(self) -> None:
        try:
            root = self.psutil.Process(self.tree.pid)
        except self.psutil.NoSuchProcess:
            raise ProcessLookupError(f"no process with pid {self.tree.pid}") from None
        self.procs = {root.pid: root}
        self.root_alive = True

    def peak_mode(self, reset: bool) -> str:
        return "sampled"

    def busy_cpus(self) -> float:
        return float(_LOGICAL_CPUS)

    def settle(self) -> None:
        pass

    def refresh(self, now: float, dt: float, *, slow: bool) -> tuple[float, float]:
        ps = self.psutil
        found = []
        if slow and self.tree.children:
            try:
                for child in self.procs[self.tree.pid].children(recursive=True):
                    if child.pid not in self.procs and child.pid not in EXCLUDED and \
                            child.pid not in self.tree.excluded_pids:
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
        for child in found:  # as the /proc reader: spread over the child's life
            try:
                age_s = time.time() - child.create_time()
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue
            if child.pid in self.values and age_s > dt > 0:
                backfill_s += self.values[child.pid].cpu_s * (1.0 - dt / age_s)
        total = self.retained_cpu_s + sum(v.cpu_s for v in self.values.values())
        last, self._last_total_s = self._last_total_s, total
        return total, (total - last - backfill_s if last == last else 0.0)

    def memory(self) -> dict[str, float]:
        rss = sum(v.rss_bytes for v in self.values.values()) / MIB
        return {"proc_pss_mb": rss, "proc_pss_peak_mb": rss, "proc_rss_mb": rss, "proc_rss_peak_mb": rss,
                "proc_threads": sum(v.threads for v in self.values.values()),
                "proc_count": float(len(self.values))}

    def io_total(self, field: str) -> float:
        return sum(getattr(v, field) for v in self.values.values()) if self.values else NAN

    def close(self) -> None:
        self.procs.clear()
        self.values.clear()

    abandon = close
