"""Why did my kernel die? Real kernels (ipykernel, driven by nbclient) with
nbmon loaded: one in a real memory cgroup allocating until the OOM killer
kills it, one killed by SIGKILL, one shut down normally, two at once. The
truth comes from outside nbmon: the limit the test sets, the cgroup's own
OOM-kill counter, the kernel's exit status, the prompt numbers the kernel
gave, the box directory as listed by the test."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from cgroups import MemoryCgroup
from helpers import wait_until
from nbmon.postmortem.blackbox import CHECK_EVERY_S, read_box
from nbmon.report.notebooks import RECORD_MIME

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
LIMIT_MB = 450
WARNING = re.compile(r"nbmon: this kernel's container is at (\d+(?:\.\d+)?) % of its (.+?) memory limit \((.+?)\); "
                     r"at the limit the kernel is killed")
# Grows by 2 MiB every 25 ms (~80 MiB/s, a quick data loader): slow enough that the
# last tenth of the limit lasts several of the warning's checks (0.25 s apart).
FILL = ("%%resmon --label fill --memory-guard off\n"   # the kill itself, not the guard's stop
        "import time\n"
        "chunks = []\n"
        "while True:\n"
        "    chunks.append(b'x' * (2 << 20))\n"
        "    time.sleep(0.025)")


@pytest.fixture
def private_dir(tmp_path, monkeypatch):
    """A private runtime directory of the test's own (the kernels inherit it):
    nbmon's boxes go to <it>/nbmon/boxes."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime / "nbmon" / "boxes"


def boxes(directory: Path) -> dict[str, int]:
    """{file name: pid} of the box directory, as listed (not as nbmon says);
    a box being created (a hidden name until it has its header) is not one yet."""
    if not directory.is_dir():
        return {}
    return {name: int(name.split("-", 1)[0]) for name in os.listdir(directory) if not name.startswith(".")}


class Kernel:
    """A real kernel for ``notebook`` (JPY_SESSION_NAME, as the Jupyter server
    sets it), started by nbclient; ``run(source)`` executes one cell and
    returns it with its outputs; a kernel that dies mid-cell raises
    DeadKernelError there and keeps the outputs it sent."""

    def __init__(self, notebook: str, kernel_name: str = "python3"):
        self.nb = new_notebook(metadata={"kernelspec": KERNELSPEC})
        self.client = NotebookClient(self.nb, timeout=180, kernel_name=kernel_name, allow_errors=False)
        self.env = {**os.environ, "JPY_SESSION_NAME": notebook}
        self.process = self.pid = None

    def __enter__(self) -> "Kernel":
        self._setup = self.client.setup_kernel(env=self.env)
        self._setup.__enter__()
        self.process = self.client.km.provisioner.process
        self.pid = self.process.pid
        # A graceful shutdown may take more than jupyter_client's 5 s on a loaded
        # machine; after half of this it sends SIGTERM, and an exit of its own accord reads -15.
        self.client.km.shutdown_wait_time = 60.0
        return self

    def __exit__(self, *exc) -> None:
        self._setup.__exit__(*exc)

    def run(self, source: str):
        cell = new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        return cell


def stderr_of(cell) -> str:
    return "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == "stderr")


def stdout_of(cell) -> str:
    return "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == "stdout")


def html_of(cell) -> list[str]:
    return [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]


def postmortems(cell) -> list[str]:
    return [h for h in html_of(cell) if " died" in h and "nbmon-summary" in h]


def last_death(kernel: Kernel) -> dict | None:
    out = stdout_of(kernel.run("import json, nbmon\n"
                               "d = nbmon.last_death()\n"
                               "print(json.dumps(d and d.to_dict()))"))
    return json.loads(out)


def kill_when(path: Path, pid: int) -> threading.Thread:
    """SIGKILL ``pid`` once ``path`` exists (the cell writes it when it is well under way)."""
    def watch():
        deadline = time.monotonic() + 120
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def without_swap(group: MemoryCgroup) -> None:
    """At the limit the group's processes are killed, not swapped out."""
    name, value = ("memory.swappiness", "0") if group.version == 1 else ("memory.swap.max", "0")
    with open(os.path.join(group.path, name), "w") as f:
        f.write(value)


