"""Numbers with units, as text for humans: the one set of rules behind every
figure nbmon shows. nbmon/views/js/format.js is the same rules for the cell meter, and
tests/format_cases.json is the table of cases both are checked against, so
the live meter and the static record that replaces it always agree.

``fmt(value, unit, signed=False)``; ``unit`` is a catalog unit
(:data:`nbmon.catalog.UNIT_SUFFIX`): "%", "MiB", "s", "B", "B/s", "W",
"MHz", "°C", "CPUs", or "" for a count. Any other unit raises ValueError.

- Unknown (None, NaN, ±inf, bool, text, anything not a real number): "–".
- Magnitude: one decimal below 100, whole numbers from 100 on, decided
  after rounding (99.96 -> "100"); number and unit apart by one space.
- Rounding is half away from zero on the exact binary value of the float,
  which is what JavaScript's ``toFixed`` does (0.25 -> "0.3", 2.5 -> "3";
  Python's own ``format`` would give "0.2" and "2").
- "MiB", "B", "B/s": binary units (B, KiB, MiB, GiB, TiB, PiB, EiB; MiB
  starts at MiB), the next one once the rounded value reaches 1024:
  512 -> "512 MiB", 1023.96 -> "1.0 GiB", 1536 -> "1.5 GiB".
- "s": below 10 s two decimals ("0.25 s"), below 60 s one ("12.3 s"),
  then a clock rounded to whole seconds, "m:ss" ("1:15") and from one
  hour "h:mm:ss" ("1:02:05"; hours are not wrapped into days).
- "" and "CPUs" (counts): whole numbers without decimals ("12", "2 CPUs"),
  others by the magnitude rule ("0.5", "2.5 CPUs").
- "W", "MHz", "°C", "%": the magnitude rule ("250 W", "65.0 °C", "3.1 %";
  percentages are not capped: "250 %").
- Negatives keep their minus sign, signed or not ("-12.3 MiB", "-0.50 s");
  ``signed`` adds "+" to zero and positives ("+1.5 GiB", "+0.0 MiB"). A
  value that rounds to zero has no minus sign ("0.0 MiB", signed "+0.0 MiB").
"""
from __future__ import annotations

import math
import numbers
import re
from decimal import ROUND_HALF_UP, Decimal

from .catalog import UNIT_SUFFIX

MISSING = "\u2013"   # en dash: an unknown value
UNITS = tuple(UNIT_SUFFIX)

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_START = {"B": 0, "B/s": 0, "MiB": 2}
_COUNTS = ("", "CPUs")   # whole numbers without decimals
_EXACT = 2.0 ** 53   # from here on every float is a whole number
_PLACES = {0: Decimal(1), 1: Decimal("0.1"), 2: Decimal("0.01")}


def is_unknown(x) -> bool:
    """True for what shows as "–": None, NaN, ±inf, bools, text, and anything
    that is not a real number."""
    return _number(x) is None


def fmt(value, unit: str, signed: bool = False) -> str:
    """``value`` in ``unit`` as text for humans (see the module's rules)."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; expected one of {', '.join(map(repr, UNITS))}")
    x = _number(value)
    if x is None:
        return MISSING
    if unit == "s":
        text = _duration(abs(x))
    elif unit in _START:
        text = _binary(abs(x), _START[unit]) + ("/s" if unit == "B/s" else "")
    elif unit in _COUNTS and x.is_integer():
        text = _fixed(abs(x), 0) + ("" if unit == "" else " " + unit)
    else:
        text = _magnitude(abs(x)) + ("" if unit == "" else " " + unit)
    if _rounds_to_zero(text):
        return "+" + text if signed else text
    return ("-" if x < 0 else "+" if signed else "") + text


# -- the rules ---------------------------------------------------------------------

def _number(x) -> float | None:
    if isinstance(x, (bool, str, bytes)) or not isinstance(x, numbers.Real):
        return None   # numpy's bool_ is not a numbers.Real; its floats and ints are
    try:
        x = float(x)
    except (OverflowError, TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _fixed(x: float, places: int) -> str:
    """``x`` (>= 0) with ``places`` decimals, half away from zero on its exact
    value: JavaScript's ``x.toFixed(places)``, without its exponent form."""
    if x >= _EXACT:
        return str(int(x)) + ("." + "0" * places if places else "")
    return format(Decimal(x).quantize(_PLACES[places], rounding=ROUND_HALF_UP), "f")


def _magnitude(x: float) -> str:
    one = _fixed(x, 1)
    return one if float(one) < 100 else _fixed(x, 0)


def _binary(x: float, step: int) -> str:
    while step < len(_BINARY) - 1 and float(_fixed(x, 0)) >= 1024:
        x /= 1024
        step += 1
    return f"{_magnitude(x)} {_BINARY[step]}"


def _duration(x: float) -> str:
    two = _fixed(x, 2)
    if float(two) < 10:
        return two + " s"
    one = _fixed(x, 1)
    if float(one) < 60:
        return one + " s"
    total = int(_fixed(x, 0))
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def _rounds_to_zero(text: str) -> bool:
    # The text of a magnitude that rounded to zero has no digit but 0 ("0.00 s").
    head = text.split(" ", 1)[0]
    return set(head) <= {"0", ".", ":"}


# -- foreign text in a terminal (issue 17) ----------------------------------------------

# C0 and C1 controls but tab and newline (escape sequences, carriage return,
# backspace), and the bidirectional overrides that reorder what is shown.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text) -> str:
    """``text`` made safe to print to a terminal: every control character
    but tab and newline is shown as its Python escape (ESC as ``\\x1b``), so
    a host name or file name from elsewhere can neither send escape
    sequences to the terminal nor hide what it is."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))


_BREAK = re.compile("[\n\u2028\u2029]")   # what starts a new line (CR, NEL, VT, FF are controls above)


def one_line(text) -> str:
    """:func:`printable`, and a line break shown as its escape too: a field of
    a table, whose text (a session name, a host name) could otherwise start
    a row of its own."""
    return _BREAK.sub(lambda m: ascii(m.group())[1:-1], printable(text))
