"""What watching costs the user's own code, measured in real kernels.

    python benchmarks/bench_user_code.py [--rounds N] [--idle S] [--out benchmarks/RESULTS.md]

Each workload runs in kernels that differ only by nbmon (no nbmon, ``%%resmon``
cells, ``%resmon``'s live chart, auto mode, ``nbmon.monitor()``): a fresh
kernel for each condition, workload and round (so that no workload's imports
change another's, and no other kernel's monitor runs meanwhile), conditions
interleaved (each round starts one further along); each figure is the median
over rounds of each kernel's median of RUNS runs (after a warm-up run), timed inside the kernel with ``perf_counter`` around
the work only. Then the per-cell cost (a trivial cell, by the kernel's own
clock: ``execute_input`` to ``execute_reply``), nbmon's footprint in the
kernel (what ``%load_ext``, a ``%%resmon`` cell and ``%resmon`` add), and the
idle cost of an open dashboard (the kernel's and the helper's CPU, read from
``/proc`` by this script). The browser's share is bench_browser.py's.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

from jupyter_client.manager import start_new_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import results_file  # noqa: E402

WORKLOADS = {
    "pure-Python loop": ("", "def work():\n    s = 0\n    for i in range(3_000_000):\n        s += i * i\n"),
    "NumPy": ("import numpy as np\n",
              "def work():\n    a = np.random.default_rng(0).random(2_000_000)\n"
              "    for _ in range(10):\n        b = np.sort(a) * 2.0 + a\n"),
    "dict/list churn": ("", "def work():\n    for _ in range(40):\n        d = {i: [i] * 4 for i in range(20000)}\n"),
}
# (name, cells that set the kernel up, prefix of each timed cell)
CONDITIONS = [
    ("no nbmon", [], ""),
    ("`%%resmon` cells", ["%load_ext nbmon"], "%%resmon --quiet\n"),
    ("`%resmon`", ["%load_ext nbmon", "%resmon"], ""),
    ("`%resmon auto on`", ["%load_ext nbmon", "%resmon auto on --threshold 0"], ""),
    ("`nbmon.monitor()`", ["import nbmon\nnbmon.monitor()"], ""),
]
RUNS = 3   # timed runs in each kernel, after its warm-up: the kernel's figure is their median
TIMED = "import time as _t\n_t0 = _t.perf_counter()\nwork()\nprint(_t.perf_counter() - _t0)"
PROBE = r"""
import gc as _gc, os as _os, threading as _th
_gc.collect()
def _kib(path, key):
    with open(path) as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key))
print(len(_gc.get_objects()), _kib('/proc/self/status', 'VmRSS:'), _kib('/proc/self/smaps_rollup', 'Pss:'),
      _th.active_count(), len(_os.listdir('/proc/self/fd')))
