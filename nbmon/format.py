"""Numbers with units, as text for humans: the one set of rules nbmon's
Python side uses (js/format.js is the front end's copy of the same rules).
"""
from __future__ import annotations

import math


def is_unknown(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_mib(mib) -> str:
    """512.0 -> '512 MiB', 1536.0 -> '1.50 GiB'."""
    if is_unknown(mib):
        return "–"
    sign = "-" if mib < 0 else ""
    mib = abs(mib)
    if mib >= 1024 * 1024:
        return f"{sign}{mib / 1024 / 1024:.2f} TiB"
    if mib >= 1024:
        return f"{sign}{mib / 1024:.2f} GiB"
    if mib >= 100:
        return f"{sign}{mib:.0f} MiB"
    return f"{sign}{mib:.1f} MiB"


def fmt_signed_mib(mib) -> str:
    text = fmt_mib(mib)
    return text if is_unknown(mib) or mib < 0 else "+" + text


def fmt_percent(p) -> str:
    return "–" if is_unknown(p) else f"{p:.1f} %"


def fmt_seconds(s) -> str:
    """0.25 -> '250 ms', 12.34 -> '12.3 s', 75 -> '1 min 15 s', 3725 -> '1 h 2 min'."""
    if is_unknown(s):
        return "–"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    minutes, sec = divmod(int(round(s)), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def fmt_plain(x, unit: str = "") -> str:
    if is_unknown(x):
        return "–"
    return f"{x:.0f}{unit}" if abs(x) >= 100 else f"{x:.1f}{unit}"
