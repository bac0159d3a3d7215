"""What to monitor and how: one :class:`Options` object, built by the magics,
the CLI and the seed APIs and carried unchanged down to the sampler, in a
thread or a process (the helper processes get it as JSON).

Each option is declared once, as a field of :class:`Options`: its type, its
default, its check, and how the front ends offer it (:class:`Flag`: the
flag, its help, ``nbmon run`` and/or ``%resmon``). The CLI's argparse
arguments and the magic's ``magic_arguments`` come from there
(:func:`arguments`, :meth:`Options.from_arguments`).

Every check raises ValueError with one sentence that names the bad value as
it was given, ending in ", got <value>".
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Callable

DEFAULT_INTERVAL_S = 0.1
MIN_INTERVAL_S = 0.001       # below this the sampler would only spin
MAX_INTERVAL_S = 86400.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
BACKENDS = ("thread", "process")
SESSIONS = ("helper", "kernel")   # where a notebook's session runs: nbmon/helper/host.py
DEFAULT_MEMORY_WARNING_PERCENT = 90.0
GUARD_AUTO = "auto"                  # the memory guard where a container's limit is known
DEFAULT_MEMORY_GUARD_PERCENT = 95.0  # ... at this share of it
SLOW_EVERY_S = 1.0           # seconds between reads of the slow figures (disk, network, load, cgroup)
DEFAULT_WINDOW_S = 600.0     # seconds a live view shows
# A %%resmon record opens (its table and timeline) for a cell this long, or
# whose memory rose this much; another is a line, its table a click away.
RECORD_OPEN_AFTER_S = 5.0
RECORD_OPEN_MEMORY_MB = 100.0

# The front ends that offer options as flags.
CLI, MAGIC = "nbmon run", "%resmon"
FRONT_ENDS = (CLI, MAGIC)


def check_interval(value, name: str = "interval") -> float:
    """A finite positive number of seconds, or ValueError naming the bad value as given."""
    given = value
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of seconds, got {given!r}")
    if not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number of seconds, got {given!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {given!r}")
    if value < MIN_INTERVAL_S:
        raise ValueError(f"{name} must be at least {MIN_INTERVAL_S:g} s, got {given!r}")
    if value > MAX_INTERVAL_S:
        raise ValueError(f"{name} must be at most a day ({MAX_INTERVAL_S:g} s), got {given!r}")
    return float(value)


def check_pid(pid) -> int:
    """A whole positive number naming a process that exists."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError(f"pid must be a whole number, got {pid!r}")
    if pid <= 0:
        raise ValueError(f"pid must be a positive process id, got {pid!r}")
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        raise ValueError(f"no process with pid {pid} exists") from None
    except PermissionError:  # exists, owned by another user: /proc still reads it
        pass
    return pid


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _one_of(choices: tuple[str, ...]) -> Callable:
    def check(value, name: str) -> str:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    return check


check_backend = _one_of(BACKENDS)
_check_session = _one_of(SESSIONS)


def check_session(value, name: str) -> str | None:
    return None if value is None else _check_session(value, name)


