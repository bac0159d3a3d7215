"""Why did my kernel die? The post-mortem of a kernel that left its black box
(:mod:`nbmon.postmortem.blackbox`) behind.

A box is a kernel's of this host when its host name is this one's: then a
box whose kernel is gone (its pid and start time name no live process, or
the host has restarted since: another boot id) is a death. Its cause is
what nbmon can establish, nothing more:

- the OOM-kill counter of the kernel's memory cgroup is higher now than in
  the box's last record: "killed by the container's OOM killer at 7.9 GiB
  of its 8.0 GiB limit" (without a limit: by the OOM killer, with the
  machine's available memory);
- the host restarted since (another boot id): "the host restarted";
- otherwise: "the kernel stopped without exiting normally", with the last
  figures (a SIGKILL, a crash, a host that stopped it).

A box of a live process, of a process in another pid namespace (whose pid
says nothing here), or of another host (a home shared by hosts: its boot
id and pid say nothing here), is never a death. Each death is shown once,
by the next ``%load_ext nbmon`` of the same notebook (``JPY_SESSION_NAME``,
matched whole: by its hash where the box's header had to cut it; without
one, of a kernel that had none either): :func:`claim` renames its box from
``.box`` to ``.seen``, so two kernels starting at once cannot both show it.
:func:`last_death` and ``nbmon postmortem`` read shown ones too.

Boxes of the dead are kept :data:`KEEP_S` (7 days), at most
:data:`KEEP_DEAD` (16) of them, and swept at each ``%load_ext nbmon``. The
newest :data:`MAX_ENTRIES` entries of the directory are read (by the time
they were last written), so old ones can never hide a new death; older
ones are swept after :data:`KEEP_S`.
Anything in the directory that is not a whole box of this user's (a
truncated or damaged file, garbage, a link, another user's file) is skipped
with a sentence saying why (``nbmon postmortem`` lists them), never read
through, never raised; the sweep removes only this user's own regular files.
"""
from __future__ import annotations

import math
import os
import re
import socket
import stat
import time
from dataclasses import dataclass, field, replace

from .. import catalog
from .blackbox import (NOTEBOOK_HASH, SUFFIX, BadBox, Box, Cell, boot_id, box_dir, notebook_hash, notebook_name,
                       pid_namespace, read_box)
from ..format import fmt, one_line, printable
from ..report.render import html_table, text_table
from ..private import alive
from ..sources.cgroup import Cgroup
from ..report.variables import held_before

KEEP_S = 7 * 86400.0
KEEP_DEAD = 16
MAX_ENTRIES = 256          # entries read, at most: the newest
SEEN = ".seen"
_NAME = re.compile(r"\d{1,10}-\d{1,20}-[0-9a-f]{0,8}(\.box|\.seen)")
OOM, HOST_RESTART, UNKNOWN = "oom", "host restarted", "unknown"


