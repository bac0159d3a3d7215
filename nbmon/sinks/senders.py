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
from .. import catalog
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
    """One place nbmon sends samples or a report to: a file, or anything a
    ``target`` names (a URL). ``name`` is its flag (``--csv``,
    ``--summary-json``) and keyword (``nbmon.monitor(csv=...)``). A stream
    gets every sample as it is taken: ``open(target, overwrite=)`` makes its
    sender. A report is written once, when the run has ended: ``write(target,
    ended, overwrite)``, so only ``nbmon run``, which knows the run's end,
    offers reports. ``check(target, overwrite, replace_hint)`` refuses a
    target in one sentence (ValueError) before anything starts; without one
    the target is a file's path, checked as nbmon's own files are: never
    written through a link planted there, never replaced unless told
    (:mod:`nbmon.sinks.files`), and removed again when the run cannot start.
    ``offered``: the front ends that have it. A third party's sink is a
    ``Sink`` in the entry-point group ``nbmon.sinks``."""

    name: str
    help: str
    open: Callable | None = None
    write: Callable[[str, Ended, bool], None] | None = None
    offered: tuple[str, ...] = (CLI, MAGIC, MONITOR)
    target: str = "PATH"
    check: Callable[[str, bool, str], None] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def is_file(self) -> bool:
        return self.check is None


BUILT_IN: tuple[Sink, ...] = (
    Sink("csv", "stream every sample to this CSV file as it is taken", open=CSVSender),
    Sink("jsonl", "stream every sample to this JSON Lines file as it is taken", open=JSONLinesSender),
    Sink("summary_json", "write ResourceSummary.to_dict() here when the run has ended", write=_summary_json,
         offered=(CLI,)),
    Sink("html", "write a self-contained, offline HTML timeline here when the run has ended", write=_html_page,
         offered=(CLI,)),
)
SINKS: dict[str, Sink] = {sink.name: sink for sink in BUILT_IN}
SINKS.update((sink.name, sink) for sink in catalog.plugins(catalog.SINKS_GROUP)
             if isinstance(sink, Sink) and sink.name not in SINKS)


def sinks(front_end: str) -> list[Sink]:
    """The sinks ``front_end`` offers, in table order."""
    return [s for s in SINKS.values() if front_end in s.offered]


def arguments(front_end: str) -> list[tuple[tuple[str, ...], dict]]:
    """The ``add_argument(*args, **kwargs)`` calls (argparse's; IPython's
    ``magic_arguments.argument`` takes the same) of the sinks ``front_end``
    offers (``--csv PATH``, ...), and ``--force``."""
    calls = [((sink.flag,), {"dest": sink.name, "metavar": sink.target, "help": sink.help})
             for sink in sinks(front_end)]
    calls.append((("--force",), {"action": "store_true", "help": "replace output files that already exist"}))
    return calls


def outputs_given(parsed, front_end: str) -> dict[str, str]:
    """{sink name: target} of the sink flags given in ``parsed`` (made from :func:`arguments`)."""
    return {sink.name: path for sink in sinks(front_end) if (path := getattr(parsed, sink.name, None)) is not None}


def check_outputs(outputs: Mapping[str, str], overwrite: bool, replace_hint: str) -> None:
    """Refuse, in one sentence (ValueError), outputs ({sink name: target})
    that cannot be written: an unknown sink; for files, two in one file, a
    directory, an existing file without ``overwrite`` (``replace_hint`` says
    how to give it), a missing directory, one that cannot be replaced or
    written; for other sinks, what their own ``check`` refuses. Nothing is
    left behind."""
    unknown = sorted(set(outputs) - set(SINKS))
    if unknown:
        raise ValueError(f"no such output: {', '.join(unknown)} (there are {', '.join(SINKS)})")
    files_given = [target for name, target in outputs.items() if SINKS[name].is_file]
    paths = [os.path.abspath(p) for p in files_given]
    if len(set(paths)) < len(paths):  # two writers would interleave in one file
        raise ValueError(f"each output needs its own file: {', '.join(map(repr, files_given))}")
    for name, target in outputs.items():
        (SINKS[name].check or _check_output)(target, overwrite, replace_hint)


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


def anchored(outputs: Mapping[str, str]) -> dict[str, str]:
    """``outputs`` with every file's path made absolute here (a helper
    process's working directory is /); other targets as given."""
    return {name: os.path.abspath(os.fspath(target)) if SINKS[name].is_file else target
            for name, target in outputs.items()}


def open_stream(name: str, target: str, overwrite: bool):
    """The sender of stream ``name`` writing to ``target``; ValueError in
    one sentence when it cannot be made."""
    try:
        return SINKS[name].open(target, overwrite=overwrite)
    except OSError as err:
        raise ValueError(f"cannot write {target!r}: {err.strerror or err}") from None


def open_sink(name: str, target: str, *, overwrite: bool = False):
    """The sender of stream sink ``name`` (nbmon's or a plugin's) to
    ``target``, checked as every front end checks it; for the seed APIs and
    ``Monitor(consumers=...)``, e.g. ``SystemMonitor(pid, open_sink("csv",
    "stats.csv"))``. ValueError, in one sentence, when it cannot be made."""
    sink = SINKS.get(name)
    if sink is None or sink.open is None:
        streams = ", ".join(s.name for s in SINKS.values() if s.open is not None)
        raise ValueError(f"{name!r} is not a sink that takes samples (there are {streams})")
    return open_streams({name: target}, overwrite, "pass overwrite=True to replace it")[0]


class Streams(list):
    """The senders of one run's streams, and the files they made: if the run
    cannot start, :meth:`discard` closes them all and removes those files."""

    def __init__(self, outputs: Mapping[str, str]):
        super().__init__()
        self.new = [target for name, target in outputs.items()
                    if SINKS[name].is_file and not os.path.lexists(target)]

    def discard(self) -> None:
        for sender in self:
            sender.close()
        for path in self.new:
            if os.path.lexists(path):
                os.unlink(path)
        self.clear()


def open_streams(outputs: Mapping[str, str], overwrite: bool, replace_hint: str) -> Streams:
    """The senders of the streams ``outputs`` names ({sink name: target};
    reports are left out), checked first (:func:`check_outputs`); on any
    refusal (ValueError, one sentence) none is left open and no file made."""
    check_outputs(outputs, overwrite, replace_hint)
    outputs = {name: target for name, target in outputs.items() if SINKS[name].open is not None}
    opened = Streams(outputs)
    try:
        for name, target in outputs.items():
            opened.append(open_stream(name, target, overwrite))
    except BaseException:
        opened.discard()
        raise
    return opened
