"""Senders: CSV, JSON Lines, a callback -- where events (one dict per sample,
or scaffold's published stats) go -- and :data:`SINKS`, the one table of
the files nbmon writes for the user, from which ``nbmon run``'s flags,
``%resmon``'s and ``nbmon.monitor()``'s keywords come.

A sender has ``publish(event, **kwargs)`` (the scaffold seed's interface)
and may have ``publish_many(events)``, ``flush()`` and ``close()``; a
monitor feeds it through :class:`nbmon.sinks.consumers.SampleForwarder`. File
senders write whole lines only: every batch goes to the file in one
``write``, and a write the disk cuts short is truncated back to the last
whole line before the error is raised, so a reader never sees half a line,
not even after the process is killed.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from . import files
from ..options import CLI, MAGIC
from ..values import known

if TYPE_CHECKING:
    from ..report.summary import ResourceSummary


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


# -- the sinks: files nbmon writes for the user, one table ---------------------------------

MONITOR = "nbmon.monitor()"   # the third front end: its keywords (csv="kernel.csv")
FORCE_HINT = "add --force to replace it"   # how the flag front ends replace a file (arguments())


@dataclass(frozen=True, slots=True)
class Ended:
    """What a report is written from, once its run has ended: the run's
    summary and monitor, a title, and ``page(monitor, path, title=,
    overwrite=)``, the offline page writer (pages are drawn by the notebook
    layer, which the front end imports)."""

    summary: "ResourceSummary"
    monitor: object
    title: str
    page: Callable | None = None


def _summary_json(path: str, ended: Ended, overwrite: bool) -> None:
    files.write_text(path, json.dumps(ended.summary.to_dict(), indent=2) + "\n", overwrite=overwrite)


def _html_page(path: str, ended: Ended, overwrite: bool) -> None:
    ended.page(ended.monitor, path, title=ended.title, overwrite=overwrite)


@dataclass(frozen=True, slots=True)
class Sink:
    """One kind of file nbmon writes for the user. ``name`` is its flag
    (``--csv``, ``--summary-json``) and keyword (``nbmon.monitor(csv=...)``).
    A stream gets every sample as it is taken: ``open(path, overwrite=)``
    makes its sender. A report is written once, when the run has ended:
    ``write(path, ended, overwrite)``, so only ``nbmon run``, which knows
    the run's end, offers reports. Neither writes through a link planted at
    the path, nor replaces a file unless told (:mod:`nbmon.sinks.files`).
    ``offered``: the front ends that have it."""

    name: str
    help: str
    open: Callable | None = None
    write: Callable[[str, Ended, bool], None] | None = None
    offered: tuple[str, ...] = (CLI, MAGIC, MONITOR)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SINKS: dict[str, Sink] = {sink.name: sink for sink in (
    Sink("csv", "stream every sample to this CSV file as it is taken", open=CSVSender),
    Sink("jsonl", "stream every sample to this JSON Lines file as it is taken", open=JSONLinesSender),
    Sink("summary_json", "write ResourceSummary.to_dict() here when the run has ended", write=_summary_json,
         offered=(CLI,)),
    Sink("html", "write a self-contained, offline HTML timeline here when the run has ended", write=_html_page,
         offered=(CLI,)),
)}


def sinks(front_end: str) -> list[Sink]:
    """The sinks ``front_end`` offers, in table order."""
    return [s for s in SINKS.values() if front_end in s.offered]


def arguments(front_end: str) -> list[tuple[tuple[str, ...], dict]]:
    """The ``add_argument(*args, **kwargs)`` calls (argparse's; IPython's
    ``magic_arguments.argument`` takes the same) of the sinks ``front_end``
    offers (``--csv PATH``, ...), and ``--force``."""
    calls = [((sink.flag,), {"dest": sink.name, "metavar": "PATH", "help": sink.help}) for sink in sinks(front_end)]
    calls.append((("--force",), {"action": "store_true", "help": "replace output files that already exist"}))
    return calls


def outputs_given(parsed, front_end: str) -> dict[str, str]:
    """{sink name: path} of the sink flags given in ``parsed`` (made from :func:`arguments`)."""
    return {sink.name: path for sink in sinks(front_end) if (path := getattr(parsed, sink.name, None)) is not None}


def check_outputs(outputs: Mapping[str, str], overwrite: bool, replace_hint: str) -> None:
    """Refuse, in one sentence (ValueError), outputs that cannot be written:
    two in one file, a directory, an existing file without ``overwrite``
    (``replace_hint`` says how to give it), a missing directory, one that
    cannot be replaced or written. Nothing is left behind."""
    paths = [os.path.abspath(p) for p in outputs.values()]
    if len(set(paths)) < len(paths):  # two writers would interleave in one file
        raise ValueError(f"each output needs its own file: {', '.join(map(repr, outputs.values()))}")
    for path in outputs.values():
        _check_output(path, overwrite, replace_hint)


def _check_output(path: str, overwrite: bool, replace_hint: str) -> None:
    """An existing name is never opened (a link planted there may point
    anywhere, at a FIFO even): replacing removes the name (nbmon.sinks.files), so
    what counts is that a new file can be made beside it and the name removed."""
    if os.path.isdir(path) and not os.path.islink(path):
        raise ValueError(f"output path {path!r} is a directory")
    existed = os.path.lexists(path)
    if existed and not overwrite:
        raise ValueError(f"output file {path!r} already exists ({replace_hint})")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"cannot write {path!r}: directory {parent!r} does not exist")
    if existed and not _may_remove(path, parent):
        raise ValueError(f"cannot replace {path!r}: it belongs to another user, in a directory where "
                         f"only a file's owner may remove it")
    # os.access() says yes to root even for /proc or a read-only mount, and a
    # report is only written once the run has ended: try for real, leave nothing behind.
    try:
        fd, probe = tempfile.mkstemp(prefix=".nbmon-", dir=parent)
    except OSError as err:
        raise ValueError(f"cannot write {path!r}: {err.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def _may_remove(path: str, parent: str) -> bool:
    """Whether this process may unlink ``path``: in a sticky directory (/tmp)
    only the file's or the directory's owner may (or root)."""
    st, dir_st = os.lstat(path), os.stat(parent)
    euid = os.geteuid()
    return not dir_st.st_mode & stat.S_ISVTX or euid in (0, st.st_uid, dir_st.st_uid)


def open_stream(name: str, path: str, overwrite: bool):
    """The sender of stream ``name`` writing to ``path``; ValueError in one
    sentence when the file cannot be made."""
    try:
        return SINKS[name].open(path, overwrite=overwrite)
    except OSError as err:
        raise ValueError(f"cannot write {path!r}: {err.strerror or err}") from None


def open_streams(outputs: Mapping[str, str], overwrite: bool, replace_hint: str) -> list:
    """The senders of the streams ``outputs`` names ({sink name: path}),
    checked first (:func:`check_outputs`); on any refusal (ValueError, one
    sentence) none is left open and no file made."""
    check_outputs(outputs, overwrite, replace_hint)
    new = {path for path in outputs.values() if not os.path.lexists(path)}
    opened = []
    try:
        for name, path in outputs.items():
            opened.append(open_stream(name, path, overwrite))
    except BaseException:
        for sender in opened:
            sender.close()
            if sender.path in new:
                os.unlink(sender.path)
        raise
    return opened