@dataclass(frozen=True)
class Death:
    """One kernel's death, as data. Times are epoch seconds, memory MiB,
    unknown figures NaN. ``cause`` is "oom", "host restarted" or
    "unknown"; ``records`` are the box's last minute: ``(wall, {field:
    value})``, oldest first. It shows as a table (``str()``: as text); at
    ``%load_ext nbmon`` the notebook shows it as a record like a
    ``%%resmon`` cell's, with the timeline of ``records``
    (:func:`nbmon.helper.host.death_record`). ``held``: the
    box's variables (:meth:`nbmon.report.variables.Variables.for_box`), the
    largest the kernel held as the last cell before its death ended."""

    pid: int
    notebook: str
    cwd: str
    host: str
    last_seen: float
    cell: Cell
    cause: str
    oom_kills: float             # OOM kills in the container after the box's last record
    memory_used_mb: float        # the container's usage in the last record
    memory_limit_mb: float
    memory_peak_mb: float        # the container's highest usage in the box
    tree_memory_mb: float        # the process tree's memory in the last record
    tree_memory_peak_mb: float
    cpu_percent: float
    available_mb: float          # the machine's available memory in the last record
    total_mb: float
    gpu_memory_mb: float
    records: tuple = field(repr=False)
    path: str = field(default="", repr=False)
    held: dict | None = None     # the largest variables as of the last cell that ended (the box's)
    guard: float | str | None = None   # the memory guard's setting ("auto", a percentage, None: off)

    def cause_text(self) -> str:
        if self.cause == OOM:
            if self.memory_limit_mb == self.memory_limit_mb:
                return (f"killed by the container's OOM killer at {fmt(self.memory_used_mb, 'MiB')} "
                        f"of its {fmt(self.memory_limit_mb, 'MiB')} memory limit{self._guard_text()}")
            return (f"killed by the OOM killer ({fmt(self.available_mb, 'MiB')} of the machine's "
                    f"{fmt(self.total_mb, 'MiB')} were available){self._guard_text(machine=True)}")
        if self.cause == HOST_RESTART:
            return "the host restarted while the kernel ran"
        seen = ("nbmon saw no OOM kill in its container" if self.oom_kills == self.oom_kills
                else "whether the OOM killer struck cannot be told (its cgroup is gone)")
        return f"the kernel stopped without exiting normally (a signal, a crash, or its host); {seen}"

    def _guard_text(self, machine: bool = False) -> str:
        """Why the memory guard, where it watched, did not save the kernel."""
        if self.guard is None or (machine and self.guard == "auto"):
            return ""
        return ("; the memory guard could not stop the cell in time: the memory went past the limit between "
                "two of its reads (one large allocation), or the cell's code did not return to Python "
                "(a C call holding the GIL)")

    def title(self) -> str:
        who = f"a kernel of {printable(os.path.basename(self.notebook))}" if self.notebook else "a kernel of yours"
        return f"nbmon · {who} died"

    def rows(self) -> list[tuple[str, str]]:
        age = max(0.0, time.time() - self.last_seen)
        rows = [("Last seen alive", f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.last_seen))} "
                                    f"({fmt(age, 's')} ago)"),
                ("Cell", self._cell_text()),
                ("Cause", self.cause_text())]
        if self.memory_used_mb == self.memory_used_mb:
            limit = f" of {fmt(self.memory_limit_mb, 'MiB')}" if self.memory_limit_mb == self.memory_limit_mb else ""
            rows.append(("Memory (container)", f"{fmt(self.memory_used_mb, 'MiB')}{limit}, "
                                               f"peak {fmt(self.memory_peak_mb, 'MiB')}"))
        rows += [("Memory (process tree)", f"{fmt(self.tree_memory_mb, 'MiB')}, peak {fmt(self.tree_memory_peak_mb, 'MiB')}"),
                 ("CPU (process tree)", fmt(self.cpu_percent, "%")),
                 ("Machine memory available", f"{fmt(self.available_mb, 'MiB')} of {fmt(self.total_mb, 'MiB')}")]
        if self.gpu_memory_mb == self.gpu_memory_mb:
            rows.append(("GPU memory", fmt(self.gpu_memory_mb, "MiB")))
        held = self._held_text()
        if held:
            rows.append(("Variables held", held))
        rows.append(("Kernel", f"pid {self.pid} on {printable(self.host)}"
                               + (f", in {printable(self.cwd)}" if self.cwd and not self.notebook else "")))
        if self.notebook:
            rows.append(("Notebook", printable(self.notebook)))
        return rows

    def _cell_text(self) -> str:
        cell = self.cell
        if not cell.running:
            return "none was running"
        number = f"[{cell.number}] " if cell.number is not None else ""
        ran = f" (running for {fmt(self.last_seen - cell.started, 's')})" if cell.started == cell.started else ""
        return f"{number}{printable(cell.label)}{ran}"

    def _held_text(self) -> str:
        """What the kernel held before the fatal cell ('' if the box does not say, or says it wrong)."""
        try:
            return printable(held_before(self.held)) if self.held is not None else ""
        except ValueError:
            return ""

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": html_table(self.title(), self.rows(), status="failed"), "text/plain": str(self)}

    def __str__(self) -> str:
        return text_table(self.title(), self.rows())

    def to_dict(self) -> dict:
        """The figures as plain data (NaN as None)."""
        out = {k: getattr(self, k) for k in ("pid", "notebook", "cwd", "host", "last_seen", "cause",
                                              "oom_kills", "memory_used_mb", "memory_limit_mb", "memory_peak_mb",
                                              "tree_memory_mb", "tree_memory_peak_mb", "cpu_percent",
                                              "available_mb", "total_mb", "gpu_memory_mb")}
        out = {k: (None if isinstance(v, float) and v != v else v) for k, v in out.items()}
        out["cause_text"] = self.cause_text()
        out["held"] = self.held
        out["held_text"] = self._held_text()
        out["cell"] = {"number": self.cell.number, "label": self.cell.label, "running": self.cell.running,
                       "started": None if self.cell.started != self.cell.started else self.cell.started}
        return out


