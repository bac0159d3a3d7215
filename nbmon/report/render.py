"""Static output for humans: a summary table and a timeline picture. Numbers
become text through :mod:`nbmon.format` only.

A saved notebook is read by viewers that trust it (JupyterLab, nbconvert)
and by viewers that do not (an untrusted JupyterLab or Notebook 7, nbconvert
``--sanitize-html``, GitHub), which strip styles, SVG and data-URI images and
keep only a few elements. So the table uses only elements every one of them
keeps (``div``, ``b``, ``table``, ``tr``, ``td``: nbconvert's sanitizer
escapes ``th``, GitHub's drops ``span``, classes and styles) and reads without
its styles, which are cosmetic; the timeline is a PNG (:func:`png_strips`),
its own ``image/png`` output that every viewer shows, and its legend (what
each strip is, its scale, the time span) stays in the table as text.
"""
from __future__ import annotations

import base64
import html
import struct
import zlib

from ..format import one_line

# Cosmetic only (a viewer may strip them; the table reads the same): compact
# cells, labels left (JupyterLab right-aligns every cell for DataFrames).
_LABEL = 'align="left" style="text-align:left;padding:1px 12px 1px 0;background:transparent"'
_VALUE = 'align="right" style="text-align:right;padding:1px 0;background:transparent"'
_GRID = 'align="right" style="text-align:right;padding:1px 0 1px 12px;background:transparent"'


def html_table(title: str, rows: list[tuple[str, str]], *, status: str = "ok", extra: str = "",
               folded: bool = False) -> str:
    """A two-column table under a bold title; ``status`` other than 'ok'
    colours its left border red (the title says the status in words).
    ``folded``: the table is one click away under the title, in a
    ``<details>`` (which nbconvert's ``--sanitize-html`` alone of the
    viewers shows as text: a record with much to say is never folded)."""
    color = "#2a7d2a" if status == "ok" else "#c0392b"
    body = "".join(f"<tr><td {_LABEL}>{html.escape(k)}</td><td {_VALUE}>{html.escape(v)}</td></tr>"
                   for k, v in rows)
    table = f'<table style="border-collapse:collapse;margin:2px 0 0">{body}</table>{extra}'
    if folded:
        inner = f"<details><summary>{html.escape(title)}</summary>{table}</details>"
    else:
        inner = f"<div><b>{html.escape(title)}</b></div>{table}"
    padding = "1px 10px" if folded else "4px 10px"   # a line: no taller than its text
    return (f'<div class="nbmon-summary" data-status="{html.escape(status)}" '
            f'style="display:inline-block;border-left:3px solid {color};padding:{padding};'
            f'font:12px/1.4 system-ui,sans-serif">{inner}</div>')


def grid_table(title: str, header: list[str], rows: list[list[str]], *, cls: str = "nbmon-grid") -> str:
    """A table of text under a bold title, a column per ``header`` entry
    (bold cells: sanitizers escape ``th``), a row per entry of ``rows``;
    the first column's cells are labels, the others values."""
    def cells(values, bold: bool = False) -> str:
        b, end = ("<b>", "</b>") if bold else ("", "")
        return "".join(f"<td {_LABEL if k == 0 else _GRID}>{b}{html.escape(v)}{end}</td>"
                       for k, v in enumerate(values))

    body = "".join(f"<tr>{cells(r)}</tr>" for r in rows)
    return (f'<div class="{html.escape(cls)}" style="display:inline-block;border-left:3px solid #2a7d2a;'
            f'padding:4px 10px;font:12px/1.4 system-ui,sans-serif">'
            f"<div><b>{html.escape(title)}</b></div>"
            f'<table style="border-collapse:collapse;margin:2px 0 0"><tr>{cells(header, True)}</tr>{body}</table></div>')


def grid_text(title: str, header: list[str], rows: list[list[str]]) -> str:
    """:func:`grid_table` as plain text: the title, then the columns aligned
    (the first left, the others right), every field on one line."""
    lines = [[one_line(c) for c in line] for line in (header, *rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join([one_line(title)] + ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                           for i, (c, w) in enumerate(zip(line, widths))) for line in lines])


class Output:
    """One notebook output from a ready mimebundle: ``display(Output(...))``
    and a display handle's ``update`` take it as is."""

    def __init__(self, data: dict, metadata: dict | None = None):
        self.data, self.metadata = data, metadata or {}

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.data, self.metadata