"""


class Kernel:
    """A real ipykernel; ``run`` executes a cell and returns its stdout and
    the kernel's own execute_input -> execute_reply seconds."""

    def __init__(self):
        self.km, self.kc = start_new_kernel(kernel_name="python3", stderr=subprocess.DEVNULL)
        self.pid = self.km.provisioner.process.pid

    def run(self, code: str) -> tuple[str, float]:
        msg_id = self.kc.execute(code)
        out, began = [], None
        while True:
            msg = self.kc.get_iopub_msg(timeout=600)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "execute_input":
                began = msg["header"]["date"]
            elif kind == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
            elif kind == "error":
                raise RuntimeError(f"{code!r}: {msg['content']['ename']}: {msg['content']['evalue']}")
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                break
        reply = self.kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=60)
        return "".join(out), (reply["header"]["date"] - began).total_seconds()

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` with its reaped children's, from /proc (the
    kernel's clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(p) for p in f.read().split()]
    return kids


def med(values) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def user_code(rounds: int) -> list[str]:
    """Only one kernel runs at a time: another's monitor would take the CPU
    that the measured one's code runs on."""
    times = {(cond, work): [] for cond, *_ in CONDITIONS for work in WORKLOADS}
    for r in range(rounds):
        for cond, setup, prefix in CONDITIONS[r % len(CONDITIONS):] + CONDITIONS[:r % len(CONDITIONS)]:
            for work, (imports, body) in WORKLOADS.items():
                kernel = Kernel()
                try:
                    kernel.run(imports + body)
                    for cell in setup:
                        kernel.run(cell)
                    kernel.run(prefix + TIMED)   # warms up, uncounted
                    runs = [float(kernel.run(prefix + TIMED)[0].split()[-1]) for _ in range(RUNS)]
                    times[cond, work].append(statistics.median(runs))
                finally:
                    kernel.close()
        print(f"round {r + 1} of {rounds} done", file=sys.stderr)
    lines = ["| workload | " + " | ".join(c for c, *_ in CONDITIONS) + " |", "|---" * (len(CONDITIONS) + 1) + "|"]
    for work in WORKLOADS:
        base = statistics.median(times["no nbmon", work])
        cells = [f"{statistics.median(times[c, work]) / base:.3f}× ({statistics.median(times[c, work]):.3f} s)"
                 for c, *_ in CONDITIONS]
        lines.append(f"| {work} | " + " | ".join(cells) + " |")
    return lines


def per_cell(rounds: int) -> list[str]:
    """A trivial cell's seconds by the kernel's clock, interleaved."""
    variants = [("no nbmon", [], "pass"), ("`%%resmon --quiet` cell", ["%load_ext nbmon"], "%%resmon --quiet\npass"),
                ("`%%resmon` cell (record shown)", ["%load_ext nbmon"], "%%resmon\npass"),
                ("auto mode", ["%load_ext nbmon", "%resmon auto on"], "pass")]
    kernels = []
    for _, setup, cell in variants:
        kernel = Kernel()
        for line in setup:
            kernel.run(line)
        kernel.run(cell)
        kernels.append(kernel)
    took = [[] for _ in variants]
    try:
        for _ in range(rounds * 5):
            for i, (_, _, cell) in enumerate(variants):
                took[i].append(kernels[i].run(cell)[1] * 1000)
    finally:
        for kernel in kernels:
            kernel.close()
    base = statistics.median(took[0])
    lines = ["| cell | ms, median (min–max) | added ms |", "|---|---|---|"]
    for (name, *_), values in zip(variants, took):
        lines.append(f"| {name} | {med(values)} | {statistics.median(values) - base:+.1f} |")
    return lines


def footprint() -> list[str]:
    steps = [("a plain kernel", None), ("`%load_ext nbmon`", "%load_ext nbmon"),
             ("a `%%resmon` cell", "%%resmon --quiet\npass"), ("`%resmon` (live chart)", "%resmon"),
             ("`%resmon stop`", "%resmon stop")]
    kernel = Kernel()
    rows, previous = [], None
    try:
        for name, cell in steps:
            if cell:
                kernel.run(cell)
                time.sleep(2.0)   # a chart's thread builds its widget; a helper starts
            values = [int(v) for v in kernel.run(PROBE)[0].split()]
            objects, rss, pss, threads, fds = values
            if previous is None:
                rows.append(f"| {name} | {objects:,} | {rss / 1024:.1f} | {pss / 1024:.1f} | {threads} | {fds} |")
            else:
                d = [a - b for a, b in zip(values, previous)]
                rows.append(f"| {name} | {d[0]:+,} | {d[1] / 1024:+.1f} | {d[2] / 1024:+.1f} | {d[3]:+d} | {d[4]:+d} |")
            previous = values
    finally:
        kernel.close()
    return ["| after | GC-tracked objects | RSS MiB | PSS MiB | threads | fds |", "|---|---|---|---|---|---|", *rows]


def idle(seconds: float) -> list[str]:
    """CPU % of a core over ``seconds`` of an idle kernel: plain, and with
    an open dashboard (its helper process counted apart)."""
    lines = ["| kernel | kernel % | helper % | in all % |", "|---|---|---|---|"]
    for name, setup in (("no nbmon", []), ("`%resmon` open, between cells", ["%load_ext nbmon", "%resmon"])):
        kernel = Kernel()
        try:
            for cell in setup:
                kernel.run(cell)
            time.sleep(3.0)
            helpers = children(kernel.pid)
            k0, h0, t0 = cpu_s(kernel.pid), sum(cpu_s(p) for p in helpers), time.monotonic()
            time.sleep(seconds)
            k1, h1, t1 = cpu_s(kernel.pid), sum(cpu_s(p) for p in helpers), time.monotonic()
        finally:
            kernel.close()
        k, h = 100 * (k1 - k0) / (t1 - t0), 100 * (h1 - h0) / (t1 - t0)
        lines.append(f"| {name} | {k:.2f} | {h:.2f} | {k + h:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of the idle measure")
    parser.add_argument("--out", default=None, help="write the section into this RESULTS.md")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    lines = ["## What watching costs the user's code", "",
             f"Commit `{commit}`, {platform.platform()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. "
             f"`python benchmarks/bench_user_code.py --rounds {args.rounds} --idle {args.idle:g}`.", "",
             "The same workload in real kernels that differ only by nbmon, one kernel per condition and "
             f"workload, a fresh kernel each round (one at a time), {args.rounds} rounds interleaved, timed inside the kernel around the work only: "
             "the ratio to no nbmon, median (seconds).", ""]
    lines += user_code(args.rounds)
    lines += ["", "A trivial cell, by the kernel's own clock (`execute_input` to `execute_reply`, "
              "hooks included), interleaved:", ""]
    lines += per_cell(args.rounds)
    lines += ["", "nbmon's footprint in the kernel: what each step adds (a plain kernel's own figures first; "
              "objects counted after a full collection):", ""]
    lines += footprint()
    lines += ["", f"Idle: CPU % of one core over {args.idle:g} s between cells, read from `/proc` "
              "(the browser's share: the live dashboard's section):", ""]
    lines += idle(args.idle)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        results_file.update(args.out, text, owns=r"## What watching costs", header=False)


if __name__ == "__main__":
    main()
