"""The memory guard (issue 43): a cell that grows towards the container's
limit is stopped with ``nbmon.MemoryGuardError`` before the OOM killer
kills the kernel, and the kernel lives on. Real kernels in a real memory
cgroup the test makes (400 MiB, no swap); the truth is read from outside
nbmon: the kernel's process (the same one, alive), the cgroup's own OOM-kill
counter and usage, the variables the cells made."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from nbclient.exceptions import CellExecutionError, DeadKernelError

from test_postmortem import Kernel, kernelspec_limited_to, postmortems, private_dir, stdout_of  # noqa: F401 - a fixture

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
        guard = memguard.MemoryGuard(os.getpid(), "auto", stop=lambda number, text: stopped.append(clock[0]),
                                     running_cell=lambda: (7, started) if clock[0] >= started else None)
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