def _tree_field(records) -> str:
    names = records[-1][1] if records else {}
    return next((n for n in names if (m := catalog.BY_NAME.get(n)) is not None
                 and m.source == catalog.TREE and m.unit == "MiB"), "")


def _last(records, name: str) -> float:
    for _, values in reversed(records):
        v = values.get(name, math.nan)
        if v == v:
            return v
    return math.nan


def _peak(records, name: str) -> float:
    values = [v for _, r in records if (v := r.get(name, math.nan)) == v]
    return max(values) if values else math.nan


def tree_peak_mb(box: Box) -> float:
    """The highest memory of the kernel's tree over its box's records (its last minute)."""
    records = [(r.wall, r.values) for r in box.records]
    tree = _tree_field(records)
    return _peak(records, tree) if tree else math.nan


def _oom_kills_since(box: Box, records) -> float:
    """OOM kills in the box's cgroup after its last record (NaN: cannot tell)."""
    before = _last(records, "cgroup_oom_kills")
    dirs = box.header["cgroup"]
    if before != before or not dirs.get("memory") or not os.path.isabs(dirs["memory"]) \
            or ".." in dirs["memory"].split("/"):
        return math.nan
    source = Cgroup(dirs=dirs)
    source.start(0.0)
    now = source.sample(0.0)["cgroup_oom_kills"]
    return now - before if now == now else math.nan


def death_of(box: Box) -> Death:
    """The post-mortem of a dead kernel's ``box``."""
    records = tuple((r.wall, r.values) for r in box.records)
    h = box.header
    kills = _oom_kills_since(box, records)
    if h["boot"] != boot_id():
        cause = HOST_RESTART
    elif kills == kills and kills > 0:
        cause = OOM
    else:
        cause = UNKNOWN
    tree = _tree_field(records)
    return Death(
        pid=h["pid"], notebook=h["notebook"], cwd=h["cwd"], host=h["host"],
        last_seen=records[-1][0] if records else h["created"], cell=box.cell, cause=cause, oom_kills=kills,
        memory_used_mb=_last(records, "cgroup_mem_used_mb"), memory_limit_mb=_last(records, "cgroup_mem_limit_mb"),
        memory_peak_mb=_peak(records, "cgroup_mem_used_mb"),
        tree_memory_mb=_last(records, tree) if tree else math.nan,
        tree_memory_peak_mb=_peak(records, tree) if tree else math.nan,
        cpu_percent=_last(records, "proc_cpu_percent"), available_mb=_last(records, "sys_mem_available_mb"),
        total_mb=_last(records, "sys_mem_total_mb"), gpu_memory_mb=_last(records, "gpu_mem_used_mb"),
        records=records, path=box.path, held=box.held, guard=h["guard"])


# -- the directory ---------------------------------------------------------------------


@dataclass
class Scan:
    """What the box directory holds: ``dead`` (Box, seen) newest first,
    ``live`` boxes, ``skipped`` [(path, why)], ``unread``: the entries
    older than the newest MAX_ENTRIES, and ``problem``: why the directory
    itself could not be read ('' when it could)."""

    directory: str = ""
    dead: list = field(default_factory=list)
    live: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    unread: list = field(default_factory=list)
    problem: str = ""


def _state(box: Box) -> str:
    h = box.header
    if h["host"] != socket.gethostname():
        return "another host"
    if h["boot"] != boot_id():
        return "dead"
    if h["pid_ns"] != pid_namespace():
        return "another pid namespace"
    return "live" if alive(h["pid"], h["started"]) else "dead"


def _read(path: str) -> tuple[Box | None, str]:
    """The box at ``path`` and its :func:`_state`; None and why where it is not a box or cannot be read."""
    if not _NAME.fullmatch(os.path.basename(path)):
        return None, "not a black box's name"
    try:
        box = read_box(path)
    except (BadBox, OSError) as err:
        return None, str(err) or type(err).__name__
    return box, _state(box)


_ELSEWHERE = {"another host": "a kernel on another host ({}): whether it lives cannot be told from here",
              "another pid namespace": "a kernel in another pid namespace (container): whether it lives "
                                       "cannot be told from here"}


