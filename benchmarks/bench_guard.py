"""The memory guard against the OOM killer (issue 43), in real kernels in a
real 400 MiB memory cgroup (no swap): a cell that grows at 50, 200, 500 and
1,000 MiB/s (5 MiB arrays, in a function's frame), with the guard on (its
default: 95 % of the limit) and off. Read from outside nbmon: whether the
kernel lived (the cgroup's OOM-kill counter, the kernel process), the
container's memory as the cell saw it when stopped, and the time from the
cell's first step past the guard's line to the stop (negative: stopped
before the line, on its pace). Then what the guard costs the helper while
the memory is far from the line and while it is near it (the helper's CPU
from /proc, 10 s each, the guard off and on).

    sudo python benchmarks/bench_guard.py [--rounds 3] [--out benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import results_file  # noqa: E402
from test_postmortem import Kernel, kernelspec_limited_to, stdout_of  # noqa: E402

LIMIT_MB = 400
RATES = (50, 200, 500, 1000)
STEP_MB = 5
HOLD_S = 10.0

# The cell: grows at RATE MiB/s; it reads the container's working set itself
# (usage less inactive page cache, from the cgroup's files) at each step.
GROW = """{head}
import json, pathlib, time
import numpy as np
group = pathlib.Path({path!r})
def used_mb():
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    return (int((group / {usage!r}).read_text()) - int(stat[{inactive!r}])) / 2**20
crossed = []   # when a step first took it past the guard's line
def grow():
    chunks, pause = [], {step} / {rate}
    while True:
        chunks.append(np.ones({step} << 17))
        if not crossed and used_mb() >= {line}:
            crossed.append(time.monotonic())
        time.sleep(pause)
try:
    grow()
except MemoryError as err:
    stopped = time.monotonic()
    print(json.dumps({{"at_mb": used_mb(), "name": type(err).__name__,
                      "after_line_ms": (stopped - crossed[0]) * 1000 if crossed else None}}))
"""


def cell(group, rate: float, guard: str) -> str:
    v2 = group.version == 2
    return GROW.format(head=f"%%resmon --memory-guard {guard}", path=group.path, rate=rate, step=STEP_MB,
                       usage="memory.current" if v2 else "memory.usage_in_bytes",
                       inactive="inactive_file" if v2 else "total_inactive_file", line=0.95 * LIMIT_MB)


@contextlib.contextmanager
def limited_kernel(notebook: str):
    """A fresh kernel in a fresh LIMIT_MB cgroup, nbmon loaded, with a private directory of its own: (kernel, group)."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_RUNTIME_DIR", tmp)
        os.chmod(tmp, 0o700)
        with kernelspec_limited_to(LIMIT_MB, Path(tmp), env) as (name, group):
            with Kernel(os.path.join(tmp, notebook), name) as kernel:
                kernel.run("%load_ext nbmon")
                yield kernel, group


def one_run(rate: float, guard: str) -> dict:
    """One kernel, one growing cell: stopped (and where) or killed."""
    with limited_kernel("guard.ipynb") as (kernel, group):
        kills = group.oom_kills()
        try:
            out = stdout_of(kernel.run(cell(group, rate, guard)))
        except Exception:  # noqa: BLE001 - the kernel died (DeadKernelError)
            kernel.process.wait(30)
            return {"stopped": False, "killed": group.oom_kills() > kills}
        got = json.loads(out.strip().splitlines()[-1])
        return {"stopped": got["name"] == "MemoryGuardError", "killed": group.oom_kills() > kills,
                "at_mb": got["at_mb"], "after_line_ms": got["after_line_ms"]}


def helper_cpu(guard: str, near: bool) -> float:
    """The helper's CPU ms per second over HOLD_S, the kernel holding memory far from or near the line."""
    hold_mb = int(LIMIT_MB * (0.88 if near else 0.30))
    with limited_kernel("hold.ipynb") as (kernel, group):
        kernel.run(f"%resmon --memory-guard {guard}")
        usage = "memory.current" if group.version == 2 else "memory.usage_in_bytes"
        # Filled at 100 MiB/s: the guard would stop a much faster fill this near its line.
        kernel.run(f"import numpy as np, pathlib, time\ngroup = pathlib.Path({group.path!r})\nheld = []\n"
                   f"while int((group / {usage!r}).read_text()) < {hold_mb} << 20:\n"
                   "    held.append(np.ones(1 << 17))\n"
                   "    time.sleep(0.01)")
        helper = next(c for c in psutil.Process(kernel.pid).children()
                      if "nbmon.helper.serve" in " ".join(c.cmdline()))
        before = sum(helper.cpu_times()[:2])
        kernel.run(f"import time\ntime.sleep({HOLD_S})")
        return (sum(helper.cpu_times()[:2]) - before) / HOLD_S * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## The memory guard against the OOM killer", "",
             f"`python benchmarks/bench_guard.py --rounds {args.rounds}`, commit `{commit}`, {now}, "
             f"{platform.platform()}, {os.cpu_count()} CPUs. Real kernels in a {LIMIT_MB} MiB memory cgroup "
             f"(no swap); a cell grows by {STEP_MB} MiB arrays at each rate; the guard at its default (95 %) "
             "and off. Outcome per round; the container's working set when the cell was stopped (as the cell "
             "read it from the cgroup), median.", "",
             "| growth | guard on: outcome | stopped at (MiB of 400) | stopped after the line (ms) "
             "| guard off: outcome |", "|---|---|---|---|---|"]
    for rate in RATES:
        on = [one_run(rate, "auto") for _ in range(args.rounds)]
        off = [one_run(rate, "off") for _ in range(args.rounds)]

        def outcome(runs):
            return ", ".join("stopped" if r["stopped"] else "killed" if r["killed"] else "ran" for r in runs)

        at = [r["at_mb"] for r in on if r.get("at_mb") is not None]
        # Before the line (on its pace): the stop came before any step crossed it.
        after = [r["after_line_ms"] for r in on if r.get("at_mb") is not None]
        late = [a for a in after if a is not None]
        before = len(after) - len(late)
        when = (f"{statistics.median(late):.0f}" + (f" ({before} of {len(after)} before the line)" if before else "")
                if late else "before the line" if after else "")
        at_text = f"{statistics.median(at):.0f}" if at else "–"
        lines.append(f"| {rate:,} MiB/s | {outcome(on)} | {at_text} | {when or '–'} | {outcome(off)} |")
    lines += ["", "The helper's CPU (ms per second, from /proc) while a cell runs (sleeps) and the kernel holds memory:", "",
              "| memory held | guard off | guard on |", "|---|---|---|"]
    for near, label in ((False, "30 % of the limit (far: 20 reads/s)"), (True, "88 % of the limit (near: 50 reads/s)")):
        lines.append(f"| {label} | {helper_cpu('off', near):.1f} | {helper_cpu('auto', near):.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    results_file.update(args.out, text, owns=r"## The memory guard", header=False)


if __name__ == "__main__":
    main()
