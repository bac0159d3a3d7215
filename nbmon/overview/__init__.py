"""Every Jupyter kernel of this user on this host, at a glance: runs in
whichever process asks (``nbmon kernels`` and ``nbmon top`` in a terminal,
``nbmon.kernels()`` in a kernel).

Each kernel (:func:`nbmon.sources.kernels.find_kernels`) is measured as
``%resmon`` measures one: its whole process tree's memory as the machine
sees it (PSS: shared pages once, forked workers included; nbmon's own
helper processes left out), CPU (100 = one
core) over the time since the last refresh, GPU memory and utilisation
of its processes, and its share of its memory cgroup's limit. A kernel nbmon watches also
says, from the black box it keeps, its tree's peak memory over the last
minute and whether a cell runs: its prompt number, first line and since when. A row's figures are NaN where unknown; the
text for humans is made at the edges (:func:`table_text`).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

from ..format import fmt, one_line, printable
from ..postmortem import deaths
from ..sources.cgroup import Cgroup
from ..sources.gpus import GPUs
from ..sources.kernels import KernelProcess, find_kernels
from ..sources.machine import Machine
from ..sources.tree import ProcessTree
from ..values import NAN

SORTS = {"memory": "proc_pss_mb", "cpu": "proc_cpu_percent", "gpu": "gpu_proc_mem_mb", "age": "age_s"}
FIRST_INTERVAL_S = 0.5   # a one-shot table's CPU % is over this long
ROW_COLUMNS = ("notebook", "kernel_id", "pid", "age_s", "this", "proc_pss_mb", "proc_pss_peak_mb", "limit_percent",
               "proc_cpu_percent", "gpu_proc_mem_mb", "gpu_proc_util_percent", "proc_count", "watched", "state", "cell_number", "cell_label", "busy_s")


@dataclass
class KernelsTable:
    """One refresh: a row per kernel (dicts, units in the names), and what is
    left of the memory this process may use: of its container's limit where
    there is one (``room_of`` "container"), else of the machine's."""

    rows: list[dict] = field(default_factory=list)
    room_mb: float = NAN
    limit_mb: float = NAN
    room_of: str = "machine"

    def sorted_by(self, key: str) -> list[dict]:
        """Largest first; unknown figures last."""
        column = SORTS[key]
        return sorted(self.rows, key=lambda r: (r[column] != r[column], -r[column] if r[column] == r[column] else 0))

    def totals(self) -> dict:
        def total(column: str) -> float:
            known = [r[column] for r in self.rows if r[column] == r[column]]
            return sum(known) if known else NAN

        return {c: total(c) for c in ("proc_pss_mb", "proc_cpu_percent", "gpu_proc_mem_mb", "gpu_proc_util_percent",
                                      "proc_count")}