def check_bytes(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number of bytes, got {value!r}")
    return value


def check_warning_percent(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 100:  # NaN fails too
        raise ValueError(f"{name} must be a percentage between 0 and 100 (None: no warning), got {value!r}")
    return float(value)


def _percent_text(text: str) -> float | None:
    """A flag's percentage: a number, or "off" for no warning."""
    return None if text.strip().lower() == "off" else float(text)


def check_guard_percent(value, name: str) -> float | str | None:
    """"auto", a percentage, or None (off)."""
    if value == GUARD_AUTO or value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 100:  # NaN fails too
        raise ValueError(f"{name} must be a percentage between 0 and 100, 'auto' or None (off), got {value!r}")
    return float(value)


def _guard_text(text: str) -> float | str | None:
    """The guard flag's value: a number, "auto" or "off"."""
    word = text.strip().lower()
    return None if word == "off" else GUARD_AUTO if word == GUARD_AUTO else float(text)


@dataclass(frozen=True, slots=True)
class Flag:
    """How the front ends offer one option. ``flag`` is "--interval"; for a
    True-or-False option, the switch that turns it away from its default
    ("--no-gpu", "--exact-peaks"). An option that takes a value has a
    ``metavar`` and turns the text given into the value with ``parse``
    (default: the check gets the text). ``offered``: the front ends
    (``CLI``, ``MAGIC``) that have it."""

    flag: str
    help: str
    metavar: str | None = None
    parse: Callable[[str], object] | None = None
    offered: tuple[str, ...] = FRONT_ENDS


def option(default, check: Callable, flag: Flag | None = None):
    """An :class:`Options` field: its default, its check (``check(value,
    name)`` returns the value, or raises ValueError naming it) and how the
    front ends offer it (None: from Python only)."""
    return dataclasses.field(default=default, metadata={"check": check, "flag": flag})


@dataclass(frozen=True, slots=True)
class Options:
    """How a monitor samples.

    ``interval`` seconds between samples; ``children``: the watched
    process's descendants too; ``system``: machine-wide and container
    (cgroup) figures; ``gpu``: GPUs (:mod:`nbmon.sources.gpus`); ``exact_peaks``:
    reset the kernel's high-water marks of the watched processes so that
    every interval's peak is exact (Linux) -- this changes what other tools
    read about those processes (VmHWM, ``getrusage``'s ``ru_maxrss``,
    ``/usr/bin/time -v``), so it is off unless asked for; ``backend``: sample
    from a ``"thread"`` in this process or from a sampler ``"process"``
    (Python only); ``session``: in a notebook, where the session (monitor,
    records, charts, warning, black box) runs: a ``"helper"`` process or the
    ``"kernel"`` itself (None: where it runs already, else a helper on Linux);
    ``max_bytes``: the store's bound; ``adopt``: also count this process's
    other children, which are what the watched process orphaned when this
    process is their subreaper (``nbmon run``). ``memory_warning_percent``:
    the notebook tells the running cell once when the container's memory
    reaches this share of its limit (without a limit: when the machine's
    used memory does); None: never (:mod:`nbmon.postmortem.memwarn`).
    ``memory_guard_percent``: the notebook stops the running cell at this
    share of the limit, before the OOM killer stops the kernel ("auto": 95
    where a container's limit is known; None: never;
    :mod:`nbmon.postmortem.memguard`); ``nbmon run`` sends the command
    SIGINT, and only where the flag is given. ``variables``:
    in a notebook, the kernel sizes its variables at each cell's end, for
    the cell's record and the black box (:mod:`nbmon.kernel.namespace`).
    """

    interval: float = option(DEFAULT_INTERVAL_S, check_interval, Flag(
        "--interval", f"seconds between samples (default {DEFAULT_INTERVAL_S:g})", "S"))
    children: bool = option(True, check_bool, Flag(
        "--no-children", "only the watched process itself, not the processes it starts"))
    system: bool = option(True, check_bool, Flag(
        "--no-system", "no machine-wide or container figures"))
    gpu: bool = option(True, check_bool, Flag("--no-gpu", "do not read GPUs"))
    exact_peaks: bool = option(False, check_bool, Flag(
        "--exact-peaks", "reset the watched processes' high-water marks so that every peak between samples "
                         "is exact; this changes what other tools read about them (VmHWM, ru_maxrss, time -v)"))
    backend: str = option("thread", check_backend)
    session: str | None = option(None, check_session, Flag(
        "--session", "helper: the session (monitor, records, charts) runs in a helper process, where no "
                     "GIL-held C call stalls its sampling (the default on Linux); kernel: in the kernel itself",
        "WHERE", offered=(MAGIC,)))
    max_bytes: int = option(DEFAULT_MAX_BYTES, check_bytes)
    adopt: bool = option(False, check_bool)   # nbmon run sets it, as the subreaper of what it runs
    memory_warning_percent: float | None = option(DEFAULT_MEMORY_WARNING_PERCENT, check_warning_percent, Flag(
        "--memory-warning", "warn the running cell once the container's memory reaches P percent of its limit "
                            f"(without one: the machine's); default {DEFAULT_MEMORY_WARNING_PERCENT:g}, off: never",
        "P", parse=_percent_text, offered=(MAGIC,)))
    memory_guard_percent: float | str | None = option(GUARD_AUTO, check_guard_percent, Flag(
        "--memory-guard", "stop the running cell (MemoryGuardError; nbmon run: SIGINT to the command) once "
                          "the container's memory reaches P percent of its limit, before the OOM killer kills "
                          "the kernel (a number: also on a machine with no limit); default auto: "
                          f"{DEFAULT_MEMORY_GUARD_PERCENT:g} where a container's limit is known (nbmon run: off); "
                          "off: never", "P", parse=_guard_text))
    variables: bool = option(True, check_bool, Flag(
        "--no-variables", "do not size the notebook's variables at each cell's end (what grew, what the "
                          "post-mortem names)", offered=(MAGIC,)))

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](getattr(self, f.name), f.name))

    @classmethod
    def of(cls, options: "Options | None" = None, **changes) -> "Options":
        """``options`` (default: the defaults) with ``changes`` applied; an
        unknown name is a ValueError that names it."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))}")
        if options is not None and not isinstance(options, cls):
            # Monitor(pid, 0.5): the interval where Monitor takes its options.
            raise ValueError(f"options must be an Options or None, got {options!r}")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **changes) if changes else base

    @classmethod
    def from_arguments(cls, parsed: argparse.Namespace, options: "Options | None" = None) -> "Options":
        """``options`` with the flags given in ``parsed`` (arguments made by
        :func:`arguments`) applied; ValueError naming the flag and the
        text as typed."""
        return cls.of(options, **given(parsed))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Options":
        return cls(**json.loads(text))


def flags(front_end: str) -> list[tuple[str, Flag]]:
    """(option name, its flag) for each option ``front_end`` offers, in declaration order."""
    return [(f.name, f.metadata["flag"]) for f in dataclasses.fields(Options)
            if f.metadata["flag"] is not None and front_end in f.metadata["flag"].offered]


def arguments(front_end: str) -> list[tuple[tuple[str, ...], dict]]:
    """The ``add_argument(*args, **kwargs)`` calls (argparse's, and
    IPython's ``magic_arguments.argument`` takes the same) of the options
    ``front_end`` offers. A flag not given leaves its option out of the
    parsed namespace: the option keeps the value it has."""
    calls = []
    for name, flag in flags(front_end):
        help_text = flag.help.replace("%", "%%")   # argparse formats help with %
        kwargs = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if flag.metavar is None:   # a switch: the opposite of the default
            kwargs.update(action="store_const", const=not Options.__dataclass_fields__[name].default)
        else:
            kwargs["metavar"] = flag.metavar
        calls.append(((flag.flag,), kwargs))
    return calls


def given(parsed: argparse.Namespace) -> dict:
    """{option name: checked value} of the option flags given in ``parsed``;
    ValueError naming the flag and the text as typed."""
    out = {}
    for f in dataclasses.fields(Options):
        flag = f.metadata["flag"]
        if flag is None or not hasattr(parsed, f.name):
            continue
        value = getattr(parsed, f.name)
        out[f.name] = value if flag.metavar is None else _from_text(f, flag, value)
    return out


def _from_text(f: dataclasses.Field, flag: Flag, text: str):
    value = text
    if flag.parse is not None:
        try:
            value = flag.parse(text)
        except ValueError:
            pass   # the check refuses the text in its own words
    try:
        return f.metadata["check"](value, flag.flag)
    except ValueError as err:
        # Name the value as typed: "1e-400" would otherwise read as 0.0, "1e3" as 1000.0.
        reason = str(err).rsplit(", got ", 1)[0]
        raise ValueError(f"{reason}, got {text!r}") from None
