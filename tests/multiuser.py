"""A real second local user, for tests of what another user of the same host
(JupyterHub, a shared GPU server) can do to nbmon.

    from multiuser import other_user, shared_dir   # fixtures (noqa: F401)

    def test_a_planted_file(other_user, shared_dir):
        other_user.python("import os; os.symlink('/etc/passwd', 'out.csv')", cwd=shared_dir)

``other_user`` (one per test module) is a :class:`LocalUser` made with
``useradd`` (a unique name ``nbmt<pid>x<n>``, its own group, a home in
/home) and removed with ``userdel -r`` after the module, also when a test
fails: first every process a test started as that user is killed, then the
user and its home go, then whatever it left at the top of /tmp and /dev/shm.
Users left by a test run that was killed are swept when the next one starts.
``shared_dir`` is a fresh directory that everybody may write to, sticky like
/tmp (mode 1777), removed after the test.

Both need root (CI runs the tests as root); elsewhere they skip the test.
Code runs as the user through :meth:`LocalUser.run` / :meth:`~LocalUser.python`
/ :meth:`~LocalUser.popen`: a subprocess with the user's uid, gid and no
other groups, a clean environment (HOME, USER, LOGNAME, PATH, LANG) and
umask 022. :attr:`LocalUser.python_exe` is the tests' interpreter when that
user may run it, else the system's python3: count on the standard library
only.
"""
from __future__ import annotations

import itertools
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

import pytest

PREFIX = "nbmt"
_NAME = re.compile(rf"{PREFIX}(\d+)x\d+")
_numbers = itertools.count()
SHARED_TOPS = ("/tmp", "/dev/shm")   # where a user's leftovers are swept


def need_root() -> None:
    """Skip the calling test unless it runs as root (useradd needs it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it creates a second local user (CI runs as root)")


class LocalUser:
    """A local user made for a test: ``name``, ``uid``, ``gid``, ``home``."""

    def __init__(self, name: str):
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid, self.home = name, entry.pw_uid, entry.pw_gid, entry.pw_dir
        self._procs: list[subprocess.Popen] = []
        self.python_exe = sys.executable if self._may_run(sys.executable) else \
            shutil.which("python3", path=self.env()["PATH"]) or "/usr/bin/python3"

    def env(self) -> dict[str, str]:
        """The clean environment its processes get."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name, "LANG": "C.UTF-8",
                "PATH": "/usr/local/bin:/usr/bin:/bin"}

    def _as_user(self, kwargs: dict) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": 0o022,
                "env": self.env(), "cwd": self.home, **kwargs}

    def _may_run(self, exe: str) -> bool:
        try:
            return subprocess.run([exe, "-c", ""], **self._as_user({}), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False

    def run(self, argv, *, check: bool = True, timeout: float = 60.0, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` as this user to the end (text output captured);
        ``check``: fail the test, with its stderr, unless it exits 0."""
        done = subprocess.run(argv, **self._as_user(kwargs), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            pytest.fail(f"{argv!r} as {self.name} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def python(self, code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """Run Python ``code`` (with ``args`` in sys.argv[1:]) as this user: see :meth:`run`."""
        return self.run([self.python_exe, "-c", code, *map(str, args)], **kwargs)

    def popen(self, argv, **kwargs) -> subprocess.Popen:
        """Start ``argv`` as this user and return at once; the process is
        killed and reaped, if still running, when the user is removed."""
        proc = subprocess.Popen(argv, **self._as_user(kwargs))
        self._procs.append(proc)
        return proc

    def _end_processes(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()


def _remove_user(name: str, uid: int | None = None) -> None:
    subprocess.run(["userdel", "--force", "--remove", name], capture_output=True, timeout=60)
    if uid is None:
        return
    for top in SHARED_TOPS:
        try:
            entries = os.listdir(top)
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(top, entry)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid != uid:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)


def _sweep_stale_users() -> None:
    """Remove users that a killed test run made (their pid is gone)."""
    for entry in pwd.getpwall():
        match = _NAME.fullmatch(entry.pw_name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            _remove_user(entry.pw_name, entry.pw_uid)


@contextmanager
def local_user() -> Iterator[LocalUser]:
    """A new local user for the ``with`` block, removed after it (see the module's doc)."""
    need_root()
    _sweep_stale_users()
    name = f"{PREFIX}{os.getpid()}x{next(_numbers)}"
    made = subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh",
                           "--comment", "nbmon test user", name], capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        pytest.fail(f"useradd {name} failed: {made.stderr.strip()}")
    user = None
    try:
        user = LocalUser(name)
        yield user
    finally:
        if user is not None:
            user._end_processes()
        _remove_user(name, user.uid if user is not None else None)


@contextmanager
def world_writable_dir() -> Iterator[str]:
    """A new directory under /tmp that every user may write to, sticky like /tmp; removed after."""
    need_root()
    path = tempfile.mkdtemp(prefix="nbmon-shared-", dir="/tmp")
    try:
        os.chmod(path, 0o1777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def other_user() -> Iterator[LocalUser]:
    """A second local user, for the test module (see the module's doc)."""
    with local_user() as user:
        yield user


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A fresh directory like /tmp (mode 1777), for the test."""
    with world_writable_dir() as path:
        yield path