class Kernels:
    """Every kernel of this user, refreshed on demand: the trees of kernels
    seen before are kept (their CPU % is over the time since the last
    refresh), those of kernels gone are closed. ``this_pid``: the process
    whose kernel is "this" one (this process by default; a helper names its
    kernel, for a helper is in no kernel's tree)."""

    def __init__(self, gpu: bool = True, this_pid: int | None = None):
        self.this_pid = os.getpid() if this_pid is None else this_pid   # its kernel's row says "this"
        self._trees: dict[tuple[int, int], tuple[ProcessTree, Cgroup]] = {}
        self._gpus = GPUs() if gpu else None
        self._own = Cgroup(slow_every_s=0.0)   # read at every refresh, however soon after the last
        self._machine = Machine(slow_every_s=0.0)
        self._started = False

    def _start(self, now: float) -> None:
        if self._gpus is not None:
            self._gpus.start(now)
        self._own.start(now)
        self._machine.start(now)
        self._started = True

    def refresh(self) -> KernelsTable:
        now = time.monotonic()
        if not self._started:
            self._start(now)
        members = frozenset(pid for (root, _), (tree, _) in self._trees.items() for pid in tree.pids if pid != root)
        found = find_kernels(members=members)
        boxes = deaths.live_boxes({(kernel.pid, kernel.started) for kernel in found.kernels})
        seen, rows = set(), []
        for kernel in found.kernels:
            key = (kernel.pid, kernel.started)
            seen.add(key)
            if key in self._trees and found.helpers & set(self._trees[key][0].pids):
                self._trees.pop(key)[0].close()   # a helper that started as the tree was read: it leaves
            if key not in self._trees:
                tree, group = ProcessTree(kernel.pid, slow_every_s=0.0), Cgroup(kernel.pid, slow_every_s=0.0)
                tree.excluded_pids = found.helpers   # nbmon's own: left out, as %resmon leaves them
                try:
                    tree.start(now)
                    group.start(now)
                except OSError:   # gone meanwhile
                    continue
                self._trees[key] = (tree, group)
                figures = {"proc_cpu_percent": NAN}   # no interval yet
                figures.update({k: v for k, v in tree.sample(now).items() if k != "proc_cpu_percent"})
            else:
                tree, group = self._trees[key]
                tree.excluded_pids = found.helpers
                figures = tree.sample(now)
            rows.append(self._row(kernel, tree, group, figures, boxes.get(key), now))
        for key in set(self._trees) - seen:
            self._trees.pop(key)[0].close()
        return self._table(rows, now)

    def _row(self, kernel: KernelProcess, tree: ProcessTree, group: Cgroup, figures: dict, box, now: float) -> dict:
        pids = tree.pids
        gpu = {}
        if self._gpus is not None and self._gpus.devices:
            self._gpus.tree_pids = lambda: pids
            gpu = self._gpus.sample(now)
        limit = group.sample(now)["cgroup_mem_limit_mb"]
        cell = box.cell if box is not None else None
        running = cell is not None and cell.running
        return {"notebook": kernel.session, "kernel_id": kernel.kernel_id, "pid": kernel.pid,
                "started": kernel.started, "age_s": kernel.age_s, "this": self.this_pid in pids,
                "proc_pss_mb": figures.get("proc_pss_mb", NAN),
                "proc_pss_peak_mb": deaths.tree_peak_mb(box) if box is not None else NAN,
                "limit_percent": figures.get("proc_pss_mb", NAN) / limit * 100.0 if limit == limit else NAN,
                "proc_cpu_percent": figures.get("proc_cpu_percent", NAN),
                "gpu_proc_mem_mb": gpu.get("gpu_proc_mem_mb", NAN),
                "gpu_proc_util_percent": gpu.get("gpu_proc_util_percent", NAN), "proc_count": float(len(pids)),
                "watched": box is not None, "state": ("busy" if running else "idle") if box is not None else "",
                "cell_number": cell.number if running else None, "cell_label": cell.label if running else "",
                "busy_s": time.time() - cell.started if running and cell.started == cell.started else NAN}

    def _table(self, rows: list[dict], now: float) -> KernelsTable:
        own = self._own.sample(now)
        limit, used = own["cgroup_mem_limit_mb"], own["cgroup_mem_used_mb"]
        if limit == limit:
            return KernelsTable(rows, room_mb=limit - used, limit_mb=limit, room_of="container")
        machine = self._machine.sample(now)
        return KernelsTable(rows, room_mb=machine.get("sys_mem_available_mb", NAN),
                            limit_mb=machine.get("sys_mem_total_mb", NAN))

    def close(self) -> None:
        for tree, _ in self._trees.values():
            tree.close()
        self._trees.clear()
        if self._gpus is not None:
            self._gpus.close()


def measure(interval_s: float = FIRST_INTERVAL_S, gpu: bool = True) -> KernelsTable:
    """One table, its CPU % over ``interval_s``."""
    kernels = Kernels(gpu=gpu)
    try:
        kernels.refresh()
        time.sleep(interval_s)
        return kernels.refresh()
    finally:
        kernels.close()


def kernels(sort: str = "memory"):
    """Every Jupyter kernel of yours on this host, as a pandas DataFrame, a
    row per kernel, largest first by ``sort`` (memory, cpu, gpu or age):
    the notebook it serves, pid, age, its process tree's memory (PSS, MiB)
    and share of its memory limit, CPU (100 = one core, over half a
    second), GPU memory, processes, and, where nbmon watches it, its peak
    memory over the last minute and whether a cell runs (``this``: the kernel calling)."""
    import pandas as pd

    if sort not in SORTS:
        raise ValueError(f"sort by one of {', '.join(SORTS)}, not {sort!r}")
    return pd.DataFrame(measure().sorted_by(sort), columns=ROW_COLUMNS)