@pytest.fixture
def limited_kernelspec(tmp_path, monkeypatch):
    """A kernel spec whose kernel runs in its own memory cgroup (limited to
    LIMIT_MB, no swap): as a kernel in a container does. Yields (kernel
    name, the group)."""
    with kernelspec_limited_to(LIMIT_MB, tmp_path, monkeypatch) as limited:
        yield limited


@contextlib.contextmanager
def kernelspec_limited_to(limit_mb: float, tmp_path, monkeypatch):
    """:func:`limited_kernelspec` at ``limit_mb``."""
    with MemoryCgroup(limit_mb=limit_mb) as group:
        without_swap(group)
        spec = tmp_path / "jupyter" / "kernels" / "limited"
        spec.mkdir(parents=True)
        # The shell moves itself into the group, then becomes the kernel (same pid).
        launch = 'echo $$ > "$1/cgroup.procs" && exec "$2" -m ipykernel_launcher -f "$0"'
        (spec / "kernel.json").write_text(json.dumps({
            "argv": ["/bin/sh", "-c", launch, "{connection_file}", group.path, sys.executable],
            "display_name": "limited", "language": "python"}))
        monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
        yield "limited", group


def test_oom_kill_warned_before_and_told_after(private_dir, limited_kernelspec, tmp_path):
    kernel_name, group = limited_kernelspec
    notebook = str(tmp_path / "train.ipynb")
    with Kernel(notebook, kernel_name) as first:
        first.run("%load_ext nbmon")
        with pytest.raises(DeadKernelError):
            fill = first.run(FILL)
        fill = first.nb.cells[-1]
        status = first.process.wait(30)
    # What killed it, from outside nbmon: the cgroup's own counter and the exit status.
    assert group.oom_kills() >= 1 and status == -signal.SIGKILL
    # The warning line came in the cell's output before the kill: once, with the limit set.
    warnings = WARNING.findall(stderr_of(fill))
    assert len(warnings) == 1, fill.outputs
    percent, limit, _used = warnings[0]
    assert 90 <= float(percent) < 100 and limit == f"{LIMIT_MB} MiB", warnings
    number = fill.execution_count
    assert isinstance(number, int) and number >= 2, number

    with Kernel(notebook) as second:
        load = second.run("%load_ext nbmon")
        (record,) = postmortems(load)
        assert "killed by the container&#x27;s OOM killer at" in record, record
        assert f"of its {LIMIT_MB} MiB memory limit" in record, record
        assert f"[{number}] %%resmon --label fill" in record, record
        death = last_death(second)
    assert death["cause"] == "oom" and death["oom_kills"] >= 1, death
    assert death["memory_limit_mb"] == LIMIT_MB, death
    assert death["memory_peak_mb"] >= 0.85 * LIMIT_MB, death
    assert death["cell"]["number"] == number and death["cell"]["running"], death
    assert death["notebook"] == notebook, death

    # Shown once; still there as data.
    with Kernel(notebook) as third:
        assert postmortems(third.run("%load_ext nbmon")) == []
        assert last_death(third)["cause"] == "oom"


WAIT_THEN_SIGNAL = ("import pathlib, time\n"
                    "time.sleep(1.5)\n"
                    "pathlib.Path({flag!r}).write_text('')\n"
                    "time.sleep(120)")


