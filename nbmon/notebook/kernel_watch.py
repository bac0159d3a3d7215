"""Watching over the kernel itself (issue 20): a warning in the running cell
before the container's memory limit (:mod:`nbmon.memwarn`), the black box
while the notebook's monitor runs (:mod:`nbmon.blackbox`), and, at
``%load_ext nbmon``, the post-mortem of this notebook's last kernel if it
died (:mod:`nbmon.postmortem`).

No IPython import: the shell and IPython's ``display`` are handed in by
:mod:`nbmon.notebook.magics`.
"""
from __future__ import annotations

import sys

from .. import postmortem
from ..blackbox import SLOTS, BlackBox, CellNote
from ..memwarn import MemoryWatch
from ..render import html_table, text_table
from ..runtime import fallback_note
from ..store import BUCKET, Store
from ..values import NAN
from .charts import Record, record_timeline

LABEL_CHARS = 60


def first_line(source: str) -> str:
    """A cell's label: its first line that is not blank, at most LABEL_CHARS long."""
    return next((line.strip() for line in (source or "").splitlines() if line.strip()), "")[:LABEL_CHARS]


def _say(text: str) -> None:
    # From the monitor's consumers thread: ipykernel sends a thread's output
    # to the cell that runs now. stderr, so that it reads as a warning.
    print(text, file=sys.stderr, flush=True)


class KernelWatch:
    """The kernel's cell note, and what attaches the memory warning and the
    black box to each monitor the notebook session makes."""

    def __init__(self):
        self.cell = CellNote()
        self.say = None   # set while nbmon is loaded in a shell: warnings go to the running cell

    def attach(self, monitor) -> None:
        """Give ``monitor`` (not started yet) its memory warning and black box."""
        watch = MemoryWatch(monitor.pid, monitor.options.memory_warning_percent, say=self._tell,
                            running_cell=self.cell.running)
        monitor.attach(watch)   # first: the box reads what it has just read
        monitor.attach(BlackBox(self.cell, watch))

    def _tell(self, text: str) -> None:
        if self.say is not None:
            self.say(text)


WATCH = KernelWatch()


def death_record(death: postmortem.Death) -> Record:
    """The post-mortem as a record like a ``%%resmon`` cell's: the table, the
    timeline's legend in it, and the timeline of the box's last minute (its
    records, in a store of their own)."""
    columns = list(dict.fromkeys(name for _, values in death.records for name in values))
    timeline = None
    if columns:
        store = Store(columns, max_bytes=8 * max(SLOTS, 8 * BUCKET) * (len(columns) + 2))
        window = store.open_window()
        for wall, values in death.records:
            store.append(wall, wall, [values.get(c, NAN) for c in columns])
        timeline = record_timeline(store, window.stats())
    title, rows = death.title(), death.rows() + ([timeline.legend] if timeline is not None else [])
    return Record(html_table(title, rows, status="failed"), text_table(title, rows), timeline)


_hooks: dict[int, tuple] = {}


def install(shell, display) -> None:
    """``%load_ext nbmon``: follow ``shell``'s cells, and show the post-mortem
    of this notebook's last kernel with ``display`` if it died unseen."""
    if id(shell) not in _hooks:
        def started(info):
            WATCH.cell.started(shell.execution_count, first_line(info.raw_cell))

        def finished(_result):
            WATCH.cell.finished()

        shell.events.register("pre_run_cell", started)
        shell.events.register("post_run_cell", finished)
        _hooks[id(shell)] = (started, finished)
    WATCH.say = _say
    try:
        death, problem = postmortem.claim()
        record = death_record(death) if death is not None else None
    except Exception as err:  # noqa: BLE001 - never let a post-mortem stop the extension loading
        record, problem = None, f"{type(err).__name__}: {err}"
    if problem:
        print(f"nbmon: no post-mortem: {problem}", file=sys.stderr)
    elif fallback_note():   # the first private place was taken: which one is used
        print(fallback_note(), file=sys.stderr)
    if record is not None:
        display(record.table())
        if record.timeline is not None:
            display(record.picture())


def uninstall(shell) -> None:
    hooks = _hooks.pop(id(shell), None)
    if hooks is not None:
        shell.events.unregister("pre_run_cell", hooks[0])
        shell.events.unregister("post_run_cell", hooks[1])
    if not _hooks:
        WATCH.say = None