NAME_CHARS = 40
# (heading, width: 0 for the rest of the line, right-aligned: a number)
COLUMNS = (("NOTEBOOK", NAME_CHARS, False), ("PID", 7, True), ("AGE", 4, True), ("MEMORY", 9, True),
           ("PEAK 1M", 9, True), ("LIMIT", 6, True), ("CPU", 7, True), ("GPU MEM", 9, True), ("GPU", 6, True), ("PROCS", 5, True), ("STATE", 0, False))


def _age(seconds: float) -> str:
    if seconds != seconds:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _state(row: dict) -> str:
    if not row["watched"]:
        return "not watched"
    if row["state"] != "busy":
        return "idle"
    number = "?" if row["cell_number"] is None else row["cell_number"]
    return f"busy {_age(row['busy_s'])}: [{number}] {row['cell_label']}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def row_cells(row: dict) -> list[str]:
    """A row as text, one string per :data:`COLUMNS` entry."""
    name = printable(one_line(row["notebook"] or f"kernel {row['kernel_id']}"))
    if len(name) > NAME_CHARS - 2:   # a long path keeps its end: the notebook's own name
        name = "\u2026" + name[-(NAME_CHARS - 3):]
    name = ("\u25b6 " if row["this"] else "") + name
    return [name, str(row["pid"]), _age(row["age_s"]), fmt(row["proc_pss_mb"], "MiB"),
            fmt(row["proc_pss_peak_mb"], "MiB"), fmt(row["limit_percent"], "%"),
            fmt(row["proc_cpu_percent"], "%"), fmt(row["gpu_proc_mem_mb"], "MiB"),
            fmt(row["gpu_proc_util_percent"], "%"), f"{row['proc_count']:.0f}",
            printable(one_line(_state(row)))]


def total_text(table: KernelsTable) -> str:
    totals = table.totals()
    count = len(table.rows)
    text = (f"{count} kernel{'s' if count != 1 else ''}: {fmt(totals['proc_pss_mb'], 'MiB')}, "
            f"CPU {fmt(totals['proc_cpu_percent'], '%')}") if count else "no Jupyter kernel of yours runs on this host"
    if totals["gpu_proc_mem_mb"] == totals["gpu_proc_mem_mb"]:
        text += f", GPU {fmt(totals['gpu_proc_mem_mb'], 'MiB')}"
        if totals["gpu_proc_util_percent"] == totals["gpu_proc_util_percent"]:
            text += f" at {fmt(totals['gpu_proc_util_percent'], '%')}"
    if table.room_mb == table.room_mb:
        text += (f" · {fmt(table.room_mb, 'MiB')} free of the {table.room_of}'s "
                 f"{fmt(table.limit_mb, 'MiB')}" + (" limit" if table.room_of == "container" else ""))
    return text


def table_text(table: KernelsTable, sort: str = "memory", width: int = 120) -> str:
    """The table as lines of text, ``width`` characters at most."""
    def line(cells: list[str]) -> str:
        out = "  ".join((_cut(c, w).rjust(w) if right else _cut(c, w).ljust(w)) if w else c
                        for c, (_, w, right) in zip(cells, COLUMNS))
        return _cut(out.rstrip(), width)

    lines = [line([name for name, _, _ in COLUMNS])]
    lines += [line(row_cells(row)) for row in table.sorted_by(sort)]
    lines.append(_cut(total_text(table), width))
    return "\n".join(lines)


def as_json(table: KernelsTable, sort: str = "memory") -> dict:
    """The table for scripts: NaN as null."""
    def clean(value):
        return None if isinstance(value, float) and math.isnan(value) else value

    return {"kernels": [{k: clean(v) for k, v in row.items()} for row in table.sorted_by(sort)],
            "total": {k: clean(v) for k, v in table.totals().items()},
            "room_mb": clean(table.room_mb), "limit_mb": clean(table.limit_mb), "room_of": table.room_of}
