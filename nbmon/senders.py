"""Senders: CSV, JSON Lines, a callback -- where events (one dict per sample,
or scaffold's published stats) go.

A sender has ``publish(event, **kwargs)`` (the scaffold seed's interface)
and may have ``publish_many(events)``, ``flush()`` and ``close()``; a
monitor feeds it through :class:`nbmon.consumers.SampleForwarder`. File
senders write whole lines only: every batch goes to the file in one
``write``, and a write the disk cuts short is truncated back to the last
whole line before the error is raised, so a reader never sees half a line,
not even after the process is killed.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Mapping, Sequence

from . import files
from .values import known


class _LineFile:
    """Append-only file written in whole lines."""

    def __init__(self, path, overwrite: bool):
        self.path = os.fspath(path)
        self.fd = files.create(self.path, overwrite=overwrite, append=True)  # the user's umask applies
        self.size = 0
        self.lines = 0

    def write_lines(self, text: str, count: int) -> None:
        data = text.encode()
        done = 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])
        except OSError as err:
            if done:  # never leave half a line behind
                os.ftruncate(self.fd, self.size)
            raise OSError(err.errno, f"cannot write to {self.path}: {err.strerror}") from None
        self.size += len(data)
        self.lines += count

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _FileSender:
    """A sender writing whole lines to a file it creates; subclasses turn
    events into lines (``_lines``)."""

    def __init__(self, path, overwrite: bool):
        self._file = _LineFile(path, overwrite)

    @property
    def path(self) -> str:
        return self._file.path

    @property
    def lines_written(self) -> int:
        return self._file.lines

    def publish(self, event: Mapping, **kwargs) -> None:
        self.publish_many([event])

    def publish_many(self, events: Sequence[Mapping]) -> None:
        if events:
            lines = self._lines(events)
            self._file.write_lines("".join(line + "\n" for line in lines), len(lines))

    def _lines(self, events: Sequence[Mapping]) -> list[str]:
        raise NotImplementedError

    def flush(self) -> None:
        """Lines are written straight through: nothing is buffered."""

    def close(self) -> None:
        self._file.close()


class CSVSender(_FileSender):
    """Writes each event as a CSV row; the header comes from the first event
    (or ``columns``). Unknown values are empty cells."""

    def __init__(self, path, *, columns: Sequence[str] | None = None, overwrite: bool = False):
        super().__init__(path, overwrite)
        self.columns = list(columns) if columns else None
        self._header_done = False

    def _lines(self, events: Sequence[Mapping]) -> list[str]:
        events = [_flat(e) for e in events]
        if self.columns is None:
            self.columns = list(events[0])
        lines = [] if self._header_done else [",".join(_csv_cell(c) for c in self.columns)]
        lines += [",".join(_csv_value(event.get(c)) for c in self.columns) for event in events]
        return lines

    def publish_many(self, events: Sequence[Mapping]) -> None:
        super().publish_many(events)
        self._header_done = self._header_done or bool(events)


def _flat(event: Mapping, prefix: str = "") -> dict:
    """A nested event's values under dotted names (scaffold's
    ``"network": {"sent": ...}`` is the column ``network.sent``)."""
    out = {}
    for key, value in event.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _csv_cell(text: str) -> str:
    text = str(text)
    if any(ch in text for ch in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _csv_value(v) -> str:
    if isinstance(v, str):
        return _csv_cell(v)
    n = known(v)
    return "" if n is None else repr(n)


class JSONLinesSender(_FileSender):
    """Writes each event as one JSON object per line; NaN becomes null."""

    def __init__(self, path, *, overwrite: bool = False):
        super().__init__(path, overwrite)

    def _lines(self, events: Sequence[Mapping]) -> list[str]:
        return [json.dumps(_json_ready(e), allow_nan=False) for e in events]


def _json_ready(value):
    """Text as is, nested events nested, every number finite or null."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return {k: _json_ready(v) for k, v in value.items()}
    return known(value)


class CallbackSender:
    """Calls ``callback(event)`` for each event."""

    def __init__(self, callback: Callable[[dict], object]):
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        self.callback = callback

    def publish(self, event: Mapping, **kwargs) -> None:
        self.callback(dict(event))
