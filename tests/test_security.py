"""Security: no network, no evaluation of user strings, output files only
where the user said, with the user's umask, and never replaced unasked.

Figures for the reliability report are printed as ``FIGURE <scenario>: ...``
lines (run with ``-s`` to see them).

Already proven elsewhere, not repeated here:
  - CSV / JSON Lines senders refuse an existing file without overwrite=True:
    test_senders.py::test_existing_file_is_not_overwritten
  - CSV / JSON Lines senders create files with the user's umask: test_senders.py::test_file_is_created_with_the_users_umask
  - ``nbmon run`` refuses an existing output without --force, replaces it with --force:
    test_cli.py::test_existing_file_without_force, ::test_force_replaces_an_existing_file
"""
from __future__ import annotations

import ast
import os
import pathlib
import stat
import subprocess
import sys

import psutil
import pytest
from helpers import DEADLINE_S, figure, wait_until

import nbmon
from nbmon.engine import Monitor
from nbmon.views.dashboard import Dashboard, write_html

PACKAGE = pathlib.Path(nbmon.__file__).parent
INET = {"AF_INET", "AF_INET6"}


# -- no network --------------------------------------------------------------------------


def sockets(pid: int) -> dict:
    """The process's sockets: psutil's view (inet and unix, listening or
    connected) and the /proc/<pid>/fd links to ``socket:[inode]``."""
    proc = psutil.Process(pid)
    conns = getattr(proc, "net_connections", proc.connections)(kind="all")   # psutil < 6: connections()
    links = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed while we listed
            continue
        if target.startswith("socket:"):
            links.add(target)
    return {"inet": {(c.family.name, c.type.name, c.laddr, c.raddr, c.status)
                     for c in conns if c.family.name in INET},
            "unix": {(c.fd, c.laddr, c.raddr) for c in conns if c.family.name == "AF_UNIX"},
            "listening": {(c.family.name, c.laddr) for c in conns if c.status == psutil.CONN_LISTEN},
            "fds": links}


def test_monitoring_with_a_live_dashboard_and_a_helper_process_opens_no_socket():
    me = os.getpid()
    before = sockets(me)
    seen_helper: list[dict] = []
    # Thread backend, GPU on, with a live plotly dashboard built and refreshed (no kernel).
    m = Monitor(interval=0.01).start()
    try:
        dash = Dashboard(m, refresh_hz=20)
        try:
            wait_until(lambda: dash.refreshes >= 3, what="three dashboard refreshes")
            during = sockets(me)
        finally:
            dash.close()
    finally:
        assert m.stop(timeout=DEADLINE_S)
    # Process backend: the kernel side and the helper, while it runs.
    p = Monitor(interval=0.01, backend="process").start()
    try:
        assert p.backend_used == "process"
        wait_until(lambda: p.store.seq >= 5, what="samples from the helper")
        helper = p._sampler.proc.pid
        seen_helper.append(sockets(helper))
        during_process = sockets(me)
    finally:
        assert p.stop(timeout=DEADLINE_S)
    after = sockets(me)
    new = {k: (during[k] | during_process[k] | after[k]) - before[k] for k in before}
    figure("sockets", new_inet=len(new["inet"]), new_listening=len(new["listening"]),
           new_unix=len(new["unix"]), new_socket_fds=len(new["fds"]),
           helper_sockets=sum(len(v) for v in seen_helper[0].values()))
    assert new == {"inet": set(), "unix": set(), "listening": set(), "fds": set()}
    assert seen_helper[0] == {"inet": set(), "unix": set(), "listening": set(), "fds": set()}


def test_the_helper_talks_through_pipes_only():
    p = Monitor(interval=0.01, backend="process", gpu=False).start()
    try:
        helper = p._sampler.proc.pid
        wait_until(lambda: p.store.seq >= 3, what="samples from the helper")
        fds = {}
        for fd in ("0", "1", "2"):
            fds[fd] = os.readlink(f"/proc/{helper}/fd/{fd}")
    finally:
        assert p.stop(timeout=DEADLINE_S)
    assert fds["0"].startswith("pipe:") and fds["1"].startswith("pipe:")
    assert fds["2"] == "/dev/null"


# -- no evaluation of user strings ---------------------------------------------------------

DANGEROUS_CALLS = {"eval", "exec", "compile", "__import__", "execfile", "input"}


