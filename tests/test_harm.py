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

import numpy as np
import pytest
from helpers import DEADLINE_S, FrontEnd, figure, venv_over_this_environment, wait_until
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
    IPython shell ``%cd``s there, loads nbmon (its session's helper process
    starts from there) and starts ``%resmon``."""
    from IPython.utils.capture import capture_output

    from nbmon.kernel.session import SESSION

    project, marker = os.path.join(shared_dir, "project"), os.path.join(shared_dir, "ran")
    other_user.python(PLANT, project, package, marker)
    before = os.getcwd()
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always", RuntimeWarning)   # a helper that fell back to a thread says so
            with capture_output():
                ip.run_line_magic("cd", project)
                ip.run_line_magic("unload_ext", "nbmon")
                ip.run_line_magic("load_ext", "nbmon")
                ip.run_line_magic("resmon", "--interval 0.05 --no-gpu")
            wait_until(lambda: SESSION.host.info()["samples"] >= 5, what="samples")
            backend = "process" if SESSION.remote else "thread"
        with capture_output():
            ip.run_line_magic("resmon", "stop")
    finally:
        os.chdir(before)
    ran = open(marker).read() if os.path.exists(marker) else ""
    figure(f"planted {package}/ in the kernel's directory", backend=backend, planted_code_ran_as=ran.split())
    assert ran == ""   # before: "0 <pid>", the helper ran it as the victim (root here)
    assert backend == "process" and not [str(w.message) for w in warned if "nbmon" in str(w.message)]


PLANTED_PLUGIN = {
    "evil_plugin-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil-plugin\nVersion: 1.0\n",
    "evil_plugin-1.0.dist-info/entry_points.txt": "[nbmon.metrics]\nevil = evil_module\n",
    "evil_module.py": "import os\nopen(os.environ['NBMON_TEST_MARK'], 'w').write('ran')\nMETRICS = ()\n",
}


def test_modules_planted_in_the_current_directory_never_run_in_the_helper(tmp_path):
    """A kernel started in a directory where someone left ``pynvml.py`` (a
    package the helper imports that this kernel has not) and ``uuid.py`` (a
    standard library name): the helper imports neither."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pynvml", "uuid"):
        (project / f"{name}.py").write_text(MARK)
    env = dict(os.environ, NBMON_TEST_MARK=str(tmp_path / "mark"))
    session = ("import json, nbmon\nfrom nbmon.kernel.session import SESSION\n"
               "nbmon.monitor(interval=0.05, gpu=False)\n"
               "print(json.dumps({'remote': SESSION.remote, 'helper': SESSION.host.pid, 'info': SESSION.host.info()}))\n"
               "SESSION.close()")
    done = subprocess.run([sys.executable, "-c", session], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    kernel = json.loads(done.stdout)
    marks = (tmp_path / "mark").read_text().splitlines() if (tmp_path / "mark").exists() else []
    assert kernel["remote"], kernel
    assert not [line for line in marks if line.split()[0] == str(kernel["helper"])], marks


def test_a_plugin_planted_in_the_current_directory_never_runs(tmp_path):
    """An ``nbmon.metrics`` entry point of a distribution someone left in
    the directory a notebook is opened in is no installed plugin."""
    project = tmp_path / "project"
    for name, text in PLANTED_PLUGIN.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    env = dict(os.environ, NBMON_TEST_MARK=str(tmp_path / "mark"))
    done = subprocess.run([sys.executable, "-c", "import nbmon, nbmon.catalog as c; print(len(c.METRICS))"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "evil" not in done.stderr, done.stderr
    assert not (tmp_path / "mark").exists()


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
    helper = os.path.join(target, "sampling", "process.py")
    with open(helper) as f:
        text = f.read()
    future = "from __future__ import annotations\n"
    with open(helper, "w") as f:   # first thing: `python -m` runs a module's end only after it exits
        f.write(text.replace(future, future + MARK, 1))
    return target


@pytest.mark.parametrize("where", ["PYTHONPATH", "user site-packages", "a virtual environment's site-packages"])
def test_the_helper_starts_from_wherever_the_kernels_nbmon_came_from(tmp_path, where):
    """``-I`` drops PYTHONPATH and the user's site-packages: the helper still
    runs the kernel's own nbmon (not another copy the interpreter can see);
    ``-S``: no .pth file of the environment runs code in it."""
    python, env = sys.executable, dict(os.environ, NBMON_TEST_MARK=str(tmp_path / "mark"))
    env.pop("PYTHONPATH", None)
    if where == "PYTHONPATH":
        copy = copy_of_nbmon(str(tmp_path / "pp"))
        env["PYTHONPATH"] = str(tmp_path / "pp")
    elif where == "user site-packages":
        env["HOME"] = str(tmp_path / "home")
        env.pop("PYTHONNOUSERSITE", None)
        if sys.prefix != sys.base_prefix:   # a virtual environment has no user site: one that has
            python = venv_over_this_environment(tmp_path / "venv")
        user_site = subprocess.run([python, "-c", "import site; print(site.getusersitepackages())"], env=env,
                                   capture_output=True, text=True, check=True).stdout.strip()
        copy = copy_of_nbmon(user_site)
    else:
        python = venv_over_this_environment(tmp_path / "venv")
        site_packages = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                       capture_output=True, text=True, check=True).stdout.strip()
        copy = copy_of_nbmon(site_packages)
        # A .pth file there: code that `site` runs in every interpreter of the environment, never in a helper.
        with open(os.path.join(site_packages, "nbmon_test_mark.pth"), "w") as f:
            f.write("import os; open(os.environ['NBMON_TEST_MARK'] + '.pth', 'a').write(f'{os.getpid()}\\n')\n")
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
    assert imported[str(kernel["helper"])].strip() == os.path.join(copy, "sampling", "process.py")
    if where == "a virtual environment's site-packages":
        ran_pth = (tmp_path / "mark.pth").read_text().split()
        assert len(set(ran_pth)) == 1 and str(kernel["helper"]) not in ran_pth   # the kernel's, not the helper's


# -- outputs never written through a planted link --------------------------------------------

PROTECTED = ("/proc/sys/fs/protected_symlinks", "/proc/sys/fs/protected_regular")


@pytest.fixture(params=["0", "1"], ids=["protected_links_off", "protected_links_on"])
def protected(request):
    """``fs.protected_symlinks`` and ``fs.protected_regular`` both off (as on
    many hosts, and this one) or on, restored after the test."""
    saved = []
    try:
        for path in PROTECTED:
            with open(path) as f:
                saved.append((path, f.read().strip()))
            with open(path, "w") as f:
                f.write(request.param)
    except OSError as err:
        pytest.skip(f"cannot set {path}: {err}")
    try:
        yield request.param == "1"
    finally:
        for path, value in saved:
            with open(path, "w") as f:
                f.write(value)


def nbmon_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbmon.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


LINK = "import os, sys; os.symlink(sys.argv[1], sys.argv[2])"
PRECIOUS = "the victim's own file\n"


def precious_file(tmp_path) -> str:
    path = tmp_path / "precious"
    path.write_text(PRECIOUS)
    return str(path)


@pytest.mark.parametrize("option", ["--csv", "--jsonl", "--summary-json", "--html"])
def test_force_replaces_a_link_the_other_user_planted_never_its_target(
        tmp_path, other_user, shared_dir, protected, option):
    precious = precious_file(tmp_path)
    out = os.path.join(shared_dir, "run.out")
    other_user.python(LINK, precious, out)
    done = nbmon_cli("run", "--quiet", "--interval", "0.05", option, out, "--force", "--",
                     sys.executable, "-c", "pass")
    written = open(out).read() if not os.path.islink(out) else None
    figure(f"--force over a planted link ({option}, protected {'on' if protected else 'off'})",
           exit=done.returncode, target_untouched=open(precious).read() == PRECIOUS,
           output_is_own_file=written is not None and os.lstat(out).st_uid == os.geteuid())
    assert open(precious).read() == PRECIOUS
    assert done.returncode == 0, done.stderr
    assert written and os.lstat(out).st_uid == os.geteuid() and os.lstat(out).st_nlink == 1


def test_force_over_a_file_the_other_user_planted_writes_nothing_into_theirs(
        tmp_path, other_user, shared_dir, protected):
    """A file of theirs at the name (mode 0666, a hard link kept at home):
    the victim's samples must not land where they can read them."""
    out = os.path.join(shared_dir, "run.csv")
    kept = os.path.join(other_user.home, f"kept-{tmp_path.name}")
    other_user.python("import os, sys; open(sys.argv[1], 'w').close(); os.chmod(sys.argv[1], 0o666); "
                      "os.link(sys.argv[1], sys.argv[2])", out, kept)
    done = nbmon_cli("run", "--quiet", "--interval", "0.05", "--csv", out, "--force", "--",
                     sys.executable, "-c", "pass")
    leaked = os.path.getsize(kept)
    figure(f"--force over the other user's file (protected {'on' if protected else 'off'})",
           exit=done.returncode, bytes_in_their_file=leaked)
    assert leaked == 0
    assert done.returncode == 0, done.stderr
    assert os.lstat(out).st_uid == os.geteuid() and open(out).read().startswith("time,")


@pytest.mark.parametrize("sender", ["CSVSender", "JSONLinesSender"])
def test_senders_and_pages_replace_a_planted_link_never_its_target(tmp_path, other_user, shared_dir, sender):
    from nbmon.sinks import senders
    from nbmon.views.dashboard import write_html

    precious = precious_file(tmp_path)
    links = {name: os.path.join(shared_dir, name) for name in ("stream", "page.html", "default.html")}
    for link in links.values():
        other_user.python(LINK, precious, link)
    out = getattr(senders, sender)(links["stream"], overwrite=True)
    out.publish({"time": 1.0, "proc_rss_mb": 2.0})
    out.close()
    m = Monitor(interval=0.01, gpu=False).start()
    assert m.stop(timeout=DEADLINE_S)
    write_html(m, links["page.html"], overwrite=True)
    with pytest.raises(FileExistsError):
        write_html(m, links["default.html"])   # overwrite defaults to False
    assert open(precious).read() == PRECIOUS
    assert not os.path.islink(links["stream"]) and "2.0" in open(links["stream"]).read()
    assert open(links["page.html"]).read().startswith("<!DOCTYPE html>")


RANK_LINE = {"time": 1.7e9, "elapsed_s": 0.0, "rank": 0, "host": "h", "proc_rss_mb": 10.0, "proc_cpu_percent": 1.0}


def test_the_ranks_report_replaces_a_planted_link_never_its_target(tmp_path, other_user, shared_dir, protected):
    precious = precious_file(tmp_path)
    ranks = tmp_path / "rank-00000.jsonl"
    ranks.write_text("".join(json.dumps({**RANK_LINE, "time": 1.7e9 + k}) + "\n" for k in range(3)))
    page = os.path.join(shared_dir, "report.html")
    other_user.python(LINK, precious, page)
    done = nbmon_cli("report", str(ranks), "--html", page, "--force")
    assert open(precious).read() == PRECIOUS
    assert done.returncode == 0, done.stderr
    assert open(page).read().startswith("<!DOCTYPE html>")


# -- foreign text never reaches the terminal as escapes ----------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\r\u202e"
CONTROLS = {c for c in ESCAPES if not c.isprintable()}   # ESC, BEL, CR, the right-to-left override


def test_nbmon_report_prints_a_rank_files_host_without_its_escapes(tmp_path):
    """A rank file (written by anyone: the job's directory may be shared)
    whose host name is a terminal title, a screen clear and a colour."""
    ranks = tmp_path / "rank-00000.jsonl"
    ranks.write_text("".join(json.dumps({**RANK_LINE, "time": 1.7e9 + k, "host": "node" + ESCAPES}) + "\n"
                             for k in range(3)))
    named = tmp_path / f"rank-00001{ESCAPES[:6]}.jsonl"   # and a file name with one
    named.write_text("not json\n")
    done = nbmon_cli("report", str(ranks))
    bad = nbmon_cli("report", str(named))
    figure("nbmon report, host with escapes", controls_on_stdout=sum(c in CONTROLS for c in done.stdout),
           shown_as=done.stdout.split("\n")[1][-60:])
    assert done.returncode == 0, done.stderr
    for text in (done.stdout, done.stderr, bad.stderr):
        assert not CONTROLS & set(text), repr(text)
    assert "on node\\x1b]0;owned\\x07\\x1b[2J\\x1b[31m\\r\\u202e" in done.stdout
    assert bad.returncode == 2 and "rank-00001\\x1b]0;ow" in bad.stderr


def test_nbmon_run_prints_its_command_and_faults_without_escapes(tmp_path):
    done = nbmon_cli("run", "--interval", "0.05", "--csv", str(tmp_path / "out.csv"), "--",
                     sys.executable, "-c", "pass", "arg" + ESCAPES, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not CONTROLS & set(done.stderr), repr(done.stderr)
    assert "arg\\x1b]0;owned" in done.stderr


# -- a failing file sender backs off, bounded, and loses nothing the store holds -----------------

OUTAGE_CHILD = textwrap.dedent("""
    import inspect, json, os, resource, sys, time
    from nbmon.sinks import senders
    from nbmon.sinks.consumers import SampleForwarder
    from nbmon.engine import Monitor

    path, max_bytes, outage_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    attempts = []   # (monotonic time, samples, written)

    class Counting(senders.JSONLinesSender):
        def publish_many(self, events):
            try:
                super().publish_many(events)
            except OSError:
                attempts.append((time.monotonic(), len(events), False))
                raise
            attempts.append((time.monotonic(), len(events), True))

    # The same run on code without the knobs shows what it did before.
    knobs = {k: v for k, v in {"chunk": 100, "retry_max_s": 0.32}.items()
             if k in inspect.signature(SampleForwarder).parameters}
    forward = SampleForwarder(Counting(path), every_s=0.01, **knobs)
    mon = Monitor(interval=0.005, gpu=False, max_bytes=max_bytes, consumers=[forward]).start()
    deadline = time.monotonic() + 30
    while forward.sender.lines_written < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    limit = os.path.getsize(path)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))   # the disk is full (EFBIG)
    t_full, seq_full = time.monotonic(), mon.store.seq
    time.sleep(outage_s)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))   # room again
    t_back, seq_back = time.monotonic(), mon.store.seq
    while forward.sent + forward.lost < seq_back and time.monotonic() < deadline:
        time.sleep(0.005)
    clean = mon.stop(timeout=10)
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    print(json.dumps({"attempts": attempts, "t_full": t_full, "t_back": t_back, "seq_full": seq_full,
                      "seq_back": seq_back, "seq": mon.store.seq, "sent": forward.sent, "lost": forward.lost,
                      "clean": clean, "elapsed": [line["elapsed_s"] for line in lines],
                      "faults": {k: [f.count, f.first_error] for k, f in mon.faults.items()}}))
""")


def outage(tmp_path, max_bytes: int, outage_s: float = 3.0) -> dict:
    done = subprocess.run([sys.executable, "-c", OUTAGE_CHILD, str(tmp_path / "out.jsonl"), str(max_bytes),
                           str(outage_s)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_sender_failing_for_long_backs_off_each_try_bounded_and_loses_nothing(tmp_path):
    run = outage(tmp_path, max_bytes=16 << 20)
    failed = [(t, n) for t, n, ok in run["attempts"] if not ok and run["t_full"] <= t <= run["t_back"]]
    figure("file sender, 3 s outage at 200 Hz", failed_attempts=len(failed),
           largest_failed_attempt=max(n for _, n in failed), samples_in_outage=run["seq_back"] - run["seq_full"],
           lines=len(run["elapsed"]), samples=run["seq"], lost=run["lost"])
    # Backed off: from 10 ms doubling to 0.32 s, some 14 tries in 3 s (a try every 10 ms before: ~300).
    assert 3 <= len(failed) <= 30, len(failed)
    assert max(n for _, n in failed) <= 100   # each try one chunk (before: the whole backlog, growing)
    # Nothing lost once the disk is back: every sample once, in order.
    assert run["clean"] and run["lost"] == 0
    assert len(run["elapsed"]) == run["seq"] == run["sent"]
    assert all(a < b for a, b in zip(run["elapsed"], run["elapsed"][1:]))
    (count, first), = run["faults"].values()
    assert count == len([a for a in run["attempts"] if not a[2]]) and "File too large" in first


def test_samples_the_store_decimated_during_an_outage_are_counted_and_reported(tmp_path):
    # A store that holds 128 raw samples: 3 s at 200 Hz do not fit.
    run = outage(tmp_path, max_bytes=128 * 8 * 80)
    figure("file sender, 3 s outage, 128-sample store", lost=run["lost"], lines=len(run["elapsed"]),
           samples=run["seq"], faults=run["faults"])
    assert run["lost"] > 0 and len(run["elapsed"]) + run["lost"] == run["seq"]
    assert all(a < b for a, b in zip(run["elapsed"], run["elapsed"][1:]))
    count, first = run["faults"]["Counting backlog"]
    assert "samples were decimated by the store before Counting could take them" in first


# -- long sessions: the per-cell history is bounded ---------------------------------------------

def vm_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_20000_cells_keep_the_history_bounded():
    from nbmon.helper import host as hosting
    from nbmon.kernel.session import Outlet

    s = hosting.SessionHost(os.getpid(), Outlet(), kernel=False)   # the session's host, here in this process
    s.start({"interval": 1.0, "gpu": False, "system": False, "children": False,
             "max_bytes": 1 << 20})   # its store is full long before the end
    monitor = s.monitor
    rss = {}
    try:
        for n in range(1, 20_001):
            s.cell_close(s.cell_open(number=n, label=f"cell {n}")["token"])
            if n in (10_000, 20_000):
                rss[n] = vm_rss_mb()
    finally:
        assert monitor.stop(timeout=DEADLINE_S)
    figure("20,000 cells", records=len(s.records), rss_growth_mb_10k_to_20k=round(rss[20_000] - rss[10_000], 2),
           with_stats=sum(r.stats is not None for r in s.records))
    assert len(s.records) == hosting.MAX_RECORDS == 10_000
    assert [r.execution_count for r in s.records] == list(range(10_001, 20_001))
    assert [r for r in s.records if r.stats is not None] == [s.records[-1]]   # the newest cell's record is drawn from it
    assert rss[20_000] - rss[10_000] < 8.0   # before: a record more per cell, +27 MiB over these 10,000


def test_the_workers_history_keeps_whole_cells_within_its_bounds(monkeypatch):
    import nbmon.dask as nbdask
    from nbmon.dask.client import NO_ANSWER
    from nbmon.report.records import CellRecord, WorkerCellRecord

    monkeypatch.setattr(nbdask, "_cells", type(nbdask._cells)())
    monkeypatch.setattr(nbdask, "_rows", 0)
    def rows(n: int, workers: int) -> list[WorkerCellRecord]:
        return [WorkerCellRecord.on(CellRecord(n, "", 1.7e9, 0.0), f"tcp://w{k}", "h", NO_ANSWER) for k in range(workers)]

    for n in range(1, 20_001):   # 3 workers a cell, then a cluster of 60,000 workers for one cell
        nbdask._keep(rows(n, 3))
    frame = nbdask.history()
    assert len(frame) == 30_000 and frame["execution_count"].iloc[0] == 10_001
    nbdask._keep(rows(20_001, 60_000))
    assert len(nbdask.history()) == 60_000 and set(nbdask.history()["execution_count"]) == {20_001}


# -- Dask: batches from any client of the scheduler, the host lock -----------------------------

HOLD_LOCK = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
    os.fchmod(fd, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        yield client


def nbmon_threads_here() -> list[str]:
    import threading

    return sorted(t.name for t in threading.enumerate() if t.name.startswith("nbmon-"))


def test_events_from_another_client_change_nothing_and_stop_sane(ip, dask_client):
    """Another client of the scheduler logs to the watch's topic (its name is
    no secret: any client lists the topics and reads their events): bad
    batches of every kind, in the wire's form and in the old one, the
    departure of a live worker, the watch's own events replayed, and 1,074
    fake workers. None is sealed with the watch's key, or each was taken
    already: nothing changes, the view says how many it ignored, and stop
    is clean."""
    from distributed import Client
    from IPython.utils.capture import capture_output
    from test_dask_cluster import bad_batches

    import nbmon.dask
    from nbmon.dask.wire import pack

    from nbmon.kernel.session import SESSION

    ip.user_ns["harm_client"] = dask_client
    with capture_output():
        ip.run_line_magic("resmon", "--dask harm_client --session kernel")   # its view in this process: read here
    watch = nbmon.dask.watching()
    try:
        assert watch.ready(20)
        ((view, *_),) = SESSION.host.cluster_views
        seen = FrontEnd(view)
        real = watch.registered[0]
        columns = watch.collector.feeds[real].decoder.columns
        with Client(dask_client.scheduler.address, set_as_default=False) as other:   # any client of the scheduler
            forged = [{"v": 2, "b": pack({"p": [pack(msg)], "period_s": 1.0}), "k": b"\0" * 16}
                      for _, msg in bad_batches(columns, time_now())]
            # The old wire's form (but the number as an address: Dask sends no such map)
            forged += [{**msg, "w": real} for _, msg in bad_batches(columns, time_now())[1:]]
            forged += [{"left": real}, {"joined": "tcp://fake:1"}, [1, 2, 3], "hello"]
            forged += [msg for _, msg in other.get_events(watch.topic)]   # replayed: each taken already
            forged += [{"v": 2, "b": pack({"p": [pack({**bad_batches(columns, time_now())[0][1], "i": f"fake{k}"})]}),
                        "k": b"\1" * 16} for k in range(1074)]
            for msg in forged:
                other.log_event(watch.topic, msg)
            wait_until(lambda: watch.collector.unread >= len(forged), what=lambda: f"{watch.collector.unread} ignored")
        view.refresh(force=True)
        seen.read()
        xs = np.concatenate([x for x, _ in seen.points.values()])
        x_range = [float(xs.min()), float(xs.max())]   # what the front end's x axis spans
        title = seen.title + " " + " ".join(note["text"] for note in seen.layout["annotations"])
        figure("events from another client on the watch's topic", sent=len(forged), ignored=watch.collector.unread,
               errors=watch.collector.errors, workers=len(watch.collector.feeds),
               x_range=[round(x, 1) for x in x_range], view_errors=view.errors)
        assert watch.collector.errors == 0 and view.errors == 0
        assert sorted(watch.collector.feeds) == sorted(watch.registered)
        assert all(f.state == "live" for f in watch.collector.workers())
        assert 0 <= x_range[0] < x_range[1] <= time_now() - watch.collector.t0
        assert "event(s) on the topic ignored" in title
    finally:
        with capture_output() as stopped:
            ip.run_line_magic("resmon", "stop")
    assert nbmon.dask.watching() is None
    assert "Traceback" not in stopped.stdout + stopped.stderr
    assert dask_client.run(nbmon_threads_here) == {w: [] for w in dask_client.scheduler_info()["workers"]}


def time_now() -> float:
    import time

    return time.time()


def test_a_host_lock_the_other_user_holds_leaves_the_hosts_figures_reported(dask_client, other_user, protected):
    """The second user creates and holds (flock) the lock file before the
    watch starts, at the name the workers would use (from the topic: any
    client of the scheduler sees the topics)."""
    import hashlib
    import math

    from nbmon.dask.client import Watch
    from nbmon.options import Options

    watch = Watch(dask_client, Options(gpu=False))
    planted = f"/dev/shm/nbmon-host-{hashlib.sha1(watch.topic.encode()).hexdigest()[:20]}.lock"
    holder = other_user.popen([other_user.python_exe, "-c", HOLD_LOCK, planted], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "ready\n"
    watch.start()
    try:
        def machine_figures():
            for feed in watch.collector.workers():
                if feed.store is not None and len(feed.store) and feed.about.get("machine"):
                    _, _, values = feed.store.series(["sys_mem_used_mb"])
                    if any(not math.isnan(v) for v in values["sys_mem_used_mb"]):
                        return feed
            return None

        reporter = wait_until(machine_figures, timeout=20, what="a worker reporting the host's memory")
        figure(f"Dask host lock held by another user (protected {'on' if protected else 'off'})",
               reporter=reporter.address,
               reporters=sum(bool(f.about.get("machine")) for f in watch.collector.workers()))
    finally:
        assert watch.stop() == {}


@pytest.mark.parametrize("home_mode", [0o700, 0o777])
def test_a_private_directory_the_other_user_made_first_is_passed_over_or_said(other_user, shared_dir, tmp_path,
                                                                              monkeypatch, home_mode):
    """On a host where /tmp is shared (here a directory like it, as TMPDIR of
    the workers), the second user made ``nbmon-<uid>`` before the victim:
    the host lock is kept under the victim's home instead, and the host's
    figures come; where the home is open to others too, the view says why
    there are none."""
    from distributed import Client, LocalCluster

    import nbmon.dask
    from nbmon.views.cluster import ClusterView

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, home_mode)
    monkeypatch.setenv("TMPDIR", shared_dir)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    other_user.python("import os, sys; os.mkdir(sys.argv[1], 0o777)", os.path.join(shared_dir, f"nbmon-{os.geteuid()}"))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        watch = nbmon.dask.watch(client, gpu=False)
        try:
            assert watch.ready(20)
            view = ClusterView(watch, start=False)
            (feed,) = watch.collector.workers()
            if home_mode == 0o700:
                wait_until(lambda: feed.about.get("machine"), what="the host's figures from the worker")
            reporting = feed.about.get("machine")
            view.refresh(force=True)
            said = " ".join(note["text"] for note in view.widget._nbmon["layout"]["annotations"])
            record = view.close().html
        finally:
            nbmon.dask.unwatch()
    figure(f"private directory taken by another user, home {home_mode:o}", said=said)
    if home_mode == 0o700:
        assert reporting and "no machine figures" not in said + record
        assert os.listdir(home / ".cache" / "nbmon")   # the host lock's place
    else:
        expected = (f"no machine figures on {feed.host}: no host lock: no private directory for nbmon: "
                    f"{shared_dir}/nbmon-{os.geteuid()} belongs to uid")
        assert expected in said and expected in record
        assert "is writable by other users" in said
        assert not reporting


def test_a_user_who_may_not_remove_the_planted_file_is_told_before_anything_runs(other_user, shared_dir, tmp_path):
    """Not root, the victim may not unlink the second user's file in a sticky
    directory: ``--force`` is refused in one sentence, before the command
    runs, and their file is neither written nor truncated."""
    import contextlib
    import io

    from helpers import in_forked_child
    from multiuser import local_user

    from nbmon import cli

    out = os.path.join(shared_dir, "run.csv")
    other_user.python("import os, sys; open(sys.argv[1], 'w').write('theirs\\n'); os.chmod(sys.argv[1], 0o666)", out)
    marker = os.path.join(shared_dir, "ran")
    with local_user() as victim:
        def as_victim():
            os.setgroups([])
            os.setgid(victim.gid)
            os.setuid(victim.uid)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = cli.main(["run", "--interval", "0.05", "--csv", out, "--force", "--",
                                 "/bin/sh", "-c", f": > {marker}"])
            return {"code": code, "stderr": err.getvalue()}

        said = in_forked_child(as_victim)
    figure("--force over another user's file, not root", exit=said["code"], said=said["stderr"].strip(),
           their_file=open(out).read()[:40])
    assert said["code"] == 2 and said["stderr"] == (
        f"nbmon: error: cannot replace {out!r}: it belongs to another user, in a directory where only "
        f"a file's owner may remove it\n")
    assert open(out).read() == "theirs\n" and not os.path.exists(marker)
