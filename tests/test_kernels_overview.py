"""Every kernel at a glance (issue 44): ``nbmon kernels``, ``nbmon top`` and
``nbmon.kernels()`` over real kernels started by jupyter_client, each with
the notebook name a Jupyter server gives it (JPY_SESSION_NAME). The truth is
read by the test from /proc: each process of a kernel's tree and its PSS
(``smaps_rollup``), the sizes the cells allocate, the cell that runs."""
from __future__ import annotations

import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import fcntl
import time

import pytest
from jupyter_client import KernelManager

from helpers import wait_until
from multiuser import other_user  # noqa: F401 - a fixture
from nbmon.private import pid_started
from nbmon.sources.kernels import connection_file, find_kernels

MIB = 1 << 20
PSS_MARGIN_MB = 8   # the tree read twice a moment apart (the table's, the test's): idle kernels move by < 2 MiB
RUNNING = "import time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < 120:\n    time.sleep(0.05)"
CELLS = {
    "big.ipynb": ["import numpy as np\nbig = np.ones(300 << 17)   # 300 MiB"],
    "workers.ipynb": ["import multiprocessing as mp\nimport numpy as np\nshared = np.ones(200 << 17)   # 200 MiB",
                      "pool = mp.get_context('fork').Pool(4)\npool.map(abs, range(8))"],
    "idle.ipynb": ["x = 1"],
    "watched.ipynb": ["%load_ext nbmon", "%resmon auto on"],
}


class Kernel:
    """A real kernel of a notebook named ``name`` (its JPY_SESSION_NAME)."""

    def __init__(self, name: str, directory):
        self.name = str(directory / name)
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env={**os.environ, "JPY_SESSION_NAME": self.name}, stderr=subprocess.DEVNULL)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.pid = self.km.provisioner.process.pid

    def run(self, code: str) -> dict:
        reply = self.kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply

    def close(self) -> None:
        """Shut the kernel down, and end what it left (a pool's forked workers outlive it, blocked for good)."""
        try:
            left = {pid: pid_started(pid) for pid in tree_pids(self.pid, helpers=True)}
        except OSError:   # gone already
            left = {}
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        for pid, started in left.items():
            if started is not None and pid_started(pid) == started:
                os.kill(pid, signal.SIGKILL)


HELPER = b"nbmon.helper.serve:main"   # on the command line of nbmon's helper, which %resmon leaves out


