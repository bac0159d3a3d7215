"""The memory guard (issue 43): a cell that grows towards the container's
limit is stopped with ``nbmon.MemoryGuardError`` before the OOM killer
kills the kernel, and the kernel lives on. Real kernels in a real memory
cgroup the test makes (400 MiB, no swap); the truth is read from outside
nbmon: the kernel's process (the same one, alive), the cgroup's own OOM-kill
counter and usage, the variables the cells made."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from nbclient.exceptions import CellExecutionError, DeadKernelError

from cgroups import MemoryCgroup
from test_postmortem import (Kernel, kernelspec_limited_to, postmortems, private_dir,  # noqa: F401 - a fixture
                             stderr_of, stdout_of, without_swap)

LIMIT_MB = 400
# Grows by 25 MiB every 50 ms, in its own frame: stopped, what it held goes as it unwinds.
GROW = ("import time\n"
        "import numpy as np\n"
        "def grow():\n"
        "    chunks = []\n"
        "    while True:\n"
        "        chunks.append(np.ones(25 << 17))   # 25 MiB\n"
        "        time.sleep(0.05)")
KEPT = "kept = np.arange(1 << 20)\nkept_sum = int(kept.sum())"
STILL_KEPT = "print(int(kept.sum()) == kept_sum)"
# The user's profiler: under CPython 3.11 a guard that left its signal set looped forever here.
PROFILED = ("import cProfile\n"
            "profile = cProfile.Profile()\n"
            "profile.enable()\n"
            "total = sum(abs(i) for i in range(1000))\n"
            "profile.disable()\n"
            "print(total)")


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    with kernelspec_limited_to(LIMIT_MB, tmp_path, monkeypatch) as limited:
        yield limited


def error_of(cell) -> dict:
    (error,) = [o for o in cell.outputs if o["output_type"] == "error"]
    return error


def test_a_growing_cell_is_stopped_and_the_kernel_keeps_its_variables(private_dir, guarded, tmp_path):
    kernel_name, group = guarded
    with Kernel(str(tmp_path / "grow.ipynb"), kernel_name) as kernel:
        kernel.run("%load_ext nbmon")
        kernel.run(GROW + "\n" + KEPT)
        kills = group.oom_kills()
        with pytest.raises(CellExecutionError):
            kernel.run("%%resmon --label grow\ngrow()")
        error = error_of(kernel.nb.cells[-1])
        assert error["ename"] == "MemoryGuardError", error
        assert f"of the container's {LIMIT_MB} MiB memory limit, before the OOM killer" in error["evalue"], error
        # The same kernel, its variables kept, the cell's own memory freed; the next cell runs.
        assert kernel.process.poll() is None and group.oom_kills() == kills
        assert stdout_of(kernel.run(STILL_KEPT)).strip() == "True"
        assert group.usage_mb() < LIMIT_MB / 2
        # A user's own except MemoryError takes it.
        caught = kernel.run("%%resmon --label again\ntry:\n    grow()\n"
                            "except MemoryError as err:\n    print(type(err).__name__)")
        assert stdout_of(caught).strip() == "MemoryGuardError"
        assert kernel.process.poll() is None and group.oom_kills() == kills
        kernel.client.timeout = 60
        assert stdout_of(kernel.run(PROFILED)).strip() == "499500"


def test_the_users_profiler_runs_after_watched_cells(private_dir, tmp_path):
    """cProfile (``%prun``, ``%%prun``) in a kernel nbmon watches, after a
    plain cell, a ``%%resmon`` cell and in one; no stop was asked. Before,
    every cell's end cleared a stop that was never asked for, and the next
    profiled call never returned (CPython 3.11)."""
    with Kernel(str(tmp_path / "profiled.ipynb")) as kernel:
        kernel.client.timeout = 60
        kernel.run("%load_ext nbmon")
        kernel.run("x = 1")
        kernel.run("%%resmon --quiet\ny = 2")
        assert stdout_of(kernel.run(PROFILED)).strip() == "499500"
        assert stdout_of(kernel.run("%%resmon --quiet\n" + PROFILED)).strip() == "499500"
        kernel.run(f"%%prun -q -D {tmp_path / 'prun.stats'}\nsum(range(10))")
        assert (tmp_path / "prun.stats").stat().st_size > 0


def test_with_the_guard_off_the_kernel_is_killed(private_dir, guarded, tmp_path):
    kernel_name, group = guarded
    with Kernel(str(tmp_path / "off.ipynb"), kernel_name) as kernel:
        kernel.run("%load_ext nbmon")
        kernel.run(GROW)
        kills = group.oom_kills()
        with pytest.raises(DeadKernelError):
            kernel.run("%%resmon --memory-guard off\ngrow()")
        kernel.process.wait(30)
    assert group.oom_kills() > kills


def test_a_cell_that_ends_past_the_line_leaves_the_next_cell_alone(private_dir, guarded, tmp_path):
    """The line crossed as the cell ends: whether or not that cell was
    stopped, the next one (still past the line: the same crossing) runs."""
    kernel_name, group = guarded
    fill = (f"%%resmon --label fill\n"
            f"import pathlib\nimport numpy as np\n"
            f"group = pathlib.Path({group.path!r})\n"
            f"usage = {('memory.current' if group.version == 2 else 'memory.usage_in_bytes')!r}\n"
            f"def used_mb():\n"
            f"    return int((group / usage).read_text()) / 2**20\n"
            f"held = []\n"
            f"while used_mb() < {0.96 * LIMIT_MB}:\n"
            f"    held.append(np.ones(2 << 17))   # 2 MiB")
    with Kernel(str(tmp_path / "edge.ipynb"), kernel_name) as kernel:
        kernel.run("%load_ext nbmon")
        kills = group.oom_kills()
        try:
            kernel.run(fill)
        except CellExecutionError:
            assert error_of(kernel.nb.cells[-1])["ename"] == "MemoryGuardError"
        after = kernel.run("import time\ntime.sleep(1.0)\nprint('ran')")
        assert stdout_of(after).strip() == "ran" and not [o for o in after.outputs if o["output_type"] == "error"]
        assert kernel.process.poll() is None and group.oom_kills() == kills


def test_one_allocation_past_the_limit_is_killed_and_the_postmortem_says_why(private_dir, guarded, tmp_path):
    """What the guard cannot stop: one allocation (filled in C) past the limit."""
    kernel_name, group = guarded
    notebook = str(tmp_path / "big.ipynb")
    with Kernel(notebook, kernel_name) as kernel:
        kernel.run("%load_ext nbmon")
        kills = group.oom_kills()
        with pytest.raises(DeadKernelError):
            kernel.run(f"%%resmon\nimport numpy as np\nbig = np.ones({LIMIT_MB + 100} << 17)")
        kernel.process.wait(30)
    assert group.oom_kills() > kills
    with Kernel(notebook) as second:
        (record,) = postmortems(second.run("%load_ext nbmon"))
    assert "killed by the container&#x27;s OOM killer" in record, record
    assert "the memory guard could not stop the cell in time" in record, record



@pytest.mark.parametrize("rate_mb_s", [100, 500, 1000])
def test_a_fast_cell_is_stopped_before_the_line_whenever_the_reads_fall(monkeypatch, rate_mb_s):
    """The guard's decision over a made-up clock and memory (a real cgroup
    cannot be timed to the millisecond): a cell that grows at ``rate_mb_s``
    in 25 MiB steps from 150 MiB of a 400 MiB limit, the guard called as the
    consumer thread calls it (``every_s`` apart, a millisecond late; 5 ms
    after the cell starts, hurried by its note), for every phase of the
    reads against the cell's start. The stop is asked before the memory
    reaches the line, and a kernel that takes 50 ms to stop (the grow
    loop's sleep) stops under the limit. Before, reads 0.25 s apart gave
    no pace (the window's length), the cell's growth counted from the
    guard's first read of it, and a read that leapt past the near band
    left the limit reached unasked."""
    from nbmon.postmortem import memguard
    from nbmon.postmortem.memwarn import CONTAINER, Level

    step_mb, start_mb, limit_mb, started = 25.0, 150.0, 400.0, 100.3
    line_mb = limit_mb * memguard.DEFAULT_MEMORY_GUARD_PERCENT / 100

    def used_at(t):
        return start_mb + (0 if t < started else step_mb * (1 + int((t - started) * rate_mb_s / step_mb)))

    for phase_ms in range(0, 250, 10):
        clock, stopped = [100.0 + phase_ms / 1000], []
        monkeypatch.setattr(memguard, "time", SimpleNamespace(monotonic=lambda: clock[0], time=lambda: clock[0]))
        guard = memguard.MemoryGuard(os.getpid(), "auto", stop=lambda number, level: stopped.append(clock[0]),
                                     running_cell=lambda: (7, started, "") if clock[0] >= started else None)
        monkeypatch.setattr(guard, "_read", lambda: Level(CONTAINER, used_at(clock[0]), limit_mb))
        hurried = False
        while not stopped and used_at(clock[0]) < limit_mb:
            guard.consume(None, False)
            clock[0] += guard.every_s + 0.001
            if not hurried and clock[0] > started + 0.005:
                clock[0], hurried = max(started + 0.005, clock[0] - guard.every_s - 0.001), True
        assert stopped, f"phase {phase_ms} ms: the limit reached, no stop asked"
        assert used_at(stopped[0]) < line_mb, f"phase {phase_ms} ms: asked past the line"
        assert used_at(stopped[0] + 0.05) < limit_mb, f"phase {phase_ms} ms: too late for the kernel"


# 150 MiB in 25 MiB steps, held a moment and given back; stopped or not, it ends quietly.
TRANSIENT = ("%%resmon --label transient\n"
             "def transient():\n"
             "    chunks = []\n"
             "    for _ in range(6):\n"
             "        chunks.append(np.ones(25 << 17))\n"
             "        time.sleep(0.05)\n"
             "    time.sleep(0.3)\n"
             "try:\n"
             "    transient()\n"
             "except MemoryError:\n"
             "    pass")
GROWTH_MARGIN_MB = 10   # the guard reads 20 a second, the peak is held 0.3 s: 0-1.2 MiB from the truth (idle, loaded)
FORESIGHT = re.compile(r"^nbmon: (?:this cell grew by|the memory guard stopped this cell last time, after it "
                       r"grew by) ([\d.]+) MiB.*; ([\d.]+) MiB is free below the container's 400 MiB memory limit$")


@contextlib.contextmanager
def usage_watched(group: MemoryCgroup):
    """The cgroup's working set (what the OOM killer goes by) as the block
    starts (``before``) and its highest, read every 5 ms while it runs
    (``peak``): the truth, from outside nbmon."""
    seen = SimpleNamespace(before=group.working_set_mb(), peak=0.0)
    done = threading.Event()

    def watch():
        while not done.wait(0.005):
            seen.peak = max(seen.peak, group.working_set_mb())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def test_a_cell_that_needs_more_than_is_free_is_told_so_the_second_time(private_dir, guarded, tmp_path):
    """Foresight, in a real kernel in a 400 MiB cgroup: a cell that grew by
    150 MiB runs once with room (no line), then, with memory held so that
    about 100 MiB is free, again: one line as it starts, with what it grew
    and what is free, as the test read both from the cgroup."""
    kernel_name, group = guarded
    with Kernel(str(tmp_path / "foresight.ipynb"), kernel_name) as kernel:
        kernel.run("%load_ext nbmon")
        kernel.run("import time\nimport numpy as np")
        with usage_watched(group) as usage:
            first = kernel.run(TRANSIENT)
        assert not [line for line in stderr_of(first).splitlines() if FORESIGHT.match(line)], first.outputs
        # Held in 5 MiB steps: one allocation this large, this near the line, is stopped as it comes.
        kernel.run(f"held = []\nfor _ in range({int(LIMIT_MB - 100 - group.usage_mb()) // 5}):\n"
                   f"    held.append(np.ones(5 << 17))\n    time.sleep(0.02)")
        free_mb = LIMIT_MB - group.usage_mb()
        second = kernel.run(TRANSIENT)
        told = [FORESIGHT.match(line) for line in stderr_of(second).splitlines() if FORESIGHT.match(line)]
        assert len(told) == 1, second.outputs
        grown_mb, said_free_mb = map(float, told[0].groups())
        # The container's growth (the 150 MiB and, in the first %%resmon cell, its record's set-up).
        true_growth_mb = usage.peak - usage.before
        assert abs(grown_mb - true_growth_mb) <= GROWTH_MARGIN_MB and abs(said_free_mb - free_mb) <= 30, \
            (grown_mb, true_growth_mb, said_free_mb, free_mb)
        assert kernel.process.poll() is None


# -- nbmon run ---------------------------------------------------------------------

# Grows by 25 MiB every 50 ms; a Ctrl-C (SIGINT) ends it with what it held and exit code 3.
COMMAND_GROWS = ("import time\n"
                 "import numpy as np\n"
                 "chunks = []\n"
                 "try:\n"
                 "    while True:\n"
                 "        chunks.append(np.ones(25 << 17))\n"
                 "        time.sleep(0.05)\n"
                 "except KeyboardInterrupt:\n"
                 "    print(len(chunks) * 25)\n"
                 "    raise SystemExit(3)")


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_nbmon_run_interrupts_a_command_before_its_containers_limit(guard):
    """``nbmon run --memory-guard auto`` in a 400 MiB cgroup the test makes
    (nbmon and the command in it, as in a container): the command gets SIGINT
    before the limit and ends with its own exit code; the group's OOM-kill
    counter did not move. Without the flag (the default for a command), the
    OOM killer kills it, as before."""
    flag = ["--memory-guard", "auto"] if guard else []
    with MemoryCgroup(limit_mb=LIMIT_MB) as group:
        without_swap(group)
        done = subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--quiet", "--no-gpu", *flag, "--",
                               sys.executable, "-c", COMMAND_GROWS],
                              preexec_fn=lambda: group.add(os.getpid()), capture_output=True, text=True, timeout=120)
        kills = group.oom_kills()
    if guard:
        assert done.returncode == 3 and kills == 0, (done.returncode, kills, done.stderr)
        said = done.stderr.splitlines()
        assert len(said) == 1 and said[0].startswith(f"nbmon: sent SIGINT to {sys.executable} at "), said
        assert f"of the container's {LIMIT_MB} MiB memory limit, before the OOM killer would kill it" in said[0]
        assert 150 <= int(done.stdout) < LIMIT_MB, done.stdout   # what it held when interrupted (MiB)
    else:
        assert done.returncode == 128 + signal.SIGKILL and kills >= 1, (done.returncode, kills, done.stderr)
        assert "SIGINT" not in done.stderr


def test_the_guard_reads_cgroup_v2s_files(tmp_path, monkeypatch):
    """cgroup v2 (no v2 hierarchy here: a stand-in of its files, as a pod's):
    the limit is the parent's (the pod says "max"), the usage less v2's
    inactive_file is what the guard goes by, and it stops a growing cell."""
    from nbmon.postmortem import memguard
    from nbmon.sources.cgroup import Cgroup
    from test_cgroup import v2_group

    mib = 1 << 20
    v2_group(str(tmp_path), "kubepods", {"memory.max": f"{400 * mib}\n"})
    pod = v2_group(str(tmp_path), "kubepods/pod1", {
        "memory.max": "max\n", "memory.current": f"{200 * mib}\n", "memory.events": "oom_kill 0\n",
        "memory.stat": f"anon {150 * mib}\nfile {50 * mib}\ninactive_file {30 * mib}\n"})
    monkeypatch.setattr(memguard, "Cgroup", lambda pid: Cgroup(dirs={"memory": pod, "memory_version": "2"}))
    stopped = []
    guard = memguard.MemoryGuard(os.getpid(), "auto", stop=lambda number, level: stopped.append((number, level)),
                                 running_cell=lambda: (3, 1.0, ""))
    level = guard._read()
    assert (level.used_mb, level.limit_mb) == (170.0, 400.0), level
    guard.consume(None, False)
    with open(os.path.join(pod, "memory.current"), "w") as f:
        f.write(f"{420 * mib}\n")   # 390 MiB less the page cache: past the line (380)
    guard.consume(None, False)
    assert [(number, level.used_mb) for number, level in stopped] == [(3, 390.0)], stopped


# -- foresight ---------------------------------------------------------------------

def test_a_cell_that_grew_by_more_than_is_free_is_told_so_as_it_starts(monkeypatch):
    """Over made-up reads of a 400 MiB container: a cell that grew by 150 MiB
    starts again with 100 MiB free -> one line; a cell that grew by 40 MiB
    does not; a cell the guard stopped is told so wherever it starts; the
    guard remembers FORESIGHT_KEPT cells, the newest."""
    from nbmon.postmortem import memguard
    from nbmon.postmortem.memwarn import CONTAINER, Level

    said, used, running, clock = [], [100.0], [None], [100.0]
    monkeypatch.setattr(memguard, "time", SimpleNamespace(monotonic=lambda: clock[0], time=lambda: clock[0]))
    guard = memguard.MemoryGuard(os.getpid(), "auto", stop=lambda number, level: None,
                                 running_cell=lambda: running[0], say=said.append)
    monkeypatch.setattr(guard, "_read", lambda: Level(CONTAINER, used[0], 400.0))

    def run(number, source, *steps):
        running[0] = (number, float(number), source)
        for mb in (used[0], *steps):   # 0.5 s apart: 150 MiB/s at most, a stop only at the line
            used[0] = mb
            guard.consume(None, False)
            clock[0] += 0.5
        running[0] = None
        guard.consume(None, False)
        clock[0] += 0.5

    run(1, "big", 175.0, 250.0, 100.0)            # grew by 150, gave it back
    run(2, "small", 140.0, 100.0)                 # grew by 40
    assert said == []
    used[0] = 300.0                               # 300 held between cells: 100 free
    run(3, "small")
    assert said == []
    run(4, "big")
    assert said == ["nbmon: this cell grew by 150 MiB at its peak last time; 100 MiB is free below "
                    "the container's 400 MiB memory limit"], said
    used[0] = 100.0
    run(5, "fill", 200.0, 300.0, 381.0)           # stopped at the line
    assert guard.stops and guard.stops[-1][2] == 5
    used[0], said[:] = 100.0, []                  # its frames unwound
    run(6, "fill")
    assert said == ["nbmon: the memory guard stopped this cell last time, after it grew by 281 MiB; "
                    "300 MiB is free below the container's 400 MiB memory limit"], said
    for k in range(memguard.FORESIGHT_KEPT):
        run(7 + k, f"cell {k}")
    said.clear()
    run(1000, "fill")
    run(1001, f"cell {memguard.FORESIGHT_KEPT - 1}")
    assert said == [] and len(guard._grown) == memguard.FORESIGHT_KEPT


def test_the_cell_that_starts_the_guard_grew_from_the_guards_making(monkeypatch):
    """The first ``%%resmon`` cell makes the monitor and its guard, then runs;
    on a loaded machine the consumer thread's first turn comes after the cell
    has grown. Its growth counts from the read the guard made as it was made
    (100 MiB), not from its first turn (125 MiB): told 50 MiB, not 25.
    Before, the first 25 MiB were lost and the next run was not told."""
    from nbmon.postmortem import memguard
    from nbmon.postmortem.memwarn import CONTAINER, Level

    said, used, running, clock = [], [100.0], [(1, 100.0, "cell")], [100.0]
    monkeypatch.setattr(memguard, "time", SimpleNamespace(monotonic=lambda: clock[0], time=lambda: clock[0]))
    monkeypatch.setattr(memguard.MemoryGuard, "_read", lambda self: Level(CONTAINER, used[0], 400.0))
    guard = memguard.MemoryGuard(os.getpid(), "auto", stop=lambda number, level: None,
                                 running_cell=lambda: running[0], say=said.append)
    for mb, cell in ((125.0, running[0]), (150.0, running[0]), (100.0, None)):   # 0.5 s apart
        clock[0] += 0.5
        used[0], running[0] = mb, cell
        guard.consume(None, False)
    used[0], running[0] = 360.0, (2, clock[0] + 0.5, "cell")   # 40 MiB free
    clock[0] += 0.5
    guard.consume(None, False)
    assert said == ["nbmon: this cell grew by 50.0 MiB at its peak last time; 40.0 MiB is free below "
                    "the container's 400 MiB memory limit"], said
