"""Do no harm (issue 17): what a second user of the host, a long outage or
a long session can do to nbmon, and that nbmon does nothing to the kernel
in return. The attacker is a real second local user (tests/multiuser.py);
the victim is this process (root here: the kernel's own checks, such as
``fs.protected_symlinks``, do not protect it unless they are on).

Figures for benchmarks/RELIABILITY.md are printed as ``FIGURE`` lines (-s).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
from helpers import DEADLINE_S, figure, wait_until
from multiuser import other_user, shared_dir  # noqa: F401 (fixtures)

import nbmon
from nbmon.engine import Monitor

NBMON_DIR = os.path.dirname(nbmon.__file__)


# -- the helper process starts isolated ---------------------------------------------------

PLANT = textwrap.dedent("""
    import os, sys
    project, package, marker = sys.argv[1:]
    os.mkdir(project, 0o755)
    os.mkdir(os.path.join(project, package), 0o755)
    with open(os.path.join(project, package, "__init__.py"), "w") as f:
        f.write(f"import os\\nopen({marker!r}, 'a').write(f'{{os.getuid()}} {{os.getpid()}}\\\\n')\\n")
    os.chmod(os.path.join(project, package, "__init__.py"), 0o644)
""")


@pytest.mark.parametrize("package", ["nbmon", "numpy"])
def test_a_package_planted_in_the_kernels_directory_never_runs_in_the_helper(
        ip, other_user, shared_dir, package):
    """The second user plants ``<package>/__init__.py`` (it would append its
    uid to a marker file) in a project directory of theirs; the victim's
    IPython shell ``%cd``s there and starts ``%resmon`` (the process backend)."""
    from IPython.utils.capture import capture_output

    from nbmon.notebook.session import SESSION

    project, marker = os.path.join(shared_dir, "project"), os.path.join(shared_dir, "ran")
    other_user.python(PLANT, project, package, marker)
    before = os.getcwd()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)   # a helper that fell back to a thread fails here
            with capture_output():
                ip.run_line_magic("cd", project)
                ip.run_line_magic("resmon", "--interval 0.05 --no-gpu")
            monitor = SESSION.monitor
            wait_until(lambda: monitor.store.seq >= 5, what="samples from the helper")
            backend = monitor.backend_used
        with capture_output():
            ip.run_line_magic("resmon", "stop")
    finally:
        os.chdir(before)
    ran = open(marker).read() if os.path.exists(marker) else ""
    figure(f"planted {package}/ in the kernel's directory", backend=backend, planted_code_ran=ran.split())
    assert ran == "" and backend == "process"


MARK = textwrap.dedent("""
    import os as _os
    if _os.environ.get("NBMON_TEST_MARK"):
        with open(_os.environ["NBMON_TEST_MARK"], "a") as _f:
            _f.write(f"{_os.getpid()} {__file__}\\n")
""")

KERNEL = textwrap.dedent("""
    import json, time
    import nbmon
    from nbmon.engine import Monitor
    m = Monitor(interval=0.05, gpu=False, backend="process").start()
    deadline = time.monotonic() + 20
    while m.store.seq < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    helper = m._sampler.proc.pid if m.backend_used == "process" else None
    print(json.dumps({"nbmon": nbmon.__file__, "backend": m.backend_used, "samples": m.store.seq,
                      "helper": helper}))
    m.stop()
""")


def copy_of_nbmon(into: str) -> str:
    """A copy of this nbmon package in ``into`` whose helper module notes the
    pid and file of every process that imports it (in NBMON_TEST_MARK)."""
    os.makedirs(into, exist_ok=True)
    target = os.path.join(into, "nbmon")
    shutil.copytree(NBMON_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    helper = os.path.join(target, "helper.py")
    with open(helper) as f:
        text = f.read()
    future = "from __future__ import annotations\n"
    with open(helper, "w") as f:   # first thing: `python -m` runs a module's end only after it exits
        f.write(text.replace(future, future + MARK, 1))
    return target


@pytest.mark.parametrize("where", ["PYTHONPATH", "user site-packages", "a virtual environment's site-packages"])
def test_the_helper_starts_from_wherever_the_kernels_nbmon_came_from(tmp_path, where):
    """``-I`` drops PYTHONPATH and the user's site-packages: the helper still
    runs the kernel's own nbmon (not another copy the interpreter can see)."""
    python, env = sys.executable, dict(os.environ, NBMON_TEST_MARK=str(tmp_path / "mark"))
    env.pop("PYTHONPATH", None)
    if where == "PYTHONPATH":
        copy = copy_of_nbmon(str(tmp_path / "pp"))
        env["PYTHONPATH"] = str(tmp_path / "pp")
    elif where == "user site-packages":
        env["HOME"] = str(tmp_path / "home")
        env.pop("PYTHONNOUSERSITE", None)
        user_site = subprocess.run([python, "-c", "import site; print(site.getusersitepackages())"], env=env,
                                   capture_output=True, text=True, check=True).stdout.strip()
        copy = copy_of_nbmon(user_site)
    else:
        subprocess.run([python, "-m", "venv", "--system-site-packages", "--without-pip", str(tmp_path / "venv")],
                       check=True, timeout=120)
        python = str(tmp_path / "venv" / "bin" / "python")
        site_packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                       capture_output=True, text=True, check=True).stdout.strip()
        copy = copy_of_nbmon(site_packages)
    (tmp_path / "cwd").mkdir()
    done = subprocess.run([python, "-c", KERNEL], cwd=tmp_path / "cwd", env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    kernel = json.loads(done.stdout)
    imported = dict(line.split(" ", 1) for line in (tmp_path / "mark").read_text().splitlines())
    figure(f"helper start, nbmon from {where}", backend=kernel["backend"],
           helper_imported=imported.get(str(kernel["helper"]), "").strip())
    assert kernel["nbmon"] == os.path.join(copy, "__init__.py")
    assert kernel["backend"] == "process" and kernel["samples"] >= 3, done.stderr
    assert imported[str(kernel["helper"])].strip() == os.path.join(copy, "helper.py")
