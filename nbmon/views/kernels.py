"""``%resmon kernels``: every Jupyter kernel of this user on this host
(:mod:`nbmon.overview`) as a live table in the notebook, made where the
session runs (its helper, or the kernel).

What is displayed is a static record: the table as text/html (and
text/plain) that every viewer shows and a saved notebook keeps, carrying
the widget's id. The widget (js/kernels.js) is never displayed: its front
end mounts a live copy of the table into that record and keeps it current.
The table is read again every :data:`REFRESH_S` seconds while a page shows
it (the page says so every few seconds, ``nbmon:seen``; a closed or hidden
page stops the reads within :data:`SEEN_LEASE_S`), and sent one way, as the
widget's state; the record is re-sent every :data:`RECORD_EVERY_S` seconds.

Each row's buttons interrupt or shut down its kernel (a shutdown asks for a
second click in the page): the page names the row (pid and start time), and
only a kernel of the last table read, the same process, is acted on
(:func:`nbmon.overview.control.act`); what was done comes back as a line.
"""
from __future__ import annotations

import html
import os
import threading
import time
import uuid

import anywidget
import traitlets

from ..format import fmt, one_line, printable
from ..values import NAN
from ..overview import COLUMNS, Kernels, KernelsTable, row_cells, table_text, total_text
from ..overview.control import act
from . import frontend

REFRESH_S = 2.0
SEEN_LEASE_S = 15.0    # reads go on this long after the page last said it shows the table
RECORD_EVERY_S = 30.0
THREAD_NAME = "nbmon-kernels"
HIDDEN_UNKNOWN = ("PEAK 1M", "LIMIT", "GPU MEM", "GPU")   # no column of dashes: no watched kernel, limit or GPU
BAR_COLUMN = "MEMORY"   # its cells carry a bar of the row's ``share`` of the memory limit


class KernelsWidget(anywidget.AnyWidget):
    """The live table's model: ``table`` (rows as text, each with the pid,
    start time and whether it is this notebook's kernel) and ``_nbmon``
    (the record's id, the refresh period)."""

    _esm = frontend.module("kernels.js")
    _nbmon = traitlets.Dict().tag(sync=True)
    table = traitlets.Dict().tag(sync=True)


def _name(row: dict) -> str:
    """A kernel's notebook by its file's name (the whole path shows on hover), else its kernel id."""
    notebook = printable(one_line(row["notebook"]))
    return os.path.basename(notebook) or notebook or f"kernel {row['kernel_id']}"


def _rows_state(table: KernelsTable) -> dict:
    """The table as the front end shows it: the text of each cell, made here
    (the notebook's apart: ``name``, and ``path`` for its hover); a column of
    :data:`HIDDEN_UNKNOWN` that no row knows is left out."""
    limit = table.limit_mb
    rows = [(row, row_cells(row)) for row in table.sorted_by("memory")]
    unknown = fmt(NAN, "")
    shown = [k for k, (name, _, _) in enumerate(COLUMNS)
             if k > 0 and (name not in HIDDEN_UNKNOWN or any(cells[k] != unknown for _, cells in rows))]
    columns = [COLUMNS[k][0] for k in [0, *shown]]
    return {"columns": columns, "numbers": [COLUMNS[k][2] for k in [0, *shown]], "bar": columns.index(BAR_COLUMN),
            "rows": [{"cells": [cells[k] for k in shown], "name": _name(row),
                      "path": printable(one_line(row["notebook"])), "pid": row["pid"], "started": row["started"],
                      "this": bool(row["this"]), "busy": row["state"] == "busy",
                      "share": row["proc_pss_mb"] / limit if limit == limit and row["proc_pss_mb"] == row["proc_pss_mb"]
                      else None}
                     for row, cells in rows],
            "total": total_text(table), "as_of": time.strftime("%H:%M:%S")}


def record_bundle(table: KernelsTable, live_id: str) -> dict:
    """The static record: the table as HTML (``data-nbmon-kernels`` names
    the widget that mounts into it) and as text."""
    state = _rows_state(table)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in state["columns"])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in [row["name"], *row["cells"]]) + "</tr>"
                   for row in state["rows"])
    caption = f"nbmon · your Jupyter kernels on this host, as of {state['as_of']}"
    page = (f'<div class="nbmon-kernels-record" data-nbmon-kernels="{live_id}">'
            f'<div class="nbmon-kernels-static" style="font:12px system-ui,sans-serif">'
            f"<div><b>{html.escape(caption)}</b></div>"
            f'<table style="border-collapse:collapse"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            f"<div>{html.escape(state['total'])}</div></div></div>")
    return {"data": {"text/html": page, "text/plain": f"{caption}\n{table_text(table)}"}, "metadata": {}}


class KernelsView:
    """The live table of one ``%resmon kernels``: made with its first read,
    :meth:`start` makes the widget and starts the reads; ``update`` (a
    display's, by the record's id) re-sends the record."""

    def __init__(self, kernel_pid: int, update=None):
        self.kernels = Kernels(this_pid=kernel_pid)
        self.live_id = uuid.uuid4().hex
        self.table = self.kernels.refresh()
        self.update = update
        self.widget: KernelsWidget | None = None
        self.said: list[str] = []   # what the buttons did, newest last (the tests read it)
        self._seen_at = time.monotonic()   # the first reads need no word from a page
        self._stop = threading.Event()
        self._lock = threading.Lock()   # one read at a time: the thread's and a button's
        self._thread: threading.Thread | None = None

    def record(self) -> dict:
        return record_bundle(self.table, self.live_id)

    def start(self) -> None:
        self.widget = KernelsWidget(_nbmon={"id": self.live_id, "refresh_s": REFRESH_S},
                                    table=_rows_state(self.table))
        self.widget.on_msg(self._from_page)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._lock:
            self.table = self.kernels.refresh()
            self.widget.table = _rows_state(self.table)

    def _run(self) -> None:
        recorded = time.monotonic()
        while not self._stop.wait(REFRESH_S):
            if time.monotonic() - self._seen_at > SEEN_LEASE_S:
                continue
            try:
                self._read()
                if self.update is not None and time.monotonic() - recorded >= RECORD_EVERY_S:
                    recorded = time.monotonic()
                    self.update(self.record())
            except Exception:  # noqa: BLE001 - a read that failed is tried again at the next
                continue

    def _from_page(self, _widget, content, _buffers) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "nbmon:seen":
            self._seen_at = time.monotonic()
        elif content.get("type") == "nbmon:act":
            threading.Thread(target=self._act, args=(content.get("pid"), content.get("started"),
                                                      content.get("action")), daemon=True).start()

    def _act(self, pid, started, action) -> None:
        """A button's action, on a thread of its own: a server's answer may take seconds."""
        row = next((r for r in self.table.rows if r["pid"] == pid and r["started"] == started), None)
        try:
            text = act(row, action) if row is not None else \
                "nbmon: that kernel is not in the table any more; nothing was done."
        except Exception as err:  # noqa: BLE001 - said in the page, in one line
            text = f"nbmon: {action} failed: {err}"
        self.said.append(text)
        del self.said[:-16]
        self.widget.send({"type": "nbmon:said", "text": text})
        time.sleep(0.5)   # the kernel's end, seen in the next read
        try:
            self._read()
        except Exception:  # noqa: BLE001 - the thread reads again
            pass

    def close(self) -> None:
        self._stop.set()
        if self.widget is not None:
            self.widget.close()
        with self._lock:
            self.kernels.close()
