"""A warning before the container's memory limit.

In JupyterHub, Kubernetes or a Colab-like host the kernel is killed when its
container (cgroup) reaches its memory limit. :class:`MemoryWatch` reads the
container's memory once a second, and four times a second once it is within
20 points of the threshold or would be there within two reads at the pace
it grew since the last one (a kernel that allocates fast crosses the last
tenth of its limit between two one-second reads), and says once per
crossing when it reaches ``percent`` of the limit. Its ``every_s`` follows
(the consumers' thread reads it before each call): no wake-up is spent on
a check that would read nothing. The limit itself is read every 10 s.

What counts is the container's usage less its inactive page cache (cAdvisor's
and Kubernetes' "working set"): the kernel reclaims that cache before it
kills, so a notebook that reads big files is not warned for the cache they
leave. (The cache is read only near the threshold: far from it, the usage,
an upper bound, says so.) Without a limit, the machine's memory counts (used = total -
available, as ``/proc/meminfo``'s MemAvailable already leaves the cache
out).

Hysteresis: after a crossing, nothing more is said until the level has gone
back below ``percent`` - 5 points. A crossing is told in the running cell
(:attr:`MemoryWatch.say`), in the first cell that runs while it lasts if it
happened between cells, and at most once per cell.
"""
from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from ..format import fmt
from ..options import DEFAULT_MEMORY_WARNING_PERCENT
from ..sources.cgroup import Cgroup
from ..values import MIB

REARM_POINTS = 5.0      # a crossing ends this far below the threshold
NEAR_POINTS = 20.0      # from this far below the threshold, read four times a second
NEAR_EVERY_S = 0.25
FAR_EVERY_S = 1.0
LIMIT_EVERY_S = 10.0    # a container's limit hardly ever changes
CROSSINGS_KEPT = 32
CONTAINER, MACHINE = "container", "machine"


@dataclass(frozen=True, slots=True)
class Level:
    """How full the memory that can kill the kernel is: ``kind`` (container
    or machine), ``used_mb`` of ``limit_mb`` (MiB)."""

    kind: str
    used_mb: float
    limit_mb: float

    @property
    def percent(self) -> float:
        return 100.0 * self.used_mb / self.limit_mb

    def text(self) -> str:
        """The line the running cell gets."""
        if self.kind == CONTAINER:
            return (f"nbmon: this kernel's container is at {fmt(self.percent, '%')} of its "
                    f"{fmt(self.limit_mb, 'MiB')} memory limit ({fmt(self.used_mb, 'MiB')}); "
                    f"at the limit the kernel is killed")
        return (f"nbmon: this machine's memory is {fmt(self.percent, '%')} used "
                f"({fmt(self.limit_mb - self.used_mb, 'MiB')} of {fmt(self.limit_mb, 'MiB')} left); "
                f"when it runs out, the kernel may be killed")


def inactive_file_mb(dirs: dict[str, str]) -> float:
    """The container's inactive page cache (MiB), which the kernel reclaims before an OOM kill."""
    directory = dirs.get("memory")
    if not directory:
        return 0.0
    key = b"inactive_file" if dirs.get("memory_version") == "2" else b"total_inactive_file"
    try:
        with open(os.path.join(directory, "memory.stat"), "rb") as f:
            for line in f:
                name, _, value = line.partition(b" ")
                if name == key:
                    return int(value) / MIB
    except (OSError, ValueError):
        pass
    return 0.0


class MemoryWatch:
    """A consumer that reads the memory that can kill process ``pid`` (every
    second; every 0.25 s near the threshold) and says when it crosses
    ``percent`` (None: never says).

    ``say(text)`` is called on the monitor's consumers thread with the
    warning line; ``running_cell()`` names the running cell (None between
    cells). For the meter, the chart and the black box: ``level`` (the
    newest :class:`Level`), ``near`` (read four times a second), ``warning``
    (that level while a crossing lasts, else None), ``container`` ((usage,
    limit, OOM kills) as read, or None), ``cgroup`` (the container's cgroup
    directories) and ``crossings`` ((epoch s, Level) of the last 32)."""

    name = "MemoryWatch"
    at_start = True

    def __init__(self, pid: int, percent: float | None, *, say: Callable[[str], None] | None = None,
                 running_cell: Callable[[], object] | None = None):
        self.percent = percent
        self.say = say
        self.running_cell = running_cell
        self.level: Level | None = None
        self._before: Level | None = None   # the read before ``level``
        self.warning: Level | None = None
        self.container: tuple[float, float, float] | None = None
        self.crossings: deque[tuple[float, Level]] = deque(maxlen=CROSSINGS_KEPT)
        self._source = Cgroup(pid)
        self._source.start(0.0)
        self.cgroup = dict(self._source.dirs)
        self._limit_mb = math.nan
        self._limit_t = -math.inf
        self._due = False
        self._told_in = None

    @property
    def near(self) -> bool:
        """Within 20 points of the threshold (the default one if there is no
        warning: the black box still wants the last seconds), or there within
        two reads at the pace of the last one."""
        level, before = self.level, self._before
        if level is None:
            return False
        threshold = DEFAULT_MEMORY_WARNING_PERCENT if self.percent is None else self.percent
        pace = max(0.0, level.percent - before.percent) if before is not None and before.kind == level.kind else 0.0
        return level.percent + 2 * pace >= threshold - NEAR_POINTS

    @property
    def every_s(self) -> float:
        return NEAR_EVERY_S if self.near else FAR_EVERY_S

    def consume(self, store, final: bool) -> None:
        self._before, self.level = self.level, self._read(store)
        self._judge(self.level)

    def close(self) -> None:
        pass

    def _read(self, store) -> Level | None:
        if self.cgroup.get("memory"):
            source, now = self._source, time.monotonic()
            if now - self._limit_t >= LIMIT_EVERY_S:
                self._limit_mb, self._limit_t = source._memory_limit() / MIB, now
            used, limit = source._memory_used() / MIB, self._limit_mb
            self.container = (used, limit, source._oom_kills())
        else:
            used = limit = math.nan
            self.container = None
        if used == used and limit == limit and limit > 0:
            near = self.percent is not None and 100.0 * used / limit >= self.percent - NEAR_POINTS
            return Level(CONTAINER, max(0.0, used - inactive_file_mb(self.cgroup)) if near else used, limit)
        latest = store.latest()
        available, total = latest.get("sys_mem_available_mb", math.nan), latest.get("sys_mem_total_mb", math.nan)
        if available == available and total == total and total > 0:
            return Level(MACHINE, total - available, total)
        return None

    def _judge(self, level: Level | None) -> None:
        if self.percent is None:
            return
        if level is not None and level.percent >= self.percent:
            if self.warning is None:
                self.crossings.append((time.time(), level))
                self._due = True
            self.warning = level
        elif self.warning is not None and (level is None or level.percent < self.percent - REARM_POINTS):
            self.warning, self._due = None, False
        elif self.warning is not None:
            self.warning = level   # between the threshold and its re-arm line: still the same crossing
        cell = self.running_cell() if self.running_cell is not None else None
        if self._due and self.say is not None and cell is not None and cell != self._told_in:
            self._due, self._told_in = False, cell
            self.say(self.warning.text())


def attached(monitor) -> MemoryWatch | None:
    """The MemoryWatch among ``monitor``'s consumers, if any."""
    return next((c for c in getattr(monitor, "consumers", ()) if isinstance(c, MemoryWatch)), None)