def test_sigkill_is_no_oom(private_dir, tmp_path):
    notebook = "analysis.ipynb"
    flag = tmp_path / "running"
    with Kernel(notebook) as first:
        first.run("%load_ext nbmon")
        first.run("%resmon auto on")
        kill_when(flag, first.pid)
        with pytest.raises(DeadKernelError):
            first.run(WAIT_THEN_SIGNAL.format(flag=str(flag)))
        number = first.nb.cells[-1].execution_count
        assert first.process.wait(30) == -signal.SIGKILL
    with Kernel(notebook) as second:
        load = second.run("%load_ext nbmon")
        (record,) = postmortems(load)
        assert "stopped without exiting normally" in record and "OOM killer" not in record
        assert f"[{number}] import pathlib, time" in record
        death = last_death(second)
        nbformat.write(second.nb, tmp_path / "restarted.ipynb")
    assert death["cause"] == "unknown" and death["oom_kills"] == 0
    assert death["cell"]["number"] == number and death["pid"] == first.pid
    # The post-mortem is data in the saved notebook too (issue 45), which nbmon report reads.
    [data] = [o["data"][RECORD_MIME] for o in load.outputs if RECORD_MIME in o.get("data", {})]
    assert data["kind"] == "postmortem" and data["death"]["pid"] == first.pid
    report = subprocess.run([sys.executable, "-m", "nbmon.cli", "report", tmp_path / "restarted.ipynb"],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert f"an earlier kernel of this notebook died in cell [{number}]: " in report.stdout, report.stdout


def test_normal_shutdown_leaves_no_box_and_no_postmortem(private_dir):
    notebook = "clean.ipynb"
    with Kernel(notebook) as first:
        first.run("%load_ext nbmon")
        first.run("%resmon auto on")
        first.run("x = sum(range(10**6))")
        # While it watches, the kernel has its box.
        wait_until(lambda: first.pid in boxes(private_dir).values(), what="the kernel's black box")
    assert first.process.wait(30) == 0   # it exited of its own accord
    assert first.pid not in boxes(private_dir).values()
    with Kernel(notebook) as second:
        assert postmortems(second.run("%load_ext nbmon")) == []
        assert last_death(second) is None


def test_two_kernels_at_once_each_their_own_box(private_dir, tmp_path):
    flag = tmp_path / "a-running"
    with Kernel("a.ipynb") as a, Kernel("b.ipynb") as b:
        # a in auto mode (a thread samples it), b with the live dashboard (a helper process does)
        for kernel, watch in ((a, "%resmon auto on"), (b, "%resmon")):
            kernel.run("%load_ext nbmon")
            kernel.run(watch)
        wait_until(lambda: {a.pid, b.pid} <= set(boxes(private_dir).values()), what="a box for each kernel")
        assert len(boxes(private_dir)) == 2
        kill_when(flag, a.pid)
        with pytest.raises(DeadKernelError):
            a.run(WAIT_THEN_SIGNAL.format(flag=str(flag)))
        a.process.wait(30)
        # b lives: a new kernel of b's notebook has nothing to say, and b is never listed dead.
        with Kernel("b.ipynb") as b2:
            assert postmortems(b2.run("%load_ext nbmon")) == []
            assert last_death(b2) is None
        listed = subprocess.run([sys.executable, "-m", "nbmon.cli", "postmortem"], capture_output=True,
                                text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert f"pid {a.pid} " in listed.stdout and f"pid {b.pid} " not in listed.stdout, listed.stdout
        assert b.pid in boxes(private_dir).values()
        with Kernel("a.ipynb") as a2:
            (record,) = postmortems(a2.run("%load_ext nbmon"))
            assert f"pid {a.pid} " in record and "a.ipynb" in record
    assert b.pid not in boxes(private_dir).values()  # b shut down normally: its box went with it


@pytest.fixture
def other_host_kernelspec(tmp_path, monkeypatch):
    """A kernel as on another host whose home (and so nbmon's private
    directory) this one shares: a host name and a boot id of its own (its
    own UTS and mount namespaces, a file bound over the kernel's boot_id).
    Yields the kernel name and the host name."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes namespaces and bind-mounts a boot id")
    boot = tmp_path / "boot_id"
    boot.write_text("0f0e0d0c-0b0a-4908-8706-050403020100\n")
    spec = tmp_path / "jupyter" / "kernels" / "otherhost"
    spec.mkdir(parents=True)
    host = "nbmon-other-host"
    launch = f'hostname {host} && mount --bind "$1" /proc/sys/kernel/random/boot_id && ' \
             'exec "$2" -m ipykernel_launcher -f "$0"'
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["unshare", "--uts", "--mount", "--propagation", "private", "/bin/sh", "-c", launch,
                 "{connection_file}", str(boot), sys.executable],
        "display_name": "other host", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    yield "otherhost", host


def test_a_kernel_on_another_host_sharing_the_directory_is_told_there_only(private_dir, other_host_kernelspec):
    """A live kernel of the same notebook on another host: never a death
    here (before: "the host restarted while the kernel ran", and its box
    renamed as shown); once it died, told by the next kernel on its host."""
    kernel_name, host = other_host_kernelspec
    notebook = "shared.ipynb"
    with Kernel(notebook, kernel_name) as far:
        far.run("%load_ext nbmon")
        far.run("%resmon auto on")
        wait_until(lambda: far.pid in boxes(private_dir).values(), what="the far kernel's black box")
        (name,) = boxes(private_dir)
        with Kernel(notebook) as near:
            assert postmortems(near.run("%load_ext nbmon")) == []
            assert last_death(near) is None
        listed = subprocess.run([sys.executable, "-m", "nbmon.cli", "postmortem"], capture_output=True,
                                text=True, timeout=60)
        assert f"a kernel on another host ({host})" in listed.stderr, listed.stderr
        assert list(boxes(private_dir)) == [name]   # untouched: still a live kernel's .box
        os.kill(far.pid, signal.SIGKILL)
        assert far.process.wait(30) == -signal.SIGKILL
    with Kernel(notebook) as near:
        assert postmortems(near.run("%load_ext nbmon")) == []   # dead or not cannot be told from here
    with Kernel(notebook, kernel_name) as again:
        (record,) = postmortems(again.run("%load_ext nbmon"))
        assert "stopped without exiting normally" in record and "restarted" not in record, record
        assert f"pid {far.pid} on {host}" in record, record


# The kernel's main thread in a C call that keeps the GIL (a PyDLL call does), while a child it started
# grows the container's memory past the warning until the OOM killer ends the child. Neither the kernel's
# pipe (its relay thread waits for the GIL) nor the warning said into it may hold the box back.
GROWTH_STEP_MB, GROWTH_STEP_S = 2, 0.025   # the child's growth: this many MiB every this many seconds
GROWS = ("import time\nchunks = []\nwhile True:\n"
         f"    chunks.append(b'x' * ({GROWTH_STEP_MB} << 20))\n    time.sleep({GROWTH_STEP_S})")
GROWTH_PER_CHECK_MB = GROWTH_STEP_MB * CHECK_EVERY_S / GROWTH_STEP_S   # between two of the box's reads near the limit
GIL_HELD_S = 12
GIL_HELD = ("%%resmon --label held --memory-guard off\n"
            "import ctypes, subprocess, sys\n"
            f"grows = subprocess.Popen([sys.executable, '-c', {GROWS!r}])\n"
            f"ctypes.PyDLL(None).sleep({GIL_HELD_S})   # the GIL kept throughout\n"
            "grows.kill()\n"
            "grows.wait()")


def test_the_box_keeps_its_records_while_the_kernel_holds_the_gil(private_dir, limited_kernelspec, tmp_path):
    kernel_name, group = limited_kernelspec
    killed_at = []

    def watch_kills() -> None:   # the test's own clock of the OOM kill, from the group's counter
        deadline = time.monotonic() + 120
        while not killed_at and time.monotonic() < deadline:
            if group.oom_kills():
                killed_at.append(time.time())
            time.sleep(0.02)

    with Kernel(str(tmp_path / "held.ipynb"), kernel_name) as kernel:
        kernel.run("%load_ext nbmon")
        kernel.run("%resmon")   # a live chart: its frames fill the kernel's pipe while it reads nothing
        watcher = threading.Thread(target=watch_kills, daemon=True)
        watcher.start()
        began = time.time()
        kernel.run(GIL_HELD)
        ended = time.time()
        watcher.join(10)
        (name,) = boxes(private_dir)
        records = read_box(str(private_dir / name)).records
    assert killed_at and began < killed_at[0] < ended, (began, killed_at, ended)
    # A record every second while the GIL was held: none missing around the kill.
    walls = [r.wall for r in records if began <= r.wall <= began + GIL_HELD_S]
    gaps = [b - a for a, b in zip(walls, walls[1:])]
    assert len(walls) >= GIL_HELD_S - 2 and max(gaps) < 2.5, walls
    assert any(abs(wall - killed_at[0]) < 1.5 for wall in walls), (walls, killed_at)
    # The container's peak as the box has it: the group's own high-water mark, less at most the growth
    # between two of its reads (and one more: a read late on a loaded machine).
    box_peak = max(r.values["cgroup_mem_used_mb"] for r in records if r.values["cgroup_mem_used_mb"] == r.values[
        "cgroup_mem_used_mb"])
    assert box_peak >= group.peak_mb() - 2 * GROWTH_PER_CHECK_MB, (box_peak, group.peak_mb())