def text_table(title: str, rows: list[tuple[str, str]]) -> str:
    """The same table as plain text (a terminal, text/plain), columns
    aligned; every field on one line (:func:`~nbmon.format.one_line`)."""
    rows = [(one_line(k), one_line(v)) for k, v in rows]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([one_line(title), *(f"  {k:<{width}}  {v}" for k, v in rows)])


def png_strips(t, strips, *, width: int = 360, strip_px: int = 24, gap_px: int = 6, scale: int = 2) -> bytes:
    """A PNG of one strip per series, stacked, on a transparent background.

    ``strips`` is a sequence of ``(values, top, color)``: each series is drawn
    from 0 (the strip's bottom) to ``top`` (its top; larger values are
    clipped there), as ``#rrggbb`` ``color``, against ``t`` (seconds, sorted).
    Every pixel column shows the lowest and highest value of the samples it
    holds, so a one-sample spike stays in the picture; neighbouring columns
    are joined, and NaN is a gap. ``scale`` pixels per CSS pixel: the output's
    metadata should give the CSS size (``width`` by the strips' height).
    """
    import numpy as np   # here: a kernel that only shows tables never imports it

    t = np.asarray(t, dtype=np.float64)
    w, h, gap = width * scale, strip_px * scale, gap_px * scale
    palette = [(0, 0, 0, 0), (128, 128, 128, 150)]   # transparent, frame
    image = np.zeros((max(1, len(strips)) * (h + gap) - gap, w), dtype=np.uint8)
    for k, (values, top, color) in enumerate(strips):
        rgb = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
        line, fill = len(palette), len(palette) + 1
        palette += [(*rgb, 255), (*rgb, 60)]
        strip = image[k * (h + gap):k * (h + gap) + h]
        strip[[0, -1], :] = 1
        strip[:, [0, -1]] = 1
        _draw_series(strip, t, np.asarray(values, dtype=np.float64), float(top), line, fill, scale)
    raw = np.zeros((image.shape[0], image.shape[1] + 1), dtype=np.uint8)   # filter byte 0 (none) before each row
    raw[:, 1:] = image
    return _png(raw.tobytes(), image.shape[1], image.shape[0], palette)


def _draw_series(strip, t, v, top: float, line: int, fill: int, thick: int) -> None:
    import numpy as np

    h, w = strip.shape
    ok = np.isfinite(v) & np.isfinite(t)
    if t.size < 2 or not ok.any() or not top > 0:
        return
    span = (t[-1] - t[0]) or 1.0
    cols = np.clip(((t[ok] - t[0]) / span * (w - 1)).astype(np.int64), 0, w - 1)
    v = v[ok]
    starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])
    present = cols[starts]
    lo, hi = np.minimum.reduceat(v, starts), np.maximum.reduceat(v, starts)
    last = v[np.r_[starts[1:], v.size] - 1]
    inner = h - 2 - 2 * thick   # the line's thickness stays inside the frame

    def row(x):
        return (h - 2 - thick - np.round(np.clip(x / top, 0.0, 1.0) * inner)).astype(np.int64)

    every = np.arange(present[0], present[-1] + 1)
    level = row(np.interp(every, present, last))          # the line between samples
    low, high = level.copy(), level.copy()                # rows: high is nearer the top
    at = present - present[0]
    high[at], low[at] = np.minimum(high[at], row(hi)), np.maximum(low[at], row(lo))
    high[1:], low[1:] = np.minimum(high[1:], level[:-1]), np.maximum(low[1:], level[:-1])  # joined
    rows = np.arange(h)[:, None]
    area = strip[:, present[0]:present[-1] + 1]   # a view
    area[rows > low[None, :] + thick // 2] = fill
    area[(rows >= high[None, :] - thick // 2) & (rows <= low[None, :] + thick // 2)] = line
    area[[0, -1], :] = 1


def _png(raw: bytes, w: int, h: int, palette) -> bytes:
    """An 8-bit palette PNG (with transparency) of ``raw``: ``h`` rows of a
    filter byte and ``w`` palette indices."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
            + chunk(b"PLTE", bytes(c for p in palette for c in p[:3]))
            + chunk(b"tRNS", bytes(p[3] for p in palette))
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


BLANK_PNG = _png(b"\0\0", 1, 1, [(0, 0, 0, 0)])   # one transparent pixel


def png_img(png: bytes, width: int, height: int) -> str:
    """``png`` as an inline ``<img>`` (for pages nbmon writes itself, not notebook outputs)."""
    data = base64.b64encode(png).decode("ascii")
    return (f'<img class="nbmon-timeline" alt="nbmon timeline" width="{width}" height="{height}" '
            f'style="display:block;margin-top:4px" src="data:image/png;base64,{data}">')
