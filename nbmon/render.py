"""Static HTML for humans: a summary table and an SVG timeline. Pure and
dependency-free, so saved notebooks and HTML exports show it as is; numbers
become text through :mod:`nbmon.format` only.
"""
from __future__ import annotations

import html

from .format import fmt, is_unknown


# JupyterLab's theme variables, with light fallbacks for pages that have none
# (GitHub, nbconvert's classic template, VS Code): readable in either theme.
FG = "var(--jp-ui-font-color1, #222)"
MUTED = "var(--jp-ui-font-color2, #555)"
BORDER = "var(--jp-border-color2, #ddd)"
PANEL = "var(--jp-layout-color1, transparent)"


def html_table(title: str, rows: list[tuple[str, str]], *, status: str = "ok", extra: str = "") -> str:
    """A compact two-column table; red border when ``status`` is not 'ok'."""
    color = "#2a7d2a" if status == "ok" else "#c0392b"
    body = "".join(
        f'<tr style="background:transparent"><th style="text-align:left;padding:1px 10px 1px 0;'
        f'font-weight:normal;color:{MUTED};background:transparent">'
        f'{html.escape(k)}</th><td style="text-align:right;padding:1px 0;color:{FG};background:transparent">'
        f'{html.escape(v)}</td></tr>'
        for k, v in rows)
    return (f'<div class="nbmon-summary" data-status="{html.escape(status)}" '
            f'style="display:inline-block;border-left:3px solid {color};padding:4px 10px;color:{FG};'
            f'font:12px/1.4 system-ui,sans-serif">'
            f'<div style="font-weight:600;margin-bottom:2px">{html.escape(title)}</div>'
            f'<table style="border-collapse:collapse;background:transparent">{body}</table>{extra}</div>')


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def svg_timeline(t, series: dict, *, width: int = 360, height: int = 84, max_points: int = 300) -> str:
    """Small static line chart: one normalised line per series, a time scale,
    and a legend with each series' peak.

    ``series`` is ``{name: (values, unit)}`` or ``{name: (values, unit, peak)}``
    with a catalog unit ("%", "MiB", ...; see :func:`nbmon.format.fmt`); the
    legend shows ``peak`` when given (a summary's figure: the exact peak RSS
    can exceed every sample) and the largest value otherwise. ``t`` (seconds)
    and each value array are sequences of floats of equal length; each series
    is drawn on its own scale (0 to its peak) so that the shapes compare.
    """
    n = len(t)
    if n < 2:
        return ""
    step = max(1, -(-n // max_points))
    t0, t1 = float(t[0]), float(t[-1])
    span = (t1 - t0) or 1.0
    pad, plot_h = 2, height - 32
    lines, legend = [], []
    for k, (label, (values, unit, *given)) in enumerate(series.items()):
        fmt(None, unit)  # refuses a unit that is not the catalog's, with data or without
        finite = [float(v) for v in values if not is_unknown(v)]
        if not finite:
            continue
        peak = given[0] if given and not is_unknown(given[0]) else max(finite)
        top = max(peak, max(finite)) if peak > 0 else 1.0
        color = _COLORS[k % len(_COLORS)]
        pts = []
        for i in range(0, n, step):
            chunk = [float(v) for v in values[i:i + step] if not is_unknown(v)]
            if not chunk:
                continue
            x = pad + (float(t[i]) - t0) / span * (width - 2 * pad)
            y = pad + plot_h - max(chunk) / top * plot_h
            pts.append(f"{x:.1f},{y:.1f}")
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{" ".join(pts)}"/>')
        legend.append(f'<tspan fill="{color}">■</tspan> {html.escape(label)} peak {html.escape(fmt(peak, unit))}  ')
    # The time scale: start, middle and end, in seconds since the first sample.
    ticks = "".join(
        f'<text x="{x}" y="{plot_h + 2 * pad + 11}" text-anchor="{anchor}">{html.escape(fmt(s, "s"))}</text>'
        for x, anchor, s in ((pad, "start", 0.0), (width / 2, "middle", (t1 - t0) / 2),
                             (width - pad, "end", t1 - t0)))
    return (f'<svg class="nbmon-timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" style="display:block;margin-top:4px;'
            f'color:{FG}" font-size="10" font-family="system-ui,sans-serif">'
            # var() works in style properties only, not in SVG presentation attributes.
            f'<rect width="{width}" height="{plot_h + 2 * pad}" style="fill:{PANEL};stroke:{BORDER}"/>'
            + "".join(lines)
            + f'<g class="nbmon-timeline-scale" style="fill:{MUTED}">{ticks}</g>'
            + f'<text x="2" y="{height - 4}" style="fill:currentColor">' + "".join(legend) + "</text></svg>")
