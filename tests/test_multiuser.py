"""tests/multiuser.py: the second local user the multi-user tests rely on is
real (its own uid and group, no other groups, a clean environment) and
leaves nothing behind, also when the test that used it fails."""
from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import textwrap

from multiuser import local_user, need_root, world_writable_dir


def test_code_runs_as_the_user_alone_with_a_clean_environment(monkeypatch):
    need_root()
    monkeypatch.setenv("NBMON_SECRET", "not for the other user")
    with local_user() as user, world_writable_dir() as shared:
        done = user.python(textwrap.dedent("""
            import json, os, sys
            open(os.path.join(sys.argv[1], "planted"), "w").close()
            print(json.dumps({"ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid()],
                              "groups": os.getgroups(), "env": dict(os.environ), "cwd": os.getcwd(),
                              "umask": os.umask(0)}))
        """), shared)
        seen = json.loads(done.stdout)
        planted = os.lstat(os.path.join(shared, "planted"))
        assert seen["ids"] == [user.uid, user.uid, user.gid, user.gid] and user.uid != 0
        assert seen["groups"] in ([], [user.gid])
        assert seen["env"] == user.env() and "NBMON_SECRET" not in seen["env"]
        assert seen["env"]["HOME"] == user.home == seen["cwd"] and seen["umask"] == 0o022
        assert (planted.st_uid, planted.st_gid) == (user.uid, user.gid)
        assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
        # Root's private directory stays out of its reach.
        denied = user.run(["ls", "/root"], check=False)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr


def test_the_user_its_processes_and_its_leftovers_go_even_when_the_test_fails():
    need_root()
    try:
        with local_user() as user:
            name, uid, home = user.name, user.uid, user.home
            sleeper = user.popen(["sleep", "600"])
            user.python("import os; open('/dev/shm/' + os.environ['USER'], 'w').close(); "
                        "os.symlink('/etc/passwd', '/tmp/' + os.environ['USER'])")
            assert os.path.lexists(f"/dev/shm/{name}") and os.path.lexists(f"/tmp/{name}")
            raise AssertionError("the test failed")
    except AssertionError as err:
        assert str(err) == "the test failed"
    assert sleeper.poll() is not None
    assert name not in {e.pw_name for e in pwd.getpwall()}
    assert not os.path.exists(home)
    assert not os.path.lexists(f"/dev/shm/{name}") and not os.path.lexists(f"/tmp/{name}")
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == uid]


def _uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_users_left_by_a_killed_run_are_swept():
    need_root()
    # A run that was killed: its users are named after a pid that is gone.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = f"nbmt{gone}x0"
    subprocess.run(["useradd", "--create-home", "--user-group", stale], check=True, capture_output=True)
    try:
        with local_user():
            assert stale not in {e.pw_name for e in pwd.getpwall()}
    finally:
        subprocess.run(["userdel", "--force", "--remove", stale], capture_output=True)
