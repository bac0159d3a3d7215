"""The memory guard: the running cell stopped before the OOM killer stops
the kernel.

In a container the kernel is killed when the container's memory reaches its
limit, and hours of loaded data and trained state go with it. While a cell
runs, :class:`MemoryGuard` reads the memory the OOM killer goes by (the
container's usage less the page cache it reclaims first, as the warning
does; the machine's used memory where there is no limit and the guard was
asked for by a number) and, when it reaches the guard's line -- or would
before the cell can be stopped, at the pace it grew since the last read --
asks the kernel to stop the cell (``stop(number, level)``): the kernel raises
``nbmon.MemoryGuardError`` (a ``MemoryError``) in the cell's code. The cell's
frames unwind and free what they held; the kernel and its variables stay.

Pace: every :data:`FAR_EVERY_S` between cells, every :data:`CELL_EVERY_S`
while a cell runs (and at once as it starts: the session hurries it), every
:data:`NEAR_EVERY_S` within :data:`NEAR_POINTS` of the line (or at the pace
of the last reads, within two reads of it). A read is one small file (the
page cache it leaves aside is read every :data:`CACHE_EVERY_S`): microseconds.

It acts before the line when the memory grows fast: it leaves room for
what comes before the cell can stop, at the pace of the last
:data:`PACE_WINDOW_S` and at least the biggest step seen then (a loop that
adds 25 MiB arrays is stopped a step early). It never acts between cells,
never on a cell that has not grown by :data:`MIN_GROWTH_MB` itself (one that
starts past the line is not to blame), never twice in a cell nor twice for
one crossing (it re-arms once the memory is :data:`REARM_POINTS` below the
line), and never on a figure it could not read (NaN). What it cannot stop: one
allocation that takes the memory past the limit between two reads, and code
that does not return to Python (a C call holding the GIL); the kernel is
then killed as before, and :attr:`MemoryGuard.stops` says what it tried.

Foresight: it keeps how much each cell grew at its peak, by its source's
digest (the last :data:`FORESIGHT_KEPT` cells); when a cell that ran before
starts and grew by more last time than is free below the limit now, or was
stopped by the guard, the cell is told in one line (``say``), and runs all
the same.
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from typing import Callable

from ..format import fmt
from ..options import DEFAULT_MEMORY_GUARD_PERCENT, GUARD_AUTO
from ..sources.cgroup import Cgroup
from ..values import MIB
from .memwarn import CONTAINER, LIMIT_EVERY_S, MACHINE, Level, inactive_file_mb

FAR_EVERY_S = 0.25     # between cells (it never acts there)
CELL_EVERY_S = 0.05    # while a cell runs, the line far: 1 GiB/s grows 50 MiB between reads
NEAR_EVERY_S = 0.02
NEAR_POINTS = 15.0     # from this far below the line, read every NEAR_EVERY_S
REARM_POINTS = 5.0     # a crossing ends this far below the line
LEAD_S = 0.1           # from a read to the cell stopped: the next read and the kernel's reaction (loaded)
CACHE_EVERY_S = 0.25   # the page cache the OOM killer leaves aside moves slowly: read this often
PACE_WINDOW_S = 0.25   # the pace, and the biggest step, over the reads of this long
MIN_GROWTH_MB = 4.0    # a cell stopped has grown at least this much itself (not one that started past the line)
STOPS_KEPT = 32
FORESIGHT_KEPT = 256   # cells whose growth is remembered (a digest and a float each)


class MemoryGuard:
    """A consumer that stops the running cell of process ``pid`` when the
    memory that can kill it reaches ``percent`` of the limit ("auto": the
    default share, where a container's limit is known; None: never).
    ``running_cell()`` names the running cell ((number, start, its source's
    digest), None between cells); ``stop(number, level)`` asks the kernel to
    stop cell ``number`` (``level``: the memory that made it; :func:`stop_text`
    says it); ``say(text)``, where given, tells the running cell what a
    cell that ran before grew by.
    ``stops``: (epoch s, Level, number) of the last stops asked for."""

    name = "MemoryGuard"
    at_start = True

    def __init__(self, pid: int, percent: float | str | None, *, stop: Callable[[int | None, Level], None],
                 running_cell: Callable[[], tuple | None], say: Callable[[str], None] | None = None):
        self.percent = percent
        self.stop = stop
        self.running_cell = running_cell
        self.say = say
        # source digest -> (MiB grown at its peak, whether the guard stopped it): its last run
        self._grown: OrderedDict[str, tuple[float, bool]] = OrderedDict()
        self._cell_peak_mb = math.nan
        self.stops: deque[tuple[float, Level, int | None]] = deque(maxlen=STOPS_KEPT)
        self._source = Cgroup(pid)
        self._source.start(0.0)
        self._cgroup = dict(self._source.dirs)
        self._reads: deque[tuple[float, float]] = deque()   # (monotonic s, used MiB): the window's and one before
        self._cell = None              # the running cell as last read, and its memory then
        self._cell_start_mb = math.nan
        self._limit: tuple[float, float] = (-math.inf, math.nan)   # (monotonic s, MiB) as last read
        self._cache: tuple[float, float] = (-math.inf, 0.0)         # (monotonic s, inactive page cache MiB)
        self._near = self._cell_runs = False
        self._armed = True
        self._stopped_in = None
        # A first read now, not at the consumer thread's first turn: the cell that starts
        # the monitor may already be growing then, and its growth counts from here.
        level = self._read() if percent is not None else None
        if level is not None:
            self._reads.append((time.monotonic(), level.used_mb))

    @property
    def every_s(self) -> float:
        return NEAR_EVERY_S if self._near else CELL_EVERY_S if self._cell_runs else FAR_EVERY_S

    def consume(self, store, final: bool) -> None:
        if self.percent is None or final:
            return
        level = self._read()
        if level is None:
            self._near = self._cell_runs = False
            self._reads.clear()
            return
        now, used = time.monotonic(), level.used_mb
        reads = self._reads
        before_mb = reads[-1][1] if reads else used
        reads.append((now, used))
        # The reads of the window and the one before it: a pace over far reads (their interval is the window's).
        while len(reads) > 2 and now - reads[1][0] > PACE_WINDOW_S:
            reads.popleft()
        since = reads[1] if len(reads) > 2 else reads[0]   # the window's first read; over far reads, the one before
        pace = (used - since[1]) / (now - since[0]) if now > since[0] else 0.0
        # Room for what comes before the cell can stop: at its pace, and at least its biggest
        # step between near reads lately (one far read's growth is no one allocation's).
        window = list(reads)[1:]
        step = max((b[1] - a[1] for a, b in zip(window, window[1:])), default=0.0)
        room = max(pace * LEAD_S, step) if pace > 0 else 0.0
        line = level.limit_mb * self._share() / 100.0
        points = 100.0 * (line - used) / level.limit_mb
        if points >= REARM_POINTS:
            self._armed = True
        cell = self.running_cell()
        self._cell_runs = cell is not None
        apart = CELL_EVERY_S if self._cell_runs else FAR_EVERY_S   # the reads' interval when not near
        self._near = points <= NEAR_POINTS or used + room + 2 * apart * max(pace, 0.0) >= line
        if cell != self._cell:   # a new cell, seen since the last read: it grew from then at most
            self._remember()
            self._cell, self._cell_start_mb, self._cell_peak_mb = cell, min(used, before_mb), used
            if cell is not None:
                self._foresee(cell[2], level)
        if cell is None:
            return
        self._cell_peak_mb = max(self._cell_peak_mb, used)
        if not self._armed or cell == self._stopped_in or used - self._cell_start_mb < MIN_GROWTH_MB:
            return
        if used + room >= line:
            self._armed, self._stopped_in = False, cell
            self.stops.append((time.time(), level, cell[0]))
            self.stop(cell[0], level)

    def close(self) -> None:
        pass

    def _remember(self) -> None:
        """The cell that ended: how much it grew at its peak, by its source."""
        if self._cell is None or not self._cell[2]:
            return
        grown = self._grown
        grown[self._cell[2]] = (max(0.0, self._cell_peak_mb - self._cell_start_mb), self._cell == self._stopped_in)
        grown.move_to_end(self._cell[2])
        while len(grown) > FORESIGHT_KEPT:
            grown.popitem(last=False)

    def _foresee(self, source: str, level: Level) -> None:
        if self.say is None or source not in self._grown:
            return
        grown_mb, stopped = self._grown[source]
        if stopped or grown_mb >= max(MIN_GROWTH_MB, level.limit_mb - level.used_mb):
            self.say(foresight_text(grown_mb, stopped, level))

    def _share(self) -> float:
        return DEFAULT_MEMORY_GUARD_PERCENT if self.percent == GUARD_AUTO else float(self.percent)

    def _read(self) -> Level | None:
        """The memory that can kill the kernel now (None where unknown, or
        with "auto" and no container's limit)."""
        source = self._source
        if self._cgroup.get("memory"):
            now = time.monotonic()
            if now - self._limit[0] >= LIMIT_EVERY_S:
                self._limit = (now, source._memory_limit() / MIB)
            if now - self._cache[0] >= CACHE_EVERY_S:
                self._cache = (now, inactive_file_mb(self._cgroup))
            used, limit = source._memory_used() / MIB, self._limit[1]
            if used == used and limit == limit and limit > 0:
                return Level(CONTAINER, max(0.0, used - self._cache[1]), limit)
        if self.percent == GUARD_AUTO:
            return None
        try:
            with open("/proc/meminfo", "rb") as f:
                info = {line.split(b":")[0]: int(line.split()[1]) for line in f}
            total, available = info[b"MemTotal"] / 1024.0, info[b"MemAvailable"] / 1024.0
        except (OSError, KeyError, ValueError, IndexError):
            return None
        return Level(MACHINE, total - available, total) if total > 0 and not math.isnan(available) else None


def stop_text(level: Level, stopped: str = "nbmon stopped this cell", victim: str = "the kernel",
              then: str = "; your variables are kept") -> str:
    """What the stopped cell's MemoryGuardError says (``nbmon run``: what it
    did to the command)."""
    if level.kind == CONTAINER:
        return (f"{stopped} at {fmt(level.used_mb, 'MiB')} of the container's "
                f"{fmt(level.limit_mb, 'MiB')} memory limit, before the OOM killer would kill {victim}{then}")
    return (f"{stopped} at {fmt(level.used_mb, 'MiB')} of the machine's "
            f"{fmt(level.limit_mb, 'MiB')} memory, before {victim} would run out of it{then}")


def foresight_text(grown_mb: float, stopped: bool, level: Level) -> str:
    """The line a cell gets as it starts when it grew by more last time than
    is free now, or was stopped."""
    last = (f"the memory guard stopped this cell last time, after it grew by {fmt(grown_mb, 'MiB')}" if stopped
            else f"this cell grew by {fmt(grown_mb, 'MiB')} at its peak last time")
    free, limit = fmt(max(0.0, level.limit_mb - level.used_mb), "MiB"), fmt(level.limit_mb, "MiB")
    if level.kind == CONTAINER:
        return f"nbmon: {last}; {free} is free below the container's {limit} memory limit"
    return f"nbmon: {last}; {free} of the machine's {limit} is free"
