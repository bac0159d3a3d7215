"""``nbmon kernels`` (one table) and ``nbmon top`` (the table redrawn in
place until ``q``): every Jupyter kernel of this user on this host
(:mod:`nbmon.overview`).

``top`` draws with rich's live display (the optional extra ``nbmon[top]``):
a well-kept library that redraws in place, follows the terminal's size and
puts the screen back as it was, where hand-written escape codes would
not; what it draws is ``nbmon kernels``'s text, cut to the terminal's
width. Keys are read from the terminal in cbreak mode (no echo, no
Enter), restored on the way out.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import termios
import time
import tty

from .. import overview

REFRESH_S = 2.0
NO_RICH = "nbmon top needs rich to redraw in place: pip install 'nbmon[top]' (or nbmon kernels for one table)"


def kernels(sort: str, as_json: bool) -> int:
    table = overview.measure()
    if as_json:
        print(json.dumps(overview.as_json(table, sort)))
    else:
        print(overview.table_text(table, sort, width=_width()))
    return 0


def _width() -> int:
    return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else 200


def top(sort: str, once: bool, interval_s: float = REFRESH_S) -> int:
    if once or not sys.stdout.isatty():   # a pipe or a file: one table
        return kernels(sort, as_json=False)
    try:
        from rich.live import Live
    except ImportError:
        print(NO_RICH, file=sys.stderr)
        return 2
    watched = overview.Kernels()
    try:
        watched.refresh()   # the first table's CPU % is over its first half second
        time.sleep(overview.FIRST_INTERVAL_S)
        with _keys() as pressed, Live(auto_refresh=False, screen=True) as live:
            while True:
                live.update(_renderable(watched.refresh(), sort, live.console.width), refresh=True)
                key = pressed(interval_s)
                if key in ("q", "Q"):
                    return 0
                sort = {"m": "memory", "c": "cpu", "g": "gpu", "a": "age"}.get(key, sort)
    except KeyboardInterrupt:
        return 0
    finally:
        watched.close()


def _renderable(table: overview.KernelsTable, sort: str, width: int):
    """The table as ``nbmon kernels`` prints it, under a title, its heading
    bold: rich's own tables cost 9 ms a draw for 20 kernels, this 2."""
    from rich.text import Text

    title = f"nbmon top · every kernel of yours · sorted by {sort} (m c g a) · q quits"
    shown = Text(f"{title[:width]}\n\n{overview.table_text(table, sort, width)}", no_wrap=True, overflow="crop")
    shown.stylize("bold", 0, len(title))
    heading = len(title) + 2
    shown.stylize("bold", heading, shown.plain.index("\n", heading))
    return shown


@contextlib.contextmanager
def _keys():
    """A function that waits up to ``timeout`` s for a key and returns it ("" if none)."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None

    def pressed(timeout: float) -> str:
        if fd is None:
            select.select([], [], [], timeout)
            return ""
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 32).decode("utf-8", "replace")[-1:] if ready else ""

    try:
        if fd is not None:
            tty.setcbreak(fd)
        yield pressed
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