def _calls(path: pathlib.Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    scopes: list[str] = []

    class Visitor(ast.NodeVisitor):
        def visit_ClassDef(self, node):
            scopes.append(node.name)
            self.generic_visit(node)
            scopes.pop()

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef

        def visit_Call(self, node):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
            found.append((name, owner, ".".join(scopes), node))
            self.generic_visit(node)

    found: list = []
    Visitor().visit(tree)
    return found


def test_only_the_cell_magic_evaluates_code_and_it_is_the_users_own_cell():
    hits = []
    paths = sorted(PACKAGE.rglob("*.py"))  # every module, subpackages included
    assert PACKAGE / "kernel" / "magics.py" in paths
    for path in paths:
        where = path.relative_to(PACKAGE).as_posix()
        for name, owner, scope, node in _calls(path):
            if name in DANGEROUS_CALLS and owner in (None, "builtins"):
                hits.append((where, scope, name))
            # Other ways to run text as code or a shell command.
            if owner in ("pickle", "marshal", "shelve") and name in ("load", "loads", "open"):
                hits.append((where, scope, f"{owner}.{name}"))
            if owner == "os" and name and (name in ("system", "popen") or name.startswith("spawn")):
                hits.append((where, scope, f"os.{name}"))
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    hits.append((where, scope, "shell=True"))
    figure("eval/exec in nbmon", calls=sorted(hits))
    # exec of the cell's statements, eval of its last expression: %%resmon runs the user's own cell.
    assert sorted(hits) == [("kernel/magics.py", "ResmonMagics._execute", "eval"),
                            ("kernel/magics.py", "ResmonMagics._execute", "exec")]


def test_the_cell_magic_evaluates_only_the_cell_never_its_options(tmp_path):
    from IPython.core.error import UsageError
    from IPython.testing import globalipapp
    from IPython.utils.capture import capture_output

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # None once anyone started it
    with capture_output():
        ip.run_line_magic("load_ext", "nbmon")
    mark = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(mark)!r}).touch()"
    try:
        for line in (f"--interval {payload}", f"--window {payload}", f"auto {payload}",
                     f"--threshold {payload} auto on", payload):
            with pytest.raises(UsageError), capture_output():
                ip.run_line_magic("resmon", line)
        with capture_output():
            ip.run_cell_magic("resmon", f"--quiet --label {payload}", "rm_sec = 1")
        assert nbmon.history().iloc[-1]["label"] == payload  # kept as text
        assert not mark.exists()
    finally:
        ip.user_ns.pop("rm_sec", None)
        with capture_output():
            ip.run_line_magic("unload_ext", "nbmon")
    assert not mark.exists()


def test_the_command_line_evaluates_no_option(tmp_path):
    mark = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(mark)!r}).touch()"
    done = subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--interval", payload, "--",
                           sys.executable, "-c", "pass"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("nbmon: error:")
    assert not mark.exists()


# -- output files ------------------------------------------------------------------------------

OUTPUTS = {"--csv": "out/s.csv", "--jsonl": "out/s.jsonl", "--summary-json": "out/s.json", "--html": "out/s.html"}


def _run(tmp_path, *args, umask=0o022, extra_env=None):
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    env = dict(os.environ, HOME=str(home), TMPDIR=str(tmp), **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--interval", "0.02", *args, "--",
                           sys.executable, "-c", "import time; time.sleep(0.2)"],
                          cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.umask(umask))


@pytest.mark.parametrize("umask, mode", [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_cli_outputs_are_written_only_where_asked_with_the_users_umask(tmp_path, umask, mode):
    for d in ("home", "tmp", "cwd", "cwd/out"):
        (tmp_path / d).mkdir()
    args = [a for option, path in OUTPUTS.items() for a in (option, path)]
    done = _run(tmp_path, *args, umask=umask)
    assert done.returncode == 0, done.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    modes = {p: oct(stat.S_IMODE(os.stat(tmp_path / "cwd" / p).st_mode)) for p in OUTPUTS.values()}
    figure(f"output files (umask {umask:03o})", files=written, modes=sorted(set(modes.values())))
    assert written == sorted(f"cwd/{p}" for p in OUTPUTS.values())  # nothing in cwd, HOME or TMPDIR besides
    assert set(modes.values()) == {oct(mode)}


@pytest.mark.parametrize("option", ["--summary-json", "--html"])
def test_cli_does_not_truncate_a_file_that_appeared_during_the_run(tmp_path, option):
    path = tmp_path / "late.out"
    code = f"import time, pathlib; time.sleep(0.1); pathlib.Path({str(path)!r}).write_text('precious\\n')"
    done = subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--interval", "0.02", option, str(path),
                           "--", sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert path.read_text() == "precious\n", done.stderr


def test_write_html_replaces_a_file_only_when_told(tmp_path):
    m = Monitor(interval=0.01, gpu=False)
    m.start()
    assert m.stop(timeout=DEADLINE_S)
    path = tmp_path / "page.html"
    path.write_text("precious\n")
    with pytest.raises(FileExistsError):
        write_html(m, path, overwrite=False)
    assert path.read_text() == "precious\n"
    write_html(m, path, overwrite=True)  # replacing is asked for, as nbmon run --force does
    assert path.read_text().startswith("<!DOCTYPE html>")
    fresh = tmp_path / "new.html"
    write_html(m, fresh, overwrite=False)
    assert fresh.read_text().startswith("<!DOCTYPE html>")


def test_nothing_is_written_by_the_monitor_itself(tmp_path):
    # A monitored run, thread and process backends, writes no file anywhere
    # it was not asked to: the working directory, HOME and TMPDIR stay empty.
    for d in ("home", "tmp", "cwd"):
        (tmp_path / d).mkdir()
    code = ("from nbmon.engine import Monitor\n"
            "for backend in ('thread', 'process'):\n"
            "    m = Monitor(interval=0.01, backend=backend).start()\n"
            "    while m.store.seq < 5: pass\n"
            "    assert m.stop(timeout=20)\n")
    env = dict(os.environ, HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path / "tmp"))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "cwd", env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
