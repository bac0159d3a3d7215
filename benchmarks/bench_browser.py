"""What an open live dashboard costs, measured in a real JupyterLab page in
headless Chromium (the browser tests' harness: tests/browser_util.py and
tests/dashboard_page.py), a fresh kernel and page for each measurement.

    python benchmarks/bench_browser.py [--runs N] [--idle S] [--ages M,M,...] [--cells N,N,...]
                                       [--before DIR] [--out FILE]

Three tables, each variant's column beside the other's (``--before DIR``:
the nbmon checked out in DIR, e.g. ``git worktree add /tmp/before c135e1e``,
on its own JupyterLab), runs alternated between the variants:

- start and idle, ``--runs`` times: ``%load_ext nbmon`` and ``%resmon``
  ("cold": Run All, the two cells back to back; "warm": the extension loaded
  5 s before ``%resmon``; "two": two ``%resmon`` cells, two dashboards on
  the page, times to the second): the kernel starts ``%resmon`` (execute_input) ->
  its first display_data reaches the page; -> the chart's widget opens (the
  comm its points come on); -> a
  plotly chart with points is in the page; how long the kernel ran the
  ``%resmon`` cell, by its own clock (what the next cell waits); then over ``--idle`` seconds
  (default 30): messages browser -> kernel, kernel status messages, kernel ->
  browser KiB/s; CPU (% of one core) of the kernel, of nbmon's sampler helper
  (the kernel's children) and of Chromium (all its processes); redraws.
- by cells executed, ``--runs`` times: ``%resmon``, then N quick cells
  (``x = 1``, Run All), then idle: Chromium CPU and redraws over ``--idle`` s.
- by chart age, once per variant (a 30-minute page each): one dashboard
  (default 600 s window, 10 Hz) open, Chromium CPU and redraws over the
  ``--idle`` s before each age in ``--ages`` (minutes; the window is full
  from 10).

A redraw is one of the dashboard's "nbmon-redraw" measures (User Timing: a
paint of the canvas, a relayout of a y axis whose top moved, or where more
changed a Plotly.react), or for a version without them one Plotly.react: its
milliseconds are its synchronous part, median and 90th percentile; "frame
ms" times the same redraws to the end of their paint ("nbmon-frame": the
worker's that paints the canvas, or where the page paints it, the frame
that renders it: style, layout and paint of its main thread); "Plotly.react
/ s" counts plotly's whole pipeline apart, and "Plotly.relayout / s" its
relayouts (a y axis whose top moved, or the user's zoom: each a frame of
the page's). Figures are medians (min–max) over runs. ``--out`` writes the tables into
benchmarks/RESULTS.md (their own section). CPU figures need a quiet
machine: the load average before and after is part of the text.
"""
from __future__ import annotations

import argparse
import math
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
from dashboard_page import (INIT_SCRIPT, browser_pids, cpu_seconds, execute_time, idle_figures,  # noqa: E402
                            kernel_pids, kernel_seconds, redraw_figures)

START = {"cold": ["%load_ext nbmon", "%resmon"],
         "warm": ["%load_ext nbmon", "import time; time.sleep(5)", "%resmon"],
         "two": ["%load_ext nbmon", "%resmon", "%resmon"]}
AGE = ["%load_ext nbmon", "%resmon"]
PLAIN = "no nbmon"   # the cells table's column of the page alone


def cells_notebook(n: int, nbmon: bool = True) -> list[str]:
    return (["%load_ext nbmon", "%resmon"] if nbmon else ["x = 0"]) + ["x = 1"] * n


QUIET_PCT = 15.0    # Chromium under this share of a core is done with Run All (an idle dashboard: ~4 %)
QUIET_WINDOW_S = 3.0
# ...but its work decays for ~20 s more (1,000 cells, page alone, 10 s windows
# after quiet(): 13.6, 7.3, 1.2, 0.6 %): measured after this much more.
SETTLE_S = 30.0