def _newest(directory: str) -> tuple[list[str], list[str]]:
    """The directory's entries, newest first (by the time they were last
    written): (the first MAX_ENTRIES, the rest). Hidden ones are boxes
    being created (:data:`~nbmon.postmortem.blackbox.WRITING`)."""
    entries = []
    with os.scandir(directory) as listing:
        for entry in listing:
            if entry.name.startswith("."):
                continue
            try:
                entries.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
            except OSError:   # gone meanwhile
                continue
    names = [name for _, name in sorted(entries, reverse=True)]
    return names[:MAX_ENTRIES], names[MAX_ENTRIES:]


def scan() -> Scan:
    """Read the newest boxes in the directory (never raises)."""
    found = Scan()
    try:
        found.directory = box_dir()
        names, older = _newest(found.directory)
    except OSError as err:
        found.problem = one_line(f"the black boxes' directory cannot be used: {err}")
        return found
    found.unread = [os.path.join(found.directory, name) for name in older]
    for name in names:
        path = os.path.join(found.directory, name)
        box, state = _read(path)
        if box is None:
            found.skipped.append((path, state))
        elif state == "live":
            found.live.append(box)
        elif state == "dead":
            found.dead.append((box, name.endswith(SEEN)))
        else:
            found.skipped.append((path, one_line(_ELSEWHERE[state].format(box.header["host"]))))
    found.dead.sort(key=lambda entry: _last_seen(entry[0]), reverse=True)
    return found


def live_boxes(processes) -> dict[tuple[int, int], Box]:
    """The boxes of the running ``processes`` ((pid, start time) pairs), by
    that pair. Only a box whose name names one of them is read: a dead
    kernel's (kept a week) costs a name's match, not a read."""
    try:
        directory = box_dir()
        names = os.listdir(directory)
    except OSError:
        return {}
    wanted = {f"{pid}-{started}": (pid, started) for pid, started in processes}
    found = {}
    for name in names:
        key = wanted.get(name.rsplit("-", 1)[0])   # a box's name: pid-start-boot.box
        if key is None or not name.endswith(SUFFIX):
            continue
        box, state = _read(os.path.join(directory, name))
        if box is not None and state == "live" and (box.header["pid"], box.header["started"]) == key:
            found[key] = box
    return found


def _last_seen(box: Box) -> float:
    return box.records[-1].wall if box.records else box.header["created"]


def _ours(box: Box, notebook: str) -> bool:
    cut = box.header.get(NOTEBOOK_HASH)   # the name did not fit in the header: its hash did
    return cut == notebook_hash(notebook) if isinstance(cut, str) else box.header["notebook"] == notebook


def claim(notebook: str | None = None) -> tuple[Death | None, str]:
    """The newest death of this notebook's kernels not shown before (marked
    shown now), and a problem to tell ('' if none); sweeps old boxes."""
    notebook = notebook_name() if notebook is None else notebook
    found = scan()
    newest = None
    for k, (box, seen) in enumerate(found.dead):
        if seen or not _ours(box, notebook):
            continue
        seen_path = box.path[:-len(SUFFIX)] + SEEN
        try:
            os.rename(box.path, seen_path)  # atomic: of two kernels starting at once, one shows it
        except OSError:
            continue
        box = replace(box, path=seen_path)
        found.dead[k] = (box, True)   # the sweep finds it under its new name
        if newest is None:
            newest = death_of(box)
    sweep(found)
    return newest, found.problem


def last_death(notebook: str | None = None) -> Death | None:
    """The post-mortem of the last kernel of this notebook (``JPY_SESSION_NAME``,
    or of kernels outside a notebook server without it) that died while
    nbmon watched it; None if none did (in the last :data:`KEEP_S` seconds)."""
    notebook = notebook_name() if notebook is None else notebook
    for box, _seen in scan().dead:
        if _ours(box, notebook):
            return death_of(box)
    return None


def deaths() -> tuple[list[Death], Scan]:
    """Every death the directory holds, newest first, and the scan."""
    found = scan()
    return [death_of(box) for box, _ in found.dead], found


def sweep(found: Scan, now: float | None = None) -> list[str]:
    """Remove the boxes of the dead older than KEEP_S or beyond the newest
    KEEP_DEAD, and this user's own regular files among the skipped and the
    unread ones older than KEEP_S; returns the paths removed."""
    now = time.time() if now is None else now
    old = [box.path for k, (box, _) in enumerate(found.dead) if k >= KEEP_DEAD or now - _last_seen(box) > KEEP_S]
    for path in [path for path, _why in found.skipped] + found.unread:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and now - st.st_mtime > KEEP_S:
            old.append(path)
    removed = []
    for path in old:
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed
