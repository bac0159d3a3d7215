"""nbmon's private per-user directory, for the few files it keeps.

On a shared host (JupyterHub, a GPU server) /tmp and /dev/shm belong to
everybody: a name nbmon would use there can be taken first by another user,
as a file of theirs, a symlink to one of the victim's files, or a hard link
(``fs.protected_symlinks``/``protected_regular`` are off on many hosts). So
nbmon keeps nothing in a shared directory. Its files live in

- ``$XDG_RUNTIME_DIR/nbmon`` when ``XDG_RUNTIME_DIR`` is a directory of
  this user's with mode 0700 (systemd's /run/user/<uid>), else
- ``<tempdir>/nbmon-<uid>``,

and every directory on the way is checked with ``lstat`` (not a symlink,
owned by this user, no access for group or others) after it is made. A file
is opened with ``O_NOFOLLOW`` and then checked on its descriptor (a regular
file of this user's, one link, mode 0600), so nothing swapped in between
the check and the use is ever written. Every refusal is an
:class:`UnsafePath` (an OSError) that says in one sentence what was found.
"""
from __future__ import annotations

import os
import stat
import tempfile

PRIVATE_MODE = 0o700
FILE_MODE = 0o600


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


def _base() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        try:
            _check_dir(runtime)
            return _make_dir(os.path.join(runtime, "nbmon"))
        except OSError:
            pass  # not usable (another user's, missing): the temp directory then
    return _make_dir(os.path.join(tempfile.gettempdir(), f"nbmon-{os.geteuid()}"))


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
            stat_line = f.read()
        return int(stat_line[stat_line.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int, started: int) -> bool:
    """Whether the process ``pid`` that started at ``started`` still lives."""
    return pid_started(pid) == started
