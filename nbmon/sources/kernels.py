"""The Jupyter kernels of this user on this host, found in /proc: a process
whose command line names a connection file (``-f <file>.json``, as every
kernel launched by jupyter_client has), whether or not nbmon is loaded in it.

Only processes of this user (their /proc directory's owner) are looked at;
a kernel's forked children (DataLoader workers keep its command line) and
the kernels it starts (papermill in a notebook) are part of its tree, not
kernels of their own. A kernel jupyter_client started (JPY_PARENT_PID set)
leads a session, or its parent does: one that does not is a child a dead
kernel forked, no kernel either. What a command line or an
environment says is text only: no file it names is opened, nothing in it runs.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ..launch import SPAWN_MARK, spawned
from ..private import started_in
from .procfs import read_path

ENVIRON_BYTES = 1 << 18      # a kernel's environment is read up to this much
SESSION_VARIABLE = b"JPY_SESSION_NAME="   # the notebook's path, set by jupyter_server as it starts the kernel
LAUNCHER_VARIABLE = b"JPY_PARENT_PID="    # set by jupyter_client as it starts a kernel
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The connection file's flag, as jupyter_client's kernel specs write it and as kernels accept it.
_FLAGS = ("-f", "--f", "--connection-file", "--connection_file", "--KernelApp.connection_file")


@dataclass(frozen=True, slots=True)
class KernelProcess:
    """A kernel as /proc shows it: its ``pid`` and start time (clock ticks
    after boot: with the pid, one process for good), its ``connection_file``
    as its command line names it, the notebook it serves (``session``: its
    JPY_SESSION_NAME, "" where unset or unreadable) and its parent's pid."""

    pid: int
    started: int
    connection_file: str
    session: str
    ppid: int

    @property
    def kernel_id(self) -> str:
        """jupyter_client's kernel id (``kernel-<id>.json``), else the file's name."""
        name = os.path.basename(self.connection_file)
        name = name[:-5] if name.endswith(".json") else name
        return name[7:] if name.startswith("kernel-") else name

    @property
    def age_s(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME) - self.started / CLOCK_TICKS


def connection_file(argv: list[str]) -> str | None:
    """The connection file a kernel's command line names, None if it names none."""
    for k, arg in enumerate(argv):
        for flag in _FLAGS:
            if arg == flag and k + 1 < len(argv):
                value = argv[k + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1:]
            else:
                continue
            if value.endswith(".json"):
                return value
    return None


def _environment(pid: int) -> tuple[str, bool]:
    """The process's JPY_SESSION_NAME ("" where unset or unreadable), and
    whether jupyter_client started it or what it forked (JPY_PARENT_PID set)."""
    try:
        environ = read_path(f"/proc/{pid}/environ", ENVIRON_BYTES)
    except OSError:   # gone, or not readable (a process made undumpable): shown without it
        return "", False
    session, launched = "", False
    for entry in environ.split(b"\0"):
        if entry.startswith(SESSION_VARIABLE):
            session = entry[len(SESSION_VARIABLE):].decode("utf-8", "replace")
        launched = launched or entry.startswith(LAUNCHER_VARIABLE)
    return session, launched


@dataclass(frozen=True, slots=True)
class Found:
    """What one look at /proc found: the ``kernels`` by pid, and the pids of
    nbmon's own helper processes (``helpers``), which a kernel's tree leaves
    out as ``%resmon`` does."""

    kernels: list[KernelProcess]
    helpers: frozenset[int]


def find_kernels(uid: int | None = None, members: frozenset[int] = frozenset()) -> Found:
    """Every kernel of user ``uid`` (this process's real uid by default);
    a process that exits meanwhile is left out. ``members``: processes
    known to be in a kernel's tree, not its root (a refresh's trees): not
    read again, for they are no kernels of their own."""
    uid = os.getuid() if uid is None else uid
    helpers = set()
    files: dict[int, tuple[str, int, int, int]] = {}   # pid: (connection file, start time, parent, session leader)
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in members:
                continue
            try:
                if entry.stat().st_uid != uid:
                    continue
                raw = read_path(f"/proc/{pid}/cmdline", 1 << 16)
                if b".json" not in raw:   # most processes: not a kernel, nothing to decode
                    if SPAWN_MARK in raw and spawned(raw.split(b"\0")):
                        helpers.add(pid)
                    continue
                path = connection_file([a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")])
                if path is None:
                    continue
                stat = read_path(f"/proc/{pid}/stat", 1024)
                fields = stat[stat.rindex(b")") + 2:].split()   # state, parent, process group, session, ...
                files[pid] = (path, started_in(stat), int(fields[1]), int(fields[3]))
            except (OSError, ValueError, IndexError):   # gone meanwhile
                continue
    # A forked child keeps its kernel's command line, and a kernel a kernel started (papermill in a
    # notebook) is in its tree: a kernel is a process with a connection file whose parent has none.
    kernels = []
    for pid, (path, started, ppid, leader) in sorted(files.items()):
        if ppid in files:
            continue
        session, launched = _environment(pid)
        # Started by jupyter_client, a kernel leads its session, or its parent does (a kernel spec's
        # wrapper script): else it is a child a dead kernel forked, left to init.
        if launched and leader not in (pid, ppid):
            continue
        kernels.append(KernelProcess(pid, started, path, session, ppid))
    return Found(kernels, frozenset(helpers))
