"""What an open live dashboard costs, measured in a real JupyterLab page in
headless Chromium (the browser tests' harness: tests/browser_util.py and
tests/dashboard_page.py), fresh kernel each run.

    python benchmarks/bench_browser.py [--runs N] [--idle S] [--before DIR] [--out FILE]

For each run: a fresh JupyterLab page and kernel run ``%load_ext nbmon`` and
``%resmon`` ("cold": Run All, the two cells back to back; "warm": the
extension loaded 5 s before ``%resmon``), then the page stays idle ``--idle``
seconds (default 30). Reported, median (min–max) over runs:

- first output: the kernel starts ``%resmon`` (execute_input) -> its first
  display_data reaches the page;
- chart with data: -> a plotly chart with points is in the page;
- over the idle window: messages browser -> kernel, kernel status messages,
  kernel -> browser KiB/s on the kernel websocket; CPU (% of one core) of
  the kernel process, of nbmon's sampler helper (the kernel's child
  processes), and of Chromium (all its processes).

``--before DIR`` measures the nbmon checked out in DIR too (``git worktree
add /tmp/old c7c2884``: the "before" of benchmarks/RESULTS.md), on its own
JupyterLab, run for run alternated with this checkout. ``--out`` writes the
table into benchmarks/RESULTS.md (its own section). CPU figures need a quiet
machine: the load average before and after is part of the table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))

import results_file  # noqa: E402  (benchmarks/, the script's own folder)
from browser_util import CHROMIUM, CHROMIUM_ARGS, JupyterLab, wait_for  # noqa: E402
from dashboard_page import INIT_SCRIPT, browser_pids, cpu_seconds, execute_time, idle_figures, kernel_pids  # noqa: E402

NOTEBOOKS = {"cold": ["%load_ext nbmon", "%resmon"],
             "warm": ["%load_ext nbmon", "import time; time.sleep(5)", "%resmon"]}


def write(root: Path) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    spec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    for name, cells in NOTEBOOKS.items():
        nbformat.write(new_notebook(metadata={"kernelspec": spec}, cells=[new_code_cell(c) for c in cells]),
                       root / f"{name}.ipynb")


def one_run(browser, lab, name: str, idle_s: float) -> dict:
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.add_init_script(INIT_SCRIPT)
    try:
        page.goto(f"{lab.url}/lab/tree/{name}.ipynb?token={lab.token}", timeout=120_000)
        page.locator("#jp-main-statusbar").get_by_text("(ipykernel) | Idle").wait_for(timeout=120_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        wait_for(lambda: page.evaluate("window.__nbmonMarks.chart"), 120, "a chart with data")
        page.wait_for_timeout(3000)   # settle: the first frames, the first record update
        frames = page.evaluate("window.__nbmonFrames")
        began = execute_time(frames, r"^%resmon$")
        opened = [f["t"] for f in frames if f["type"] == "comm_open" and f["dir"] == "recv" and f["t"] > began]
        out = {"first output s": (execute_time(frames, r"^%resmon$", "display_data") - began) / 1000,
               "widget opened s": (min(opened) - began) / 1000,
               "chart with data s": (page.evaluate("window.__nbmonMarks.chart") - began) / 1000}
        kernels = kernel_pids(lab.proc.pid)
        import psutil

        helpers = [c.pid for k in kernels for c in psutil.Process(k).children(recursive=True)]
        chromium = browser_pids(os.getpid())
        cpu0 = [cpu_seconds(kernels), cpu_seconds(helpers), cpu_seconds(chromium)]
        t0, w0 = page.evaluate("performance.now()"), time.monotonic()
        page.wait_for_timeout(idle_s * 1000)   # Playwright delivers events only inside its calls
        t1, wall = page.evaluate("performance.now()"), time.monotonic() - w0
        cpu1 = [cpu_seconds(kernels), cpu_seconds(helpers), cpu_seconds(chromium)]
        idle = idle_figures(page.evaluate("window.__nbmonFrames"), t0, t1)
        out.update({"browser->kernel msgs": idle["browser_to_kernel"], "status msgs": idle["status"],
                    "kernel->browser KiB/s": idle["kernel_to_browser_bytes_per_s"] / 1024,
                    "kernel CPU %": 100 * (cpu1[0] - cpu0[0]) / wall,
                    "sampler helper CPU %": 100 * (cpu1[1] - cpu0[1]) / wall,
                    "Chromium CPU %": 100 * (cpu1[2] - cpu0[2]) / wall})
        return out
    finally:
        page.close()
        for kernel in lab.api("/api/kernels") or []:
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)


def spread(values) -> str:
    digits = 2 if max(values) < 10 else 1
    med = statistics.median(values)
    return f"{med:.{digits}f}" if len(values) == 1 else \
        f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def start_lab(base: Path, pythonpath: str | None) -> JupyterLab:
    """A JupyterLab whose kernels import nbmon from ``pythonpath`` (None: this checkout)."""
    before = os.environ.get("PYTHONPATH")
    path = [p for p in (pythonpath, str(HERE.parent), before) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    try:
        base.mkdir()
        (base / "root").mkdir()
        write(base / "root")
        return JupyterLab(base, base / "root").start()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def table(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    """One column per (notebook, variant), before and after side by side."""
    columns = [(name, variant) for name in NOTEBOOKS for variant in results]
    what = {"cold": "%resmon right after %load_ext", "warm": "%load_ext 5 s before"}
    lines = ["| | " + " | ".join(f"{variant}, {name} ({what[name]})" for name, variant in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for key in next(iter(results.values()))["cold"][0]:
        lines.append(f"| {key} | " + " | ".join(spread([r[key] for r in results[variant][name]])
                                                 for name, variant in columns) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh kernels per notebook (default 3)")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle dashboard measured (default 30)")
    parser.add_argument("--before", metavar="DIR",
                        help="also measure the nbmon checked out in DIR, alternated with this one")
    parser.add_argument("--out", help="write the table into this results file (benchmarks/RESULTS.md)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    commit = lambda path: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path,  # noqa: E731
                                         capture_output=True, text=True).stdout.strip() or "?"
    variants = {f"after ({commit(HERE)})": None}
    if args.before:
        variants = {f"before ({commit(args.before)})": args.before, **variants}
    load_before = os.getloadavg()
    results = {variant: {name: [] for name in NOTEBOOKS} for variant in variants}
    with tempfile.TemporaryDirectory() as tmp:
        labs = {}
        try:
            for i, (variant, pythonpath) in enumerate(variants.items()):
                labs[variant] = start_lab(Path(tmp) / str(i), pythonpath)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    for _ in range(args.runs):
                        for name in NOTEBOOKS:
                            for variant, lab in labs.items():
                                results[variant][name].append(one_run(browser, lab, name, args.idle))
                                print(variant, name, results[variant][name][-1], file=sys.stderr)
                finally:
                    browser.close()
        finally:
            for lab in labs.values():
                lab.stop()
    load_after = os.getloadavg()
    text = "\n".join([
        "## Live dashboard in the browser", "",
        f"`python benchmarks/bench_browser.py --runs {args.runs} --idle {args.idle:g}"
        f"{' --before ' + args.before if args.before else ''}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        "JupyterLab in headless Chromium, a fresh kernel per run, variants alternated; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after. Times from the kernel starting `%resmon`; "
        f"message, byte and CPU figures over {args.idle:g} s of an idle open dashboard. Median (min–max) over runs.",
        "", *table(results), ""])
    print(text)
    if args.out:
        results_file.update(args.out, text, owns=r"## Live dashboard", header=False)


if __name__ == "__main__":
    main()
