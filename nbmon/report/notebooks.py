"""A cell's record as data that outlives its kernel (issue 45): the figures
nbmon leaves in a monitored cell's output under a mime type of its own
(:data:`RECORD_MIME`; front ends keep it when they save, no viewer shows
it), and what ``nbmon report NOTEBOOK`` and ``nbmon compare OLD NEW`` read
back from saved or executed notebooks.

A notebook is read as JSON (nbformat 4, whoever executed it: JupyterLab,
Notebook 7, nbconvert, papermill); nothing in it is run.
"""
from __future__ import annotations

import functools
import json
import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from ..format import fmt
from .records import CellRecord
from .render import grid_table, grid_text
from .summary import ResourceSummary
from ..values import known

RECORD_MIME = "application/vnd.nbmon.summary+json"
RECORD_VERSION = 1   # raised when a field changes meaning; added fields keep it
# The figures a report and a comparison rank cells by: (name, title, unit).
# "rise": how far memory rose above where the cell started (its own most, whatever earlier cells hold).
METRICS = (("time", "time", "s"), ("peak_mem", "peak mem", "MiB"), ("rise", "peak rise", "MiB"),
           ("growth", "growth", "MiB"),
           ("cpu", "CPU mean", "%"), ("gpu_mem", "GPU mem peak", "MiB"))
# A percent rule of --fail-if passes over cells whose old figure is under this: a 2 ms cell
# taking 3 ms is +50 % and nothing to fail a build for.
PERCENT_FLOOR = {"time": 0.1, "peak_mem": 1.0, "rise": 1.0, "growth": 1.0, "cpu": 1.0, "gpu_mem": 1.0}
_MAGIC_LINE = re.compile(r"\A%%resmon\b[^\n]*\n?")


class NotebookError(ValueError):
    """A file that is no notebook nbmon can read, in one sentence."""


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nbmon")
    except PackageNotFoundError:   # run from a checkout that was never installed
        return "unknown"