def tree_pids(pid: int, helpers: bool = False) -> list[int]:
    """The process and its descendants, walked through /proc by the test;
    nbmon's helper (and what it started) only with ``helpers``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with open(f"/proc/{p}/cmdline", "rb") as f:
            if not helpers and HELPER in f.read():
                continue
        out.append(p)
        for task in os.listdir(f"/proc/{p}/task"):
            with open(f"/proc/{p}/task/{task}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return out


def smaps_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/smaps_rollup")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    directory = tmp_path_factory.mktemp("notebooks")
    runtime = tmp_path_factory.mktemp("runtime")
    os.chmod(runtime, 0o700)
    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)   # the watched kernel's black box, where the table reads it
    started = {}
    try:
        for name, cells in CELLS.items():
            started[name] = kernel = Kernel(name, directory)
            for code in cells:
                kernel.run(code)
        watched = started["watched.ipynb"]
        watched.kc.execute(RUNNING)   # runs on while the tests read the table
        yield started
    finally:
        for kernel in started.values():
            kernel.close()
        if saved is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved


def table(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "nbmon.cli", "kernels", "--json", *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def ours(shown: dict, kernels: dict) -> dict:
    by_name = {k.name: name for name, k in kernels.items()}
    return {by_name[row["notebook"]]: row for row in shown["kernels"] if row["notebook"] in by_name}


def test_every_kernel_is_one_row_with_its_trees_memory_as_the_machine_sees_it(kernels):
    rows = wait_until(lambda: (r := ours(table(), kernels)) and r["watched.ipynb"]["state"] == "busy" and r,
                      what="the watched kernel busy in the table", timeout=60)
    assert sorted(rows) == sorted(CELLS)   # one row each: the forked workers are no kernels of their own
    for name, kernel in kernels.items():
        row, pids = rows[name], tree_pids(kernel.pid)
        truth = sum(smaps_mb(p, "Pss") for p in pids)
        assert row["pid"] == kernel.pid and row["proc_count"] == len(pids), (name, row, pids)
        assert abs(row["proc_pss_mb"] - truth) <= PSS_MARGIN_MB, (name, row["proc_pss_mb"], truth)
        assert row["kernel_id"] == kernel.km.kernel_id or row["kernel_id"] in kernel.km.connection_file
        assert row["age_s"] > 0 and row["this"] is False
    assert rows["big.ipynb"]["proc_pss_mb"] >= 300
    # Four workers share the 200 MiB: counted once (their RSS would count it five times).
    workers = tree_pids(kernels["workers.ipynb"].pid)
    assert len(workers) == 5
    assert sum(smaps_mb(p, "Rss") for p in workers) - rows["workers.ipynb"]["proc_pss_mb"] > 700
    assert 200 <= rows["workers.ipynb"]["proc_pss_mb"] <= 200 + 5 * 60
    # nbmon watches one: its helper is a child of the kernel, and left out as %resmon leaves it out.
    assert len(tree_pids(kernels["watched.ipynb"].pid, helpers=True)) == rows["watched.ipynb"]["proc_count"] + 1
    # Its running cell; the others are not watched.
    watched = rows["watched.ipynb"]
    assert watched["watched"] and watched["cell_number"] == len(CELLS["watched.ipynb"]) + 1, watched
    assert watched["cell_label"].startswith("import time") and watched["busy_s"] > 0, watched
    assert [n for n, r in rows.items() if not r["watched"]] == ["big.ipynb", "workers.ipynb", "idle.ipynb"]
    assert all(r["state"] == "" for n, r in rows.items() if n != "watched.ipynb")


def test_a_kernels_gpu_memory_is_its_processes_on_every_gpu(kernels, fake_gpu):
    # NVML's per-process lists (the stand-in library, read by the real pynvml): a worker of one
    # kernel on GPU 0, another kernel itself on both GPUs; a pid of no kernel's tree on GPU 1.
    worker = tree_pids(kernels["workers.ipynb"].pid)[-1]
    big = kernels["big.ipynb"].pid
    # Their utilisation: NVML's sample of each process, summed over the tree's (100 = one GPU).
    fake_gpu.set(devices=[{"name": "FakeGPU-A", "mem_total": 16 << 30}, {"name": "FakeGPU-B", "mem_total": 16 << 30}],
                 procs={0: [(worker, 512 * MIB, 35), (big, 1024 * MIB, 40)], 1: [(big, 256 * MIB, 25), (1, 64 * MIB, 90)]})
    rows = ours(table(), kernels)
    assert rows["workers.ipynb"]["gpu_proc_mem_mb"] == 512 and rows["big.ipynb"]["gpu_proc_mem_mb"] == 1280, rows
    assert rows["workers.ipynb"]["gpu_proc_util_percent"] == 35 and rows["big.ipynb"]["gpu_proc_util_percent"] == 65
    assert rows["idle.ipynb"]["gpu_proc_mem_mb"] == 0 and rows["idle.ipynb"]["gpu_proc_util_percent"] == 0
    assert [r["notebook"] for r in table("--sort", "gpu")["kernels"]][:2] == [
        kernels["big.ipynb"].name, kernels["workers.ipynb"].name]


def test_a_watched_kernels_peak_is_its_last_minutes_highest(kernels, tmp_path):
    # A kernel nbmon watches held 200 MiB for two seconds, then freed it: the table's peak
    # (from its black box) stands that far above what the test reads of its tree now.
    peak = Kernel("peak.ipynb", tmp_path)
    try:
        peak.run("%load_ext nbmon\n%resmon auto on")
        peak.run("import time, numpy as np\nheld = np.ones(200 << 17)\ntime.sleep(2.0)\ndel held")
        row = next(r for r in table()["kernels"] if r["pid"] == peak.pid)
        now = sum(smaps_mb(p, "Pss") for p in tree_pids(peak.pid))
        assert row["proc_pss_peak_mb"] - now > 200 - PSS_MARGIN_MB, (row, now)
        assert row["proc_pss_peak_mb"] - now < 200 + 3 * PSS_MARGIN_MB, (row, now)
    finally:
        peak.close()
    others = ours(table(), kernels)
    assert others["watched.ipynb"]["proc_pss_peak_mb"] >= others["watched.ipynb"]["proc_pss_mb"] - PSS_MARGIN_MB
    assert others["idle.ipynb"]["proc_pss_peak_mb"] is None   # not watched: unknown, never guessed


def test_the_table_is_sorted_and_totalled(kernels):
    shown = table("--sort", "age")
    ages = [row["age_s"] for row in shown["kernels"]]
    assert ages == sorted(ages, reverse=True)
    by_memory = table()
    memory = [row["proc_pss_mb"] for row in by_memory["kernels"]]
    assert memory == sorted(memory, reverse=True)
    assert abs(by_memory["total"]["proc_pss_mb"] - sum(memory)) < 0.01
    assert by_memory["room_mb"] > 0 and by_memory["limit_mb"] >= by_memory["room_mb"]
    text = subprocess.run([sys.executable, "-m", "nbmon.cli", "kernels"], capture_output=True, text=True,
                          timeout=120).stdout.splitlines()
    assert text[0].split()[:3] == ["NOTEBOOK", "PID", "AGE"]
    assert [line for line in text if line.strip().startswith(str(kernels["big.ipynb"].name)[-30:])] or \
        any("big.ipynb" in line for line in text), text
    assert text[-1].startswith(f"{len(by_memory['kernels'])} kernels: "), text[-1]


def test_the_room_left_is_the_containers_where_it_has_a_limit(kernels):
    # nbmon kernels run in a real 600 MiB memory cgroup the test makes: the total line's room is its limit's.
    from cgroups import MemoryCgroup

    with MemoryCgroup(limit_mb=600) as group:
        code = ("import os, sys\n"
                f"open({os.path.join(group.path, 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
                "from nbmon.cli import main\n"
                "sys.exit(main(['kernels', '--json']))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["room_of"] == "container" and shown["limit_mb"] == 600, shown
    assert 300 < shown["room_mb"] < 600, shown   # less what the command itself holds (~60 MiB)
    assert sorted(ours(shown, kernels)) == sorted(CELLS)


def test_a_kernel_sees_itself_in_its_own_table(kernels):
    idle = kernels["idle.ipynb"]
    got = []
    idle.kc.execute_interactive("import nbmon\nframe = nbmon.kernels()\n"
                                "print(frame.loc[frame['this'], 'notebook'].tolist(), len(frame.columns))",
                                timeout=120, output_hook=lambda m: got.append(m["content"].get("text", "")))
    assert "".join(got).strip() == f"[{idle.name!r}] 17", got


def test_another_users_kernel_is_never_shown(kernels, other_user):  # noqa: F811 - a fixture
    # A process of the other user's with a kernel's command line and a notebook's name.
    other = other_user.popen([other_user.python_exe, "-c", "import time; time.sleep(120)", "-f",
                              f"{other_user.home}/kernel-theirs.json"],
                             env={**other_user.env(), "JPY_SESSION_NAME": "theirs.ipynb"})
    wait_until(lambda: os.path.exists(f"/proc/{other.pid}/cmdline") and b"kernel-theirs" in open(
        f"/proc/{other.pid}/cmdline", "rb").read(), what="the other user's process")
    shown = table()
    assert other.pid not in [row["pid"] for row in shown["kernels"]]
    assert "theirs.ipynb" not in json.dumps(shown)
    # and the same command line as ours is one
    assert other.pid in [k.pid for k in find_kernels(other_user.uid).kernels]


def test_a_planted_notebook_name_reaches_the_terminal_as_text(tmp_path):
    # A kernel's environment is anyone's text: escapes and line breaks in its name
    # are shown as characters, on one line, and nothing the command line names is opened.
    name = "evil\x1b[2J\x1b]0;pwned\x07\nsecond line.ipynb"
    planted = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "-f",
                                str(tmp_path / "kernel-evil.json")],
                               # a kernel by hand (no JPY_PARENT_PID): pytest run from a notebook has one
                               env={**{k: v for k, v in os.environ.items() if k != "JPY_PARENT_PID"},
                                    "JPY_SESSION_NAME": name})
    try:
        wait_until(lambda: any(k.pid == planted.pid for k in find_kernels().kernels), what="the planted kernel")
        done = subprocess.run([sys.executable, "-m", "nbmon.cli", "kernels"], capture_output=True, text=True,
                              timeout=120)
    finally:
        planted.kill()
        planted.wait()
    (line,) = [line for line in done.stdout.splitlines() if str(planted.pid) in line]
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "second line.ipynb" in line, done.stdout
    assert not (tmp_path / "kernel-evil.json").exists()


FORKS = "import os, time\nchild = os.fork()\nif child == 0:\n    time.sleep(600)\n    os._exit(0)\nprint(child)"


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def test_a_killed_kernels_forked_child_is_no_kernel(tmp_path):
    # A kernel SIGKILLed (as the OOM killer ends one) leaves the child it forked, with its command line,
    # to init: no parent with a connection file, yet a kernel's copy, not a kernel.
    dying = Kernel("dying.ipynb", tmp_path)
    child = started = None
    try:
        said = []
        dying.kc.execute_interactive(FORKS, timeout=120,
                                     output_hook=lambda msg: said.append(msg["content"].get("text", "")))
        child = int("".join(said))
        started = pid_started(child)
        os.kill(dying.pid, signal.SIGKILL)
        wait_until(lambda: parent_of(child) != dying.pid, what="the forked child's new parent")
        assert child not in [k.pid for k in find_kernels().kernels]
    finally:
        if child is not None and pid_started(child) == started:
            os.kill(child, signal.SIGKILL)
        dying.close()


@pytest.mark.parametrize("argv, path", [
    (["python", "-m", "ipykernel_launcher", "-f", "/r/kernel-1a.json"], "/r/kernel-1a.json"),
    (["python", "-m", "ipykernel_launcher", "--f=/r/kernel-2.json"], "/r/kernel-2.json"),
    (["julia", "kernel.jl", "--connection-file", "/r/k.json"], "/r/k.json"),
    (["python", "-m", "ipykernel_launcher", "-f", "notes.txt"], None),
    (["python", "-c", "print('-f x.json')"], None),
    (["python", "-f"], None),
])
def test_a_kernels_command_line_names_its_connection_file(argv, path):
    assert connection_file(argv) == path


def _window(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _read_for(fd: int, seconds: float) -> bytes:
    import select

    out, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:   # the other end closed
                break
    return out


@pytest.mark.parametrize("quit_key", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_top_redraws_in_a_terminal_and_quits_cleanly(kernels, quit_key):
    leader, follower = pty.openpty()
    _window(follower, 30, 140)
    top = subprocess.Popen([sys.executable, "-m", "nbmon.cli", "top"], stdin=follower, stdout=follower,
                           stderr=follower, start_new_session=True,
                           preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(follower)
    try:
        shown = _read_for(leader, 6.0)
        assert b"big.ipynb" in shown and b"nbmon top" in shown, shown[-2000:]
        _window(leader, 20, 90)   # a resize: rich follows, nothing breaks
        top.send_signal(signal.SIGWINCH)
        shown += _read_for(leader, 3.0)
        os.write(leader, quit_key)
        assert top.wait(20) == 0
        shown += _read_for(leader, 0.5)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait(10)
        os.close(leader)
    text = shown.decode("utf-8", "replace")
    assert "Traceback" not in text and "Error" not in text, text[-3000:]
    assert text.count("nbmon top") >= 2   # drawn again, in place


def test_top_without_a_terminal_prints_one_table(kernels):
    done = subprocess.run([sys.executable, "-m", "nbmon.cli", "top"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[0].startswith("NOTEBOOK"), done
    assert "\x1b" not in done.stdout
