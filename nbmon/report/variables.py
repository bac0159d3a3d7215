"""What holds the memory: the user's variables that a cell made, grew or
freed, and the largest ones the kernel holds, as plain data and as text.

The kernel sizes its namespace at a cell's end (:mod:`nbmon.kernel.namespace`)
and sends the result to the session's host, where it becomes part of the
cell's :class:`~nbmon.summary.ResourceSummary` (its record's rows, columns
of ``nbmon.history()``), and where the largest variables go into the black
box for the post-mortem of a kernel that dies in a later cell.

Every size is what the objects report (``nbytes``, a tensor's storage, a
DataFrame's blocks), in bytes; a buffer that several names reach (a view,
a DataFrame over an array) is counted once, for the name it is attributed
to. A size marked ``at_least`` left part of its object unsized (object
columns, a long list): it is a lower bound, never a guess.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..format import fmt

TOP = 8      # variables a report lists of each kind; the rest are counted
SHOWN = 4    # of those, the ones a row of text names


@dataclass(frozen=True, slots=True)
class Var:
    """One variable. ``nbytes``: what it holds (a view: the buffer it keeps
    alive); ``change``: how the memory attributed to it changed in the cell
    (a view of another name's array: 0); ``status``: 'new', 'replaced'
    (the name now holds another object: ``kind`` is its), 'grew', 'shrank',
    'deleted', or '' (as held); ``shares``: the names whose buffers it reaches (it is
    their view); ``device``: '' on the CPU, else a tensor's ('cuda:0')."""

    name: str
    kind: str
    nbytes: int
    change: int = 0
    status: str = ""
    shares: tuple[str, ...] = ()
    device: str = ""
    at_least: bool = False

    def text(self) -> str:
        """'df 5.8 GiB (DataFrame)', 'X 256 MiB (ndarray, view of data)',
        'big (ndarray, deleted: -763 MiB)'; no size where there is none
        (a name deleted, or replaced by a value not sized)."""
        change = f": {fmt(self.change, 'B', signed=True)}" if self.change else ""
        if self.status == "deleted":
            held = f"; {fmt(self.nbytes, 'B')} still held by {', '.join(self.shares)}" if self.shares else ""
            return f"{self.name} ({self.kind}, deleted{change}{held})"
        notes = [self.kind]
        if self.device:
            notes.append(self.device)
        if self.shares:
            notes.append(("view of " if self.kind in VIEWS and not self.change else "shares ") + ", ".join(self.shares))
        if self.status == "replaced":
            notes.append("replaced" + change)
        elif self.status in ("grew", "shrank"):
            notes.append(fmt(self.change, "B", signed=True))
        size = f" {chr(0x2265) + ' ' if self.at_least else ''}{fmt(self.nbytes, 'B')}" if self.nbytes else ""
        return f"{self.name}{size} ({', '.join(notes)})"

    def to_list(self) -> list:
        return [self.name, self.kind, self.nbytes, self.change, self.status, list(self.shares), self.device,
                self.at_least]

    @classmethod
    def from_list(cls, item) -> "Var":
        if not isinstance(item, (list, tuple)) or len(item) != 8:
            raise ValueError(f"a variable must be a list of 8 fields, got {item!r:.80}")
        name, kind, nbytes, change, status, shares, device, at_least = item
        if not (isinstance(name, str) and isinstance(kind, str) and isinstance(status, str)
                and isinstance(device, str) and isinstance(at_least, bool)
                and isinstance(shares, (list, tuple)) and all(isinstance(s, str) for s in shares)
                and _whole(nbytes) and _whole(change)):
            raise ValueError(f"a variable's fields are mistyped: {item!r:.80}")
        return cls(name, kind, nbytes, change, status, tuple(shares), device, at_least)


VIEWS = ("ndarray", "Tensor", "memoryview")   # kinds whose shared buffer makes them a view


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Variables:
    """The namespace at a cell's end. ``held``: bytes its sized variables
    hold, each buffer once; ``change``: since the last cell's end;
    ``count``: variables sized; ``unsized``: objects that could not be
    (an instance of a class nbmon does not know); ``grew`` / ``shrank``:
    the largest variables the cell made or grew / shrank or deleted, of
    ``grew_count`` / ``shrank_count``; ``largest``: the largest held."""

    held: int
    change: int
    count: int
    unsized: int
    grew: tuple[Var, ...] = ()
    shrank: tuple[Var, ...] = ()
    largest: tuple[Var, ...] = ()
    grew_count: int = 0
    shrank_count: int = 0

    def rows(self) -> list[tuple[str, str]]:
        """A record's rows: what grew, what shrank, what is held."""
        rows = []
        if self.grew:
            rows.append(("Variables grew", listed(self.grew, self.grew_count)))
        if self.shrank:
            rows.append(("Variables shrank", listed(self.shrank, self.shrank_count)))
        if self.count or self.unsized:
            rows.append(("Variables held", self.held_text()))
        return rows

    def held_text(self, when: str = "") -> str:
        """'6.1 GiB in 12 variables (+5.8 GiB); 40 objects not sized' (``when``
        after the count: ' as cell [13] ended')."""
        text = f"{fmt(self.held, 'B')} in {self.count} variable{'s' if self.count != 1 else ''}{when}"
        if self.change:
            text += f" ({fmt(self.change, 'B', signed=True)})"
        return text + (f"; {not_sized(self.unsized)}" if self.unsized else "")

    def to_dict(self) -> dict:
        return {"held": self.held, "change": self.change, "count": self.count, "unsized": self.unsized,
                "grew": [v.to_list() for v in self.grew], "shrank": [v.to_list() for v in self.shrank],
                "largest": [v.to_list() for v in self.largest],
                "grew_count": self.grew_count, "shrank_count": self.shrank_count}

    @classmethod
    def from_dict(cls, data) -> "Variables":
        """Inverse of :meth:`to_dict`; ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"variables must be a dict, got {data!r:.80}")
        numbers = {k: data.get(k, 0) for k in ("held", "change", "count", "unsized", "grew_count", "shrank_count")}
        bad = [k for k, v in numbers.items() if not _whole(v)]
        if bad:
            raise ValueError(f"variables: {', '.join(bad)} must be whole numbers")
        lists = {}
        for key in ("grew", "shrank", "largest"):
            items = data.get(key, [])
            if not isinstance(items, list):
                raise ValueError(f"variables: {key} must be a list, got {items!r:.80}")
            lists[key] = tuple(Var.from_list(item) for item in items)
        return cls(**numbers, **lists)

    def for_box(self, cell: int | None) -> dict:
        """What the black box keeps of it, compact (its room is small): the
        largest held as of ``cell``'s end, each [name, kind, bytes, device, at_least]."""
        return {"cell": cell, "held": self.held, "count": self.count, "unsized": self.unsized,
                "largest": [[v.name, v.kind, v.nbytes, v.device, v.at_least] for v in self.largest]}


def listed(items: tuple[Var, ...], count: int) -> str:
    """The first :data:`SHOWN` of ``items`` as text, and how many more there are of ``count``."""
    text = ", ".join(v.text() for v in items[:SHOWN])
    more = max(count, len(items)) - min(len(items), SHOWN)
    return text + (f", and {more} more" if more else "")


def not_sized(count: int) -> str:
    return f"{count} object{'s' if count != 1 else ''} not sized"


def held_before(box: dict) -> str:
    """The post-mortem's line from a black box's variables (:meth:`Variables.for_box`):
    'df 5.8 GiB (DataFrame), model 1.2 GiB (Linear, cuda:0); 7.0 GiB in 9 variables as cell [13] ended'.
    ValueError if ``box`` is not such a dict."""
    if not isinstance(box, dict) or not isinstance(box.get("largest"), list):
        raise ValueError(f"variables held must be a dict with a list of the largest, got {box!r:.80}")
    cell = box.get("cell")
    if cell is not None and not _whole(cell):
        raise ValueError(f"variables: cell must be a whole number, got {cell!r:.80}")
    largest = []
    for item in box["largest"]:
        if not isinstance(item, list) or len(item) != 5:
            raise ValueError(f"a variable held must be a list of 5 fields, got {item!r:.80}")
        name, kind, nbytes, device, at_least = item
        largest.append(Var.from_list([name, kind, nbytes, 0, "", [], device, at_least]))
    held = Variables.from_dict({k: box.get(k) for k in ("held", "count", "unsized")})
    when = f" as cell [{cell}] ended" if cell is not None else ""
    parts = [listed(tuple(largest), held.count)] if largest else []
    return "; ".join(parts + [held.held_text(when)])
