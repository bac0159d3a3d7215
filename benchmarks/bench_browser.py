"""What an open live dashboard costs, measured in a real JupyterLab page in
headless Chromium (the browser tests' harness: tests/browser_util.py and
tests/dashboard_page.py), fresh kernel each run.

    python benchmarks/bench_browser.py [--runs N] [--idle S] [--pythonpath DIR] [--label TEXT]

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

``--pythonpath DIR`` puts DIR first on the kernel's PYTHONPATH: with a
checkout of an older nbmon (``git worktree add /tmp/old c7c2884``) it
measures that one, the "before" of benchmarks/RESULTS.md. CPU figures need a
quiet machine: the script prints the load average before and after.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh kernels per notebook (default 3)")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle dashboard measured (default 30)")
    parser.add_argument("--pythonpath", help="put this first on the kernel's PYTHONPATH (an older nbmon)")
    parser.add_argument("--label", default="nbmon", help="the name of this column of results")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    if args.pythonpath:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (args.pythonpath, os.environ.get("PYTHONPATH")) if p)
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    results: dict[str, list[dict]] = {name: [] for name in NOTEBOOKS}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "root").mkdir()
        write(base / "root")
        lab = JupyterLab(base, base / "root").start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    for _ in range(args.runs):
                        for name in NOTEBOOKS:
                            results[name].append(one_run(browser, lab, name, args.idle))
                            print(name, results[name][-1], file=sys.stderr)
                finally:
                    browser.close()
        finally:
            lab.stop()
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    keys = list(results["cold"][0])
    print(f"| {args.label} | " + " | ".join(f"{name} (%resmon right after %load_ext)" if name == "cold"
                                          else f"{name} (%load_ext 5 s before)" for name in NOTEBOOKS) + " |")
    print("|---|" + "---|" * len(NOTEBOOKS))
    for key in keys:
        print(f"| {key} | " + " | ".join(spread([r[key] for r in results[name]]) for name in NOTEBOOKS) + " |")


if __name__ == "__main__":
    main()