def quiet(page, timeout_s: float = 240) -> float:
    """Wait until Chromium's CPU over QUIET_WINDOW_S is under QUIET_PCT % of a
    core: JupyterLab itself stays busy after Run All (a renderer at ~100 % for
    40 s to minutes after 1,000 cells, then ~1 %), longer on a loaded machine.
    The seconds waited, or NaN where it was not quiet within ``timeout_s``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        pids = browser_pids(os.getpid())
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        page.wait_for_timeout(QUIET_WINDOW_S * 1000)
        if 100 * (cpu_seconds(pids) - cpu0) / (time.monotonic() - t0) < QUIET_PCT:
            return time.monotonic() - began
    return math.nan


def write(root: Path, notebooks: dict[str, list[str]]) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    spec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    for name, cells in notebooks.items():
        nbformat.write(new_notebook(metadata={"kernelspec": spec}, cells=[new_code_cell(c) for c in cells]),
                       root / f"{name}.ipynb")


def open_and_run(browser, lab, name: str, chart: bool = True):
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.add_init_script(INIT_SCRIPT)
    page.goto(f"{lab.url}/lab/tree/{name}.ipynb?reset&token={lab.token}", timeout=120_000)
    page.locator("#jp-main-statusbar").get_by_text("(ipykernel) | Idle").wait_for(timeout=120_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    if chart:
        wait_for(lambda: page.evaluate("window.__nbmonMarks.chart"), 120, "a chart with data")
    return page


def close(page, lab) -> None:
    page.close()
    for kernel in lab.api("/api/kernels") or []:
        lab.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)


def measure(page, seconds: float, pids: dict[str, list[int]]) -> dict:
    """Over the next ``seconds`` of the page: CPU of each group of processes,
    the kernel websocket's traffic, and the redraws."""
    cpu0 = {name: cpu_seconds(p) for name, p in pids.items()}
    t0, w0 = page.evaluate("performance.now()"), time.monotonic()
    page.wait_for_timeout(seconds * 1000)   # Playwright delivers events only inside its calls
    t1, wall = page.evaluate("performance.now()"), time.monotonic() - w0
    out = {f"{name} CPU %": 100 * (cpu_seconds(p) - cpu0[name]) / wall for name, p in pids.items()}
    idle = idle_figures(page.evaluate("window.__nbmonFrames"), t0, t1)
    redraws = redraw_figures(page.evaluate("window.__nbmonRedraws"), t0, t1)
    frames = redraw_figures(page.evaluate("window.__nbmonRedrawFrames"), t0, t1)
    out.update({"browser->kernel msgs": idle["browser_to_kernel"], "status msgs": idle["status"],
                "kernel->browser KiB/s": idle["kernel_to_browser_bytes_per_s"] / 1024,
                "redraws / s": redraws["redraws_per_s"], "redraw ms, median": redraws["redraw_ms_median"],
                "redraw ms, p90": redraws["redraw_ms_p90"],
                "frame ms, median": frames["redraw_ms_median"], "frame ms, p90": frames["redraw_ms_p90"],
                "Plotly.react / s": redraw_figures(page.evaluate("window.__nbmonReacts"), t0, t1)["redraws_per_s"],
                "Plotly.relayout / s": redraw_figures(page.evaluate("window.__nbmonRelayouts"), t0, t1)["redraws_per_s"]})
    return out


def processes(lab) -> dict[str, list[int]]:
    import psutil

    kernels = kernel_pids(lab.proc.pid)
    helpers = [c.pid for k in kernels for c in psutil.Process(k).children(recursive=True)]
    return {"kernel": kernels, "sampler helper": helpers, "Chromium": browser_pids(os.getpid())}


def start_run(browser, lab, name: str, idle_s: float) -> dict:
    page = open_and_run(browser, lab, name)
    try:
        page.wait_for_timeout(3000)   # settle: the first frames, the first record update
        frames = page.evaluate("window.__nbmonFrames")
        began = execute_time(frames, r"^%resmon$")
        # the chart's own model: the comm its points come on (not the bundle's carrier)
        chart_comm = next(f["comm"] for f in frames if f["kind"] == "nbmon:append" and f["t"] > began)
        opened = next(f["t"] for f in frames if f["type"] == "comm_open" and f["comm"] == chart_comm)
        out = {"%resmon cell s (kernel)": kernel_seconds(frames, r"^%resmon$"),
               "first output s": (execute_time(frames, r"^%resmon$", "display_data") - began) / 1000,
               "widget opened s": (opened - began) / 1000,
               "chart with data s": (page.evaluate("window.__nbmonMarks.chart") - began) / 1000}
        out.update(measure(page, idle_s, processes(lab)))
        return out
    finally:
        close(page, lab)


