"""Unknown values: NaN inside nbmon (sources, store, frames), None at the
edges that cannot carry NaN (dataclass fields, JSON, traitlets)."""
from __future__ import annotations

import math

NAN = math.nan
MIB = 1024.0 * 1024.0   # bytes in a MiB: every _mb figure


def known(value) -> float | None:
    """``value`` as a float, or None when it is None, NaN or infinite."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def reading(value) -> float:
    """A reading from code nbmon does not own: a finite, non-negative plain
    number as a float, anything else NaN. Text is refused, not parsed
    (``float("12")`` would pass a malformed payload off as a number)."""
    if isinstance(value, (bool, str, bytes)):
        return NAN
    try:
        value = float(value)
    except (TypeError, ValueError):
        return NAN
    return value if math.isfinite(value) and value >= 0 else NAN
