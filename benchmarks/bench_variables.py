"""What sizing the variables costs a cell (issue 35): the kernel's own work at
a cell's end (:meth:`nbmon.kernel.namespace.CellSizes.cell_ended`: the
survey of the namespace and its report as plain data), in a real IPython
shell's namespace of 10, 100 and 1,000 names, each cell replacing one
array (what a cell typically does). Two sets of libraries imported: NumPy
and pandas, then torch too (its import makes arrays known by their data's
address). CPU of this thread, median and 90th percentile over the cells.

    python benchmarks/bench_variables.py [--cells 300] [--out benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import pandas as pd
from IPython.core.interactiveshell import InteractiveShell

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import results_file  # noqa: E402  (benchmarks/, the script's own folder)

from nbmon.kernel.namespace import CellSizes  # noqa: E402

NAMES = (10, 100, 1000)


def fill(ns: dict, count: int) -> None:
    """A notebook's namespace of ``count`` names: per 10, three arrays (one a
    view), a DataFrame, a Series, a list of arrays, a dict, a string, a
    number and a function; the imported modules as a notebook has them."""
    ns.update(np=np, pd=pd)
    for k in range(count // 10):
        a = np.ones(1000 + k)
        ns.update({f"a{k}": a, f"v{k}": a[::2], f"b{k}": np.zeros((10, 10)),
                   f"df{k}": pd.DataFrame({"x": np.arange(100), "y": np.ones(100)}),
                   f"s{k}": pd.Series(np.arange(50)), f"parts{k}": [np.ones(10) for _ in range(4)],
                   f"cfg{k}": {"lr": 0.1, "name": "run"}, f"label{k}": f"label {k}", f"n{k}": k,
                   f"f{k}": len})


def measure(count: int, cells: int) -> list[float]:
    """µs of thread CPU per cell end, over ``cells`` cells."""
    shell = InteractiveShell.instance()
    shell.user_ns.clear()
    shell.init_user_ns()
    fill(shell.user_ns, count)
    sizes = CellSizes()
    sizes.watch(True)
    sizes.cell_started(shell)   # the namespace before the first cell
    out = []
    for cell in range(cells):
        shell.user_ns["a0"] = np.ones(1000 + cell % 7)   # the cell's work: one array replaced
        t0 = time.thread_time_ns()
        report = sizes.cell_ended(shell)
        out.append((time.thread_time_ns() - t0) / 1000)
        assert report is not None and report["count"] == count * 8 // 10, report   # numbers, functions: not data
        sizes.cell_finished()
        sizes.cell_started(shell)
    return out


def reference_ms() -> float:
    """This machine's pace: thread CPU ms of a million dict stores (a shared VM's varies by 2x over minutes)."""
    t0, d = time.thread_time_ns(), {}
    for i in range(1_000_000):
        d[i & 1023] = i
    return (time.thread_time_ns() - t0) / 1e6


TARGET_MS = 2.0   # the target at 1,000 names


def table(cells: int) -> list[str]:
    rows, at_most = {}, {}
    for libraries in ("NumPy, pandas", "NumPy, pandas, torch"):
        if libraries.endswith("torch"):
            if importlib.util.find_spec("torch") is None:
                for count in NAMES:
                    rows[count].append("(torch not installed)")
                continue
            import torch  # noqa: F401 - from here on the sizers know torch's types
        for count in NAMES:
            us = sorted(measure(count, cells))
            at_most[libraries] = statistics.median(us) / 1000   # the last count's: 1,000
            rows.setdefault(count, []).append(
                f"{statistics.median(us) / 1000:.3f} (p90 {us[int(0.9 * len(us))] / 1000:.3f})")
    lines = ["| names | ms per cell, NumPy and pandas imported | ms per cell, torch too |", "|---|---|---|"]
    lines += [f"| {count:,} | {' | '.join(cells_)} |" for count, cells_ in rows.items()]
    met = all(ms <= TARGET_MS for ms in at_most.values())
    lines += ["", f"Target: at most {TARGET_MS:g} ms per cell at 1,000 names: {'met' if met else 'not met'} here."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## Variables sized at a cell's end", "",
             f"`python benchmarks/bench_variables.py --cells {args.cells}`, commit `{commit}`, {now}, "
             f"{platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before. "
             "What the kernel does at each cell's end while a monitor sizes variables "
             "(`CellSizes.cell_ended`: the survey and its report as plain data), in a real IPython shell's "
             "namespace: per 10 names three arrays (one a view), a DataFrame, a Series, a list of four arrays, "
             "a dict, a string, a number, a function; each cell replaces one array. Thread CPU ms, "
             f"median (p90) over {args.cells} cells. Off (`--no-variables`): nothing runs.", ""]
    pace = reference_ms()
    lines += table(args.cells)
    lines += ["", f"This machine's pace meanwhile: a million dict stores took {pace:.0f} ms of thread CPU before the "
              f"runs and {reference_ms():.0f} ms after: the figures above scale with it."]
    text = "\n".join(lines) + "\n"
    print(text)
    results_file.update(args.out, text, owns=r"## Variables sized", header=False)


if __name__ == "__main__":
    main()