def cells_run(browser, lab, n: int, idle_s: float, nbmon: bool = True) -> dict:
    """After Run All of n quick cells (``nbmon``: after %resmon; else the page
    alone), once JupyterLab has settled, with the dashboard in view."""
    page = open_and_run(browser, lab, f"cells-{n}" if nbmon else f"plain-{n}", chart=nbmon)
    try:
        replies = "window.__nbmonFrames.filter((f) => f.type === 'execute_reply').length"
        wait_for(lambda: page.evaluate(replies) >= n + (2 if nbmon else 1), 1200, f"{n} cells to run")
        # Run All scrolled to the last cell: back to the top, where the dashboard
        # is (out of view it draws nothing), once JupyterLab has settled
        settled = quiet(page)
        shown = math.nan
        if nbmon:
            # a page busy redrawing may take long to render the top cells again: measured either way
            shown = float(back_in_view(page))
            settled += quiet(page)   # rendering the top cells again
        page.wait_for_timeout(SETTLE_S * 1000)
        settled += SETTLE_S
        return {**measure(page, idle_s, {"Chromium": browser_pids(os.getpid())}), "dashboard in view": shown,
                "settled s": settled}
    finally:
        close(page, lab)


def back_in_view(page, timeout_s: float = 300) -> bool:
    """Scroll the notebook back to its top until the dashboard shows (JupyterLab
    renders only the cells in view, and may scroll to the active cell again)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page.evaluate("document.querySelector('.jp-WindowedPanel-outer').scrollTop = 0")
        page.wait_for_timeout(1000)
        try:
            box = page.locator(".nbmon-live-record").first.bounding_box(timeout=1000)
        except PlaywrightTimeout:   # not rendered (yet), or re-rendered under the locator
            continue
        if box and 0 <= box["y"] < 1000:
            return True
    return False


def age_run(browser, lab, ages_min: list[float], idle_s: float) -> dict[float, dict]:
    page = open_and_run(browser, lab, "age")
    try:
        born = time.monotonic()
        out = {}
        for age in ages_min:
            page.wait_for_timeout(max(0.0, born + 60 * age - idle_s - time.monotonic()) * 1000)
            out[age] = measure(page, idle_s, {"Chromium": browser_pids(os.getpid())})
            print("age", age, out[age], file=sys.stderr)
        return out
    finally:
        close(page, lab)


def spread(values) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    digits = 2 if max(values) < 10 else 1
    med = statistics.median(values)
    return f"{med:.{digits}f}" if len(values) == 1 else \
        f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def start_lab(base: Path, pythonpath: str | None, notebooks: dict) -> JupyterLab:
    """A JupyterLab whose kernels import nbmon from ``pythonpath`` (None: this checkout)."""
    before = os.environ.get("PYTHONPATH")
    path = [p for p in (pythonpath, str(HERE.parent), before) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    try:
        base.mkdir()
        (base / "root").mkdir()
        write(base / "root", notebooks)
        return JupyterLab(base, base / "root").start()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def table(columns: list[tuple[str, list[dict]]], keys: list[str]) -> list[str]:
    lines = ["| | " + " | ".join(name for name, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(spread([r[key] for r in runs]) for _, runs in columns) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh kernels per start and cells row (default 3)")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds measured each time (default 30)")
    parser.add_argument("--ages", default="1,5,10,30", help="minutes of chart age measured (default 1,5,10,30; "
                                                            "'' for none)")
    parser.add_argument("--cells", default="3,300,1000", help="cells executed before measuring (default 3,300,1000)")
    parser.add_argument("--before", metavar="DIR",
                        help="also measure the nbmon checked out in DIR, alternated with this one")
    parser.add_argument("--out", help="write the tables into this results file (benchmarks/RESULTS.md)")
    args = parser.parse_args()
    ages = [float(a) for a in args.ages.split(",") if a]
    cell_counts = [int(n) for n in args.cells.split(",") if n]
    from playwright.sync_api import sync_playwright

    commit = lambda path: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path,  # noqa: E731
                                         capture_output=True, text=True).stdout.strip() or "?"
    variants = {f"after ({commit(HERE)})": None}
    if args.before:
        variants = {f"before ({commit(args.before)})": args.before, **variants}
    notebooks = {**START, "age": AGE, **{f"cells-{n}": cells_notebook(n) for n in cell_counts},
                 **{f"plain-{n}": cells_notebook(n, nbmon=False) for n in cell_counts}}
    load_before = os.getloadavg()
    started = {v: {name: [] for name in START} for v in variants}
    by_cells = {v: {n: [] for n in cell_counts} for v in [*variants, PLAIN]}
    by_age = {}
    with tempfile.TemporaryDirectory() as tmp:
        labs = {}
        try:
            for i, (variant, pythonpath) in enumerate(variants.items()):
                labs[variant] = start_lab(Path(tmp) / str(i), pythonpath, notebooks)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    for _ in range(args.runs):
                        for variant, lab in labs.items():
                            for name in START:
                                started[variant][name].append(start_run(browser, lab, name, args.idle))
                                print(variant, name, started[variant][name][-1], file=sys.stderr)
                            for n in cell_counts:
                                by_cells[variant][n].append(cells_run(browser, lab, n, args.idle))
                                print(variant, n, "cells", by_cells[variant][n][-1], file=sys.stderr)
                        for n in cell_counts:   # the page alone: what JupyterLab itself costs
                            by_cells[PLAIN][n].append(cells_run(browser, lab, n, args.idle, nbmon=False))
                            print(PLAIN, n, "cells", by_cells[PLAIN][n][-1], file=sys.stderr)
                    if ages:
                        for variant, lab in labs.items():
                            by_age[variant] = age_run(browser, lab, ages, args.idle)
                finally:
                    browser.close()
        finally:
            for lab in labs.values():
                lab.stop()
    load_after = os.getloadavg()
    what = {"cold": "%resmon right after %load_ext", "warm": "%load_ext 5 s before",
            "two": "two dashboards on the page"}
    start_keys = list(next(iter(started.values()))["cold"][0])
    costs = ["Chromium CPU %", "redraws / s", "redraw ms, median", "redraw ms, p90", "frame ms, median",
             "frame ms, p90", "Plotly.react / s", "Plotly.relayout / s"]
    in_view = costs + ["dashboard in view", "settled s"]
    lines = [
        "## Live dashboard in the browser", "",
        f"`python benchmarks/bench_browser.py --runs {args.runs} --idle {args.idle:g} --ages {args.ages} "
        f"--cells {args.cells}{' --before ' + args.before if args.before else ''}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: JupyterLab in headless Chromium (1300 x 1000), "
        "a fresh kernel and page for each measurement, variants alternated; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after. A redraw is one \"nbmon-redraw\" measure "
        "(a paint, a relayout of a y axis, or a Plotly.react), or without them one Plotly.react; its "
        "milliseconds the synchronous part. Median (min–max) over runs.", "",
        f"Start and idle: times from the kernel starting `%resmon`; messages, bytes, CPU and redraws over "
        f"{args.idle:g} s of an idle open dashboard.", "",
        *table([(f"{v}, {name} ({what[name]})", started[v][name]) for name in START for v in variants], start_keys),
        ""]
    if cell_counts:
        lines += [f"By cells executed: `%resmon`, N cells `x = 1` (Run All), JupyterLab left to settle "
                  f"(until Chromium is under {QUIET_PCT:g} % of a core over {QUIET_WINDOW_S:g} s: it is busy "
                  f"itself after many cells), the dashboard scrolled back into view and settled again, "
                  f"{SETTLE_S:g} s more (JupyterLab's own work decays), then "
                  f"{args.idle:g} s idle; {args.runs} run(s) each, also of the same notebook "
                  "without nbmon (the page alone).", "",
                  *table([(f"{v}, {n} cells", by_cells[v][n]) for n in cell_counts for v in [*variants, PLAIN]],
                         in_view), "",
                  "(dashboard in view: the share of runs in which the page showed it again after Run All; "
                  "out of view a dashboard draws nothing. settled s: the wait for a quiet page, – where it "
                  "was not quiet within 4 min)", ""]
    if by_age:
        lines += [f"By chart age: one dashboard per variant (600 s window, 10 Hz: full from 10 min) open "
                  f"{ages[-1]:g} min, each figure over the {args.idle:g} s before its age; one run per variant.", "",
                  *table([(f"{v}, {age:g} min", [by_age[v][age]]) for age in ages for v in variants], costs), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        results_file.update(args.out, text, owns=r"## Live dashboard", header=False)


if __name__ == "__main__":
    main()
