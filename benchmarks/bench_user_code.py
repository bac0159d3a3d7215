"""What watching costs the user's own code, measured in real kernels.

    python benchmarks/bench_user_code.py [--rounds N] [--idle S] [--before DIR] [--out benchmarks/RESULTS.md]

Each workload runs in kernels that differ only by nbmon (no nbmon, ``%%resmon``
cells, ``%resmon``'s live chart, auto mode, ``nbmon.monitor()``): a fresh
kernel for each condition, workload and round, one at a time (so that no
workload's imports change another's, and no other kernel's monitor runs
meanwhile), conditions interleaved, each round starting one further along.
A kernel's figure is the median of RUNS runs after a warm-up run, timed
inside it with ``perf_counter`` around the work only; the table gives the
median over rounds of each round's ratio to no nbmon (machine drift between
rounds cancels), and the median seconds. ``--before DIR`` measures another
checkout (its ``nbmon`` on PYTHONPATH) in the same rounds, interleaved.

Then the per-cell cost (a trivial cell, by the kernel's own clock:
``execute_input`` to ``execute_reply``), nbmon's footprint in the kernel
(what ``%load_ext``, a ``%%resmon`` cell and ``%resmon`` add), and the idle
cost of an open dashboard (the kernel's and its helpers' CPU, read from
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
    """A real ipykernel importing nbmon from ``checkout`` (None: as installed);
    ``run`` executes a cell and returns its stdout and the kernel's own
    execute_input -> execute_reply seconds."""

    def __init__(self, checkout: str | None = None):
        env = {**os.environ, "PYTHONPATH": checkout} if checkout else None
        self.km, self.kc = start_new_kernel(kernel_name="python3", stderr=subprocess.DEVNULL,
                                            **({"env": env} if env else {}))
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
    """utime + stime of ``pid`` (its reaped children's too), from /proc, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(p) for p in f.read().split()]
    return kids


def med(values, digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def rotated(items: list, r: int) -> list:
    return items[r % len(items):] + items[:r % len(items)]


def user_code(rounds: int, versions: dict[str, str | None]) -> list[str]:
    times = {(v, c, w): [] for v in versions for c, *_ in CONDITIONS for w in WORKLOADS}
    for r in range(rounds):
        for version, checkout in rotated(list(versions.items()), r):
            for cond, setup, prefix in rotated(CONDITIONS, r):
                for work, (imports, body) in WORKLOADS.items():
                    kernel = Kernel(checkout)
                    try:
                        kernel.run(imports + body)
                        for cell in setup:
                            kernel.run(cell)
                        kernel.run(prefix + TIMED)   # warms up, uncounted
                        runs = [float(kernel.run(prefix + TIMED)[0].split()[-1]) for _ in range(RUNS)]
                        times[version, cond, work].append(statistics.median(runs))
                    finally:
                        kernel.close()
        print(f"round {r + 1} of {rounds} done", file=sys.stderr)
    lines = []
    for version in versions:
        if len(versions) > 1:
            lines += [f"*{version}*:", ""]
        lines += ["| workload | " + " | ".join(c for c, *_ in CONDITIONS) + " |", "|---" * (len(CONDITIONS) + 1) + "|"]
        for work in WORKLOADS:
            base = times[version, "no nbmon", work]
            cells = []
            for cond, *_ in CONDITIONS:
                got = times[version, cond, work]
                ratios = [t / b for t, b in zip(got, base)]   # within a round: drift cancels
                cells.append(f"{statistics.median(ratios):.3f}× ({statistics.median(got):.3f} s)")
            lines.append(f"| {work} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


PER_CELL_VARIANTS = [
    ("no nbmon", [], "pass"), ("`%%resmon --quiet` cell", ["%load_ext nbmon"], "%%resmon --quiet\npass"),
    ("`%%resmon` cell (record shown)", ["%load_ext nbmon"], "%%resmon\npass"),
    ("auto mode", ["%load_ext nbmon", "%resmon auto on"], "pass")]


def variant_kernels(versions: dict[str, str | None]) -> dict[tuple[str, str], Kernel]:
    """A kernel per version and PER_CELL_VARIANTS entry, set up, its cell run once."""
    kernels = {}
    for version, checkout in versions.items():
        for name, setup, cell in PER_CELL_VARIANTS:
            kernel = kernels[version, name] = Kernel(checkout)
            for line in setup:
                kernel.run(line)
            kernel.run(cell)
    return kernels


def per_cell(rounds: int, versions: dict[str, str | None]) -> list[str]:
    """A trivial cell's milliseconds by the kernel's clock, interleaved."""
    variants = PER_CELL_VARIANTS
    kernels = variant_kernels(versions)
    took = {key: [] for key in kernels}
    try:
        for _ in range(rounds * 10):
            for (version, name), kernel in kernels.items():
                took[version, name].append(kernel.run(next(c for n, _, c in variants if n == name))[1] * 1000)
    finally:
        for kernel in kernels.values():
            kernel.close()
    lines = ["| cell | " + " | ".join(f"{v}: ms, median (min–max) | {v}: added ms" for v in versions) + " |",
             "|---" * (2 * len(versions) + 1) + "|"]
    for name, *_ in variants:
        cells = []
        for version in versions:
            values, base = took[version, name], statistics.median(took[version, "no nbmon"])
            cells += [med(values, 1), f"{statistics.median(values) - base:+.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def on_cpu_s(pid: int) -> float:
    """Seconds ``pid``'s threads have run, from their ``schedstat`` (the
    scheduler's nanoseconds, not utime's 10 ms ticks, which charge a whole
    tick to whichever thread it falls in); threads that ended are not counted."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass   # the thread ended meanwhile
    return total / 1e9


def cpu_per_cell(cells: int, versions: dict[str, str | None], block: int = 50) -> list[str]:
    """The CPU a trivial cell costs the kernel process (all its threads) and
    nbmon's helper (the kernel's children), read from /proc (:func:`on_cpu_s`)
    around blocks of ``block`` cells, the variants interleaved block by block:
    per cell, ms."""
    variants = PER_CELL_VARIANTS
    kernels = variant_kernels(versions)
    spent = {key: [0.0, 0.0] for key in kernels}
    try:
        for _ in range(max(1, cells // block)):
            for (version, name), kernel in kernels.items():
                cell = next(c for n, _, c in variants if n == name)
                helpers = children(kernel.pid)
                before = on_cpu_s(kernel.pid), sum(on_cpu_s(p) for p in helpers)
                for _ in range(block):
                    kernel.run(cell)
                spent[version, name][0] += on_cpu_s(kernel.pid) - before[0]
                spent[version, name][1] += sum(on_cpu_s(p) for p in helpers) - before[1]
    finally:
        for kernel in kernels.values():
            kernel.close()
    ran = max(1, cells // block) * block
    lines = ["| cell | " + " | ".join(f"{v}: kernel CPU ms | {v}: added | {v}: helper CPU ms" for v in versions)
             + " |", "|---" * (3 * len(versions) + 1) + "|"]
    for name, *_ in variants:
        row = []
        for version in versions:
            kernel_ms, helper_ms = (1000 * s / ran for s in spent[version, name])
            base = 1000 * spent[version, "no nbmon"][0] / ran
            row += [f"{kernel_ms:.2f}", f"{kernel_ms - base:+.2f}", f"{helper_ms:.2f}"]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return lines


def first_cell(rounds: int, versions: dict[str, str | None], later: int = 5) -> list[str]:
    """The first ``%%resmon`` cell after ``%load_ext`` (the monitor starts in
    it) against the ones after it, by the kernel's clock: a fresh kernel per
    version and round, the user taking 2 s to write that first cell."""
    took = {(v, k): [] for v in versions for k in ("first", "later")}
    for r in range(rounds):
        for version, checkout in rotated(list(versions.items()), r):
            kernel = Kernel(checkout)
            try:
                kernel.run("%load_ext nbmon")
                time.sleep(2.0)
                took[version, "first"].append(kernel.run("%%resmon\npass")[1] * 1000)
                took[version, "later"].append(statistics.median(kernel.run("%%resmon\npass")[1] * 1000
                                                                for _ in range(later)))
            finally:
                kernel.close()
    lines = ["| | " + " | ".join(f"{v}: ms, median (min–max)" for v in versions) + " |",
             "|---" * (len(versions) + 1) + "|"]
    for key, name in (("first", "the first `%%resmon` cell"), ("later", f"the {later} after it (each round's median)")):
        lines.append(f"| {name} | " + " | ".join(med(took[v, key], 1) for v in versions) + " |")
    return lines


def footprint(checkout: str | None) -> list[str]:
    steps = [("a plain kernel", None), ("`%load_ext nbmon`", "%load_ext nbmon"),
             ("a `%%resmon` cell", "%%resmon --quiet\npass"), ("`%resmon` (live chart)", "%resmon"),
             ("`%resmon stop`", "%resmon stop")]
    kernel = Kernel(checkout)
    rows, previous = [], None
    try:
        for name, cell in steps:
            if cell:
                kernel.run(cell)
                time.sleep(3.0)   # a chart's thread builds its widget; a helper starts
            values = [int(v) for v in kernel.run(PROBE)[0].split()]
            helpers = [sum(memory_kib(p, key) for p in children(kernel.pid)) / 1024
                       for key in ("/status VmRSS:", "/smaps_rollup Pss:")]
            helper_cells = f"{helpers[0]:.1f} | {helpers[1]:.1f}"
            if previous is None:
                objects, rss, pss, threads, fds = values
                rows.append(f"| {name} | {objects:,} | {rss / 1024:.1f} | {pss / 1024:.1f} | {threads} | {fds} | "
                            f"{helper_cells} |")
            else:
                d = [a - b for a, b in zip(values, previous)]
                rows.append(f"| {name} | {d[0]:+,} | {d[1] / 1024:+.1f} | {d[2] / 1024:+.1f} | {d[3]:+d} | {d[4]:+d} | "
                            f"{helper_cells} |")
            previous = values
    finally:
        kernel.close()
    return ["| after | GC-tracked objects | RSS MiB | PSS MiB | threads | fds | helper processes' RSS MiB | "
            "helper processes' PSS MiB |", "|---|---|---|---|---|---|---|---|", *rows]


def memory_kib(pid: int, where: str = "/status VmRSS:") -> int:
    """A figure of /proc/PID's ``where`` ("/file Key:"), in KiB; 0 for a process gone."""
    path, key = where.split()
    try:
        with open(f"/proc/{pid}{path}") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key))
    except (OSError, StopIteration):
        return 0


def idle(seconds: float, versions: dict[str, str | None]) -> list[str]:
    """CPU % of a core over ``seconds`` of an idle kernel with an open
    dashboard, its helper processes counted apart, and of a plain kernel."""
    lines = ["| kernel | kernel % | helper % | in all % |", "|---|---|---|---|"]
    cases = [("no nbmon", None, [])] + [(f"`%resmon` open, between cells ({v})", c, ["%load_ext nbmon", "%resmon"])
                                        for v, c in versions.items()]
    for name, checkout, setup in cases:
        kernel = Kernel(checkout)
        try:
            for cell in setup:
                kernel.run(cell)
            time.sleep(5.0)   # the chart built, the first record sent
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
    parser.add_argument("--before", default=None, help="another checkout to measure beside this one")
    parser.add_argument("--out", default=None, help="write the section into this RESULTS.md")
    args = parser.parse_args()
    here = os.path.dirname(HERE)

    def commit(directory: str) -> str:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=directory).stdout.strip()

    versions: dict[str, str | None] = {}
    if args.before:
        versions[f"before ({commit(args.before)})"] = os.path.abspath(args.before)
    versions[f"after ({commit(here)})" if args.before else "this"] = here
    lines = ["## What watching costs the user's code", "",
             f"{', '.join(versions)}; {platform.platform()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. "
             f"`python benchmarks/bench_user_code.py --rounds {args.rounds} --idle {args.idle:g}"
             f"{' --before DIR' if args.before else ''}`.", "",
             "The same workload in real kernels that differ only by nbmon: a fresh kernel per condition, "
             f"workload and round, one at a time, {args.rounds} rounds interleaved, timed inside the kernel "
             "around the work only: the median of each round's ratio to no nbmon (median seconds).", ""]
    lines += user_code(args.rounds, versions)
    lines += ["A trivial cell, by the kernel's own clock (`execute_input` to `execute_reply`, hooks included), "
              "interleaved:", ""]
    lines += per_cell(args.rounds, versions)
    lines += ["", "The CPU a trivial cell costs, read from `/proc/PID/task/*/schedstat` around blocks of 50 cells "
              "(the kernel process's threads; nbmon's helper apart), 800 cells per variant, interleaved by block:", ""]
    lines += cpu_per_cell(800, versions)
    lines += ["", "The first `%%resmon` cell after `%load_ext` (its monitor starts then), by the kernel's clock:", ""]
    lines += first_cell(args.rounds, versions)
    for version, checkout in versions.items():
        lines += ["", f"nbmon's footprint in the kernel, {version}: what each step adds (a plain kernel's own "
                      "figures first; objects counted after a full collection; its helper processes apart):", ""]
        lines += footprint(checkout)
    lines += ["", f"Idle: CPU % of one core over {args.idle:g} s between cells, read from `/proc` "
              "(the browser's share: the live dashboard's section):", ""]
    lines += idle(args.idle, versions)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        results_file.update(args.out, text, owns=r"## What watching costs", header=False)


if __name__ == "__main__":
    main()
