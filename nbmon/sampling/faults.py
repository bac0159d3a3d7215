"""Failures of sources and consumers, counted rather than raised.

nbmon's background threads never print and never die of an exception: they
record it here. The caller's thread says each failing source once, as a
RuntimeWarning, when the run stops.
"""
from __future__ import annotations

import warnings

from ..format import printable


def source_name(source) -> str:
    return getattr(source, "name", None) or type(source).__name__


class Fault:
    """How often one source failed, and its first error in words."""

    __slots__ = ("source", "count", "first_error", "reported")

    def __init__(self, source: str, first_error: str):
        self.source = source
        self.count = 0
        self.first_error = first_error
        self.reported = False

    def __repr__(self) -> str:
        return f"Fault({self.source!r}, count={self.count}, first_error={self.first_error!r})"


class FaultLog(dict):
    """{source name: Fault}."""

    def record(self, source, err: BaseException | str) -> None:
        """Count one failure of ``source``: an exception, or a sentence."""
        name = source if isinstance(source, str) else source_name(source)
        fault = self.get(name)
        if fault is None:
            fault = self[name] = Fault(name, err if isinstance(err, str) else f"{type(err).__name__}: {err}")
        fault.count += 1

    def set_count(self, name: str, count: int, first_error: str) -> None:
        """Take over a count kept elsewhere (the helper process's)."""
        self.setdefault(name, Fault(name, first_error)).count = count

    def warn_unreported(self, stacklevel: int = 2) -> None:
        for fault in list(self.values()):
            if not fault.reported:
                fault.reported = True
                # The error's own words come from anywhere (a sender, a GPU driver, a path): no escapes.
                warnings.warn(printable(f"nbmon: {fault.source} failed {fault.count} time(s) in this run, "
                                        f"first: {fault.first_error}"), RuntimeWarning, stacklevel=stacklevel + 1)
