"""nbmon's private per-user directory, for the few files it keeps.

On a shared host (JupyterHub, a GPU server) /tmp and /dev/shm belong to
everybody: a name nbmon would use there can be taken first by another user,
as a file of theirs, a symlink to one of the victim's files, or a hard link
(``fs.protected_symlinks``/``protected_regular`` are off on many hosts). So
nbmon keeps nothing in a shared directory. Its files live in the first of

- ``$XDG_RUNTIME_DIR/nbmon`` when ``XDG_RUNTIME_DIR`` is a directory of
  this user's with mode 0700 (systemd's /run/user/<uid>);
- ``<tempdir>/nbmon-<uid>`` (containers, ssh: no ``XDG_RUNTIME_DIR``);
- ``~/.cache/nbmon/<host name>``: its name is predictable too, but only
  this user can make it, so another user who made ``<tempdir>/nbmon-<uid>``
  first cannot take nbmon's files away for good. A home may be shared by
  hosts (NFS): the host's name keeps each host's boards and locks apart.

Every directory nbmon makes is checked with ``lstat`` (not a symlink, owned
by this user, no access for group or others) after it is made; the home and
``~/.cache`` must be this user's (or root's) and writable by nobody else.
Where the first usable place is not the first one there is, because that
one was unsafe, :func:`fallback_note` says so in one line. A file is opened
with ``O_NOFOLLOW`` and then checked on its descriptor (a regular file of
this user's, one link, mode 0600), so nothing swapped in between the check
and the use is ever written. Every refusal is an :class:`UnsafePath` (an
OSError) that says in one sentence what was found.
"""
from __future__ import annotations

import os
import re
import socket
import stat
import tempfile

from .format import one_line

PRIVATE_MODE = 0o700
FILE_MODE = 0o600
_note = [""]   # why the place in use is not the first (see fallback_note)


class UnsafePath(OSError):
    """A path nbmon will not use: someone else's, a link, or open to others."""


def _check_dir(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{path} is a symbolic link, not a directory of this user's")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if st.st_mode & 0o077:
        raise UnsafePath(f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}, needs 0700)")


def _make_dir(path: str) -> str:
    try:
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        pass
    _check_dir(path)
    return path


def _check_parent(path: str) -> None:
    """A directory (a link to one is followed) that no other user can change:
    this user's or root's, writable by its owner alone."""
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory")
    if st.st_uid not in (os.geteuid(), 0):
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise UnsafePath(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})")


def _runtime_place() -> str | None:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not (runtime and os.path.isabs(runtime)):
        return None
    _check_dir(runtime)
    return _make_dir(os.path.join(runtime, "nbmon"))


def _temp_place() -> str:
    return _make_dir(os.path.join(tempfile.gettempdir(), f"nbmon-{os.geteuid()}"))


def _home_place() -> str:
    home = os.path.expanduser("~")
    if not os.path.isabs(home):
        raise UnsafePath("this user has no home directory")
    _check_parent(home)
    cache = os.path.join(home, ".cache")
    try:
        os.mkdir(cache, PRIVATE_MODE)
    except FileExistsError:
        pass
    _check_parent(cache)
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()).lstrip(".")[:64] or "host"
    return _make_dir(os.path.join(_make_dir(os.path.join(cache, "nbmon")), host))


def _base() -> str:
    refused: list[OSError] = []
    for place in (_runtime_place, _temp_place, _home_place):
        try:
            path = place()
        except OSError as err:
            refused.append(err)
            continue
        if path is None:
            continue
        unsafe = [err for err in refused if isinstance(err, UnsafePath)]
        _note[0] = one_line(f"nbmon: {unsafe[-1]}; its private files are in {path} instead") if unsafe else ""
        return path
    raise UnsafePath(one_line("no private directory for nbmon: " + "; ".join(str(err) for err in refused)))


def fallback_note() -> str:
    """'' when nbmon's files are in the first of their places there is (see
    the module's doc), else one line saying which unsafe place was passed
    over and where they are instead (as of the last :func:`private_dir`)."""
    return _note[0]


def private_dir(*parts: str) -> str:
    """The private directory (``parts`` below it, made as needed), checked;
    raises :class:`UnsafePath` or another OSError when it cannot be had."""
    path = _base()
    for part in parts:
        path = _make_dir(os.path.join(path, part))
    return path


def check_private_fd(fd: int, path: str) -> os.stat_result:
    """The ``fstat`` of ``fd`` if it is a regular file of this user's with one
    link and no access for others; else :class:`UnsafePath`."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{path} is not a regular file")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to this user")
    if st.st_nlink != 1:
        raise UnsafePath(f"{path} has {st.st_nlink} links (a hard link to another file?)")
    if st.st_mode & 0o077:
        raise UnsafePath(f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o})")
    return st


def open_private(path: str, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """Open a file in the private directory without following a link at its
    name, and check it (:func:`check_private_fd`); the descriptor is closed
    again on refusal."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        check_private_fd(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def pid_started(pid: int) -> int | None:
    """When ``pid`` started (field 22 of /proc/<pid>/stat, clock ticks after
    boot), None if no such process: a pid and its start time name one
    process for good, even once the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return started_in(f.read())
    except (OSError, ValueError, IndexError):
        return None


PF_EXITING = 0x4          # /proc/<pid>/stat's flags: the process has begun to exit
SIGKILL_BIT = 1 << 8      # SIGKILL (9) in /proc/<pid>/status's signal masks


def pid_running(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs
    and will: there, not another one on its reused pid, not a zombie, not
    exiting, no SIGKILL pending (the OOM killer counts its kill, then sends
    it: a process it chose may take a while to begin exiting)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
        fields = line[line.rindex(b")") + 2:].split()
        if fields[0] in (b"Z", b"X") or int(fields[6]) & PF_EXITING or int(fields[19]) != started:
            return False
        with open(f"/proc/{pid}/status", "rb") as f:
            pending = next(line for line in f if line.startswith(b"ShdPnd:"))
        return not int(pending.split()[1], 16) & SIGKILL_BIT
    except (OSError, ValueError, IndexError, StopIteration):
        return False


def started_in(stat_line: bytes) -> int:
    """The start time in a /proc/<pid>/stat line (ValueError, IndexError if
    it is not one)."""
    return int(stat_line[stat_line.rindex(b")") + 2:].split()[19])


def alive(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` still lives."""
    return pid_started(pid) == started