def _finite(value):
    """``value`` with NaN and infinities as None: the notebook's JSON has no NaN."""
    if isinstance(value, float):
        return known(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _envelope(kind: str, **fields) -> dict:
    return _finite({"version": RECORD_VERSION, "nbmon": _version(), "kind": kind, "host": socket.gethostname(),
                    **fields})


def record_data(record: CellRecord, kind: str) -> dict:
    """What a record carries as data (``kind``: "cell" for a ``%%resmon``
    record, "line" for auto mode's): its summary and what names the cell."""
    return _envelope(kind, execution_count=record.execution_count, label=record.label, status=record.status,
                     start_time=record.start_time, summary=record.summary.to_dict())


def postmortem_data(death: dict) -> dict:
    """What a post-mortem carries as data: ``death`` is ``Death.to_dict()``."""
    return _envelope("postmortem", death=death)


@dataclass(frozen=True)
class CellCost:
    """A code cell of a notebook with nbmon's record in its outputs."""

    index: int                  # its place among the notebook's cells, from 0
    cell_id: str | None         # nbformat 4.5's id
    source: str                 # its source, a leading %%resmon line out
    execution_count: int | None
    label: str                  # its --label, or ""
    status: str
    summary: ResourceSummary

    @property
    def first_line(self) -> str:
        return next((line.strip() for line in self.source.splitlines() if line.strip()), "")

    @property
    def title(self) -> str:
        """What names it for a reader: its label, else its first line."""
        return self.label or self.first_line

    def figure(self, metric: str) -> float | None:
        s = self.summary
        value = {"time": s.duration_sec, "peak_mem": s.peak_mem_mb if s.peak_mem_mb is not None else s.peak_rss_mb,
                 "rise": s.peak_rise_mb, "growth": s.memory_growth_mb, "cpu": s.mean_cpu_percent, "gpu_mem": s.peak_gpu_mem_mb}[metric]
        return known(value)   # its summary's types were checked as it was read


@dataclass(frozen=True)
class NotebookCosts:
    path: str
    code_cells: int
    cells: list[CellCost]
    notes: list[str]            # what could not be read, a sentence each


def _text(value) -> str:
    """nbformat's multiline text (a string, or a list of them)."""
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return value if isinstance(value, str) else ""


def read_notebook(path: str | Path) -> NotebookCosts:
    """The records in the notebook at ``path``; NotebookError for a file
    that is no notebook (unreadable, not JSON, not nbformat 4)."""
    name = str(path)
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise NotebookError(f"{name}: cannot be read ({err.strerror or err})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise NotebookError(f"{name}: not a notebook (not JSON: {err})") from None
    if not is_notebook(nb):
        raise NotebookError(f"{name}: not a notebook (JSON without nbformat 4's cells)")
    cells, notes, newer, damaged, code = [], [], set(), 0, 0
    for index, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        code += 1
        found = _records_in(cell.get("outputs"))
        notes += [_death_note(cell.get("execution_count"), index, data.get("death"))
                  for data in found if data.get("kind") == "postmortem"]
        data = next((data for data in reversed(found) if data.get("kind") != "postmortem"), None)
        if data is None:
            continue
        version = data.get("version")
        if isinstance(version, int) and version > RECORD_VERSION:
            newer.add(version)
        try:
            summary = ResourceSummary.from_dict(data.get("summary"))
        except ValueError:
            damaged += 1
            continue
        number = data.get("execution_count")
        cells.append(CellCost(index, cell.get("id") if isinstance(cell.get("id"), str) else None,
                              _MAGIC_LINE.sub("", _text(cell.get("source")), count=1),
                              number if isinstance(number, int) else cell.get("execution_count"),
                              _text(data.get("label")), str(data.get("status", "ok")), summary))
    if newer:
        notes.append(f"records of a newer nbmon (version {max(newer)}; this one writes {RECORD_VERSION}) "
                     "are read as far as this one understands them")
    if damaged:
        notes.append(f"{damaged} record(s) without a readable summary passed over")
    return NotebookCosts(name, code, cells, notes)


def _death_note(number, index: int, death) -> str:
    death = death if isinstance(death, dict) else {}
    cell = death.get("cell") if isinstance(death.get("cell"), dict) else {}
    where = f" in cell [{cell['number']}]" if cell.get("running") and isinstance(cell.get("number"), int) else ""
    shown = f"[{number}]" if isinstance(number, int) else str(index + 1)
    return (f"cell {shown} holds a post-mortem: an earlier kernel of this notebook died{where}: "
            f"{death.get('cause_text') or death.get('cause') or 'cause unknown'}")


def is_notebook(value) -> bool:
    return isinstance(value, dict) and value.get("nbformat") == 4 and isinstance(value.get("cells"), list)


def _records_in(outputs) -> list[dict]:
    """The data of nbmon's records among a cell's outputs, in order (a cell
    that ran ``%%resmon`` twice: its last is the cell's)."""
    found = []
    for output in outputs if isinstance(outputs, list) else ():
        data = output.get("data") if isinstance(output, dict) else None
        if isinstance(data, dict) and isinstance(data.get(RECORD_MIME), dict):
            found.append(data[RECORD_MIME])
    return found


# -- nbmon report NOTEBOOK ----------------------------------------------------------

def report_rows(costs: NotebookCosts, sort: str = "time", top: int | None = None) -> list[CellCost]:
    """The costliest cells first by ``sort`` (one of :data:`METRICS`' names)."""
    ranked = sorted(costs.cells, key=lambda c: -(c.figure(sort) or -math.inf))
    return ranked[:top] if top is not None else ranked


def totals(costs: NotebookCosts) -> dict:
    """The notebook's totals: summed time and growth, the highest peak."""
    def figures(metric):
        return [v for v in (c.figure(metric) for c in costs.cells) if v is not None]

    return {"code_cells": costs.code_cells, "cells_with_records": len(costs.cells),
            "time": sum(figures("time")), "growth": sum(figures("growth")),
            "peak_mem": max(figures("peak_mem"), default=None), "gpu_mem": max(figures("gpu_mem"), default=None)}


def _cell_name(cost: CellCost) -> str:
    return f"[{cost.execution_count}]" if cost.execution_count is not None else f"cell {cost.index + 1}"


def _named(cost: CellCost, width: int = 40) -> str:
    """The cell's prompt number and its title, shortened: "[3] train"."""
    title = cost.title if len(cost.title) <= width else cost.title[:width - 1] + "…"
    return f"{_cell_name(cost)} {title}"


def _report_parts(costs: NotebookCosts, sort: str, top: int | None) -> tuple[str, str, list[str], list[list[str]]]:
    """The report's first line, its table's title, header and rows."""
    t = totals(costs)
    head = (f"nbmon: {costs.path}: {t['cells_with_records']} of {t['code_cells']} code cells have records; "
            f"{fmt(t['time'], 's')} in all, peak {fmt(t['peak_mem'], 'MiB')}, {fmt(t['growth'], 'MiB', True)} grown")
    rows = [[_named(c), *(fmt(c.figure(m), u, m == "growth") for m, _, u in METRICS),
             "" if c.status == "ok" else c.status] for c in report_rows(costs, sort, top)]
    title = f"the costliest cells by {dict((m, t) for m, t, _ in METRICS)[sort]}"
    return head, title, ["cell: label or first line", *(t for _, t, _ in METRICS), "status"], rows


def report_text(costs: NotebookCosts, sort: str = "time", top: int | None = None) -> str:
    head, title, header, rows = _report_parts(costs, sort, top)
    return "\n".join([head, *costs.notes, "", grid_text(title, header, rows)])


def report_html(costs: NotebookCosts, sort: str = "time", top: int | None = None) -> str:
    """The report as a page's body (``nbmon report --html``)."""
    import html

    head, title, header, rows = _report_parts(costs, sort, top)
    lines = "".join(f"<p style='margin:2px 0'>{html.escape(line)}</p>" for line in (head, *costs.notes))
    return (f'<div class="nbmon-notebook-report" style="font:13px system-ui,sans-serif">{lines}'
            f"{grid_table(title, header, rows)}</div>")


def report_json(costs: NotebookCosts, sort: str = "time", top: int | None = None) -> dict:
    return _finite({"notebook": costs.path, "totals": totals(costs), "notes": costs.notes,
                    "cells": [{"index": c.index, "id": c.cell_id, "execution_count": c.execution_count,
                               "first_line": c.first_line, "label": c.label, "status": c.status,
                               **{m: c.figure(m) for m, _, _ in METRICS}, "summary": c.summary.to_dict()}
                              for c in report_rows(costs, sort, top)]})


# -- nbmon compare OLD NEW ----------------------------------------------------------

@dataclass(frozen=True)
class Change:
    old: CellCost
    new: CellCost

    def delta(self, metric: str) -> float | None:
        a, b = self.old.figure(metric), self.new.figure(metric)
        return None if a is None or b is None else b - a

    def ratio(self, metric: str) -> float | None:
        a, b = self.old.figure(metric), self.new.figure(metric)
        return None if a is None or b is None or a < PERCENT_FLOOR[metric] else b / a - 1.0

    @property
    def worst(self) -> float:
        """Its largest relative worsening in time or in its own peak (the
        order: a cell after a hungrier one sees the kernel's peak rise too)."""
        return max((r for r in (self.ratio("time"), self.ratio("rise")) if r is not None), default=-math.inf)


def match(old: NotebookCosts, new: NotebookCosts) -> tuple[list[Change], list[CellCost], list[CellCost]]:
    """Cells in both (by nbformat id, else by source), and those only in the
    old or only in the new one; the changes with the largest regression first."""
    by_id = {c.cell_id: c for c in old.cells if c.cell_id}
    by_source: dict[str, list[CellCost]] = {}
    for c in old.cells:
        by_source.setdefault(c.source.strip(), []).append(c)
    used, changes, added = set(), [], []
    for c in new.cells:
        was = by_id.get(c.cell_id) if c.cell_id else None
        if was is None or was.index in used:
            was = next((o for o in by_source.get(c.source.strip(), []) if o.index not in used), None)
        if was is None:
            added.append(c)
            continue
        used.add(was.index)
        changes.append(Change(was, c))
    changes.sort(key=lambda ch: -ch.worst)
    return changes, [c for c in old.cells if c.index not in used], added


_RULE = re.compile(r"^\s*(time|peak_mem|rise|growth|cpu|gpu_mem)\s*>\s*\+?(\d+(?:\.\d+)?)\s*(%?)\s*$")


def parse_rule(text: str) -> tuple[str, float, bool]:
    """``--fail-if`` text as (metric, threshold, percent): "peak_mem>+20%"
    (20 % more than the old run), "time>+0.5" (half a second more; MiB for
    memory). ValueError in one sentence."""
    found = _RULE.match(text)
    if found is None:
        raise ValueError(f"--fail-if {text!r}: expected METRIC>+N or METRIC>+N%, METRIC one of "
                         f"{', '.join(m for m, _, _ in METRICS)}")
    return found[1], float(found[2]), bool(found[3])


def broken(changes: list[Change], rules: list[tuple[str, float, bool]]) -> list[str]:
    """A sentence for each cell and rule it breaks."""
    out = []
    for change in changes:
        for metric, limit, percent in rules:
            got = change.ratio(metric) if percent else change.delta(metric)
            if got is not None and got > (limit / 100 if percent else limit):
                out.append(f"{_named(change.new)}: {metric} "
                           f"{_signed(change, metric)} breaks {metric}>+{limit:g}{'%' if percent else ''}")
    return out


def _signed(change: Change, metric: str) -> str:
    unit = dict((m, u) for m, _, u in METRICS)[metric]
    ratio = change.ratio(metric)
    return fmt(change.delta(metric), unit, True) + (f" ({round(100 * ratio) + 0:+d}%)" if ratio is not None else "")


def compare_text(old: NotebookCosts, new: NotebookCosts, top: int | None = None) -> str:
    changes, gone, added = match(old, new)
    shown = ("time", "peak_mem", "rise", "growth")
    rows = [[_named(ch.new),
             *(f"{fmt(ch.old.figure(m), u)} → {fmt(ch.new.figure(m), u)}  {_signed(ch, m)}"
               for m, _, u in METRICS if m in shown)] for ch in changes[:top]]
    header = ["cell: label or first line", *(t for m, t, _ in METRICS if m in shown)]
    lines = [f"nbmon: {old.path} → {new.path}: {len(changes)} cells in both, {len(gone)} only in the old, "
             f"{len(added)} only in the new", *old.notes, *new.notes, "",
             grid_text("the largest regressions first", header, rows)]
    return "\n".join(lines)


def compare_json(old: NotebookCosts, new: NotebookCosts) -> dict:
    changes, gone, added = match(old, new)
    return _finite({"old": old.path, "new": new.path,
                    "cells": [{"old_index": ch.old.index, "new_index": ch.new.index, "id": ch.new.cell_id,
                               "first_line": ch.new.first_line,
                               **{m: {"old": ch.old.figure(m), "new": ch.new.figure(m), "delta": ch.delta(m),
                                      "ratio": ch.ratio(m)} for m, _, _ in METRICS}} for ch in changes],
                    "only_old": [c.index for c in gone], "only_new": [c.index for c in added]})
