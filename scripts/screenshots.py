"""Takes the README's two screenshots in a real JupyterLab (light theme) driven
by headless Chromium: the live ``%resmon`` chart (docs/img/live-chart.png) and
a ``%%resmon`` cell with its record (docs/img/cell-record.png).

    python scripts/screenshots.py [--out docs/img] [--chromium /usr/bin/chromium]

Needs the ``test`` extra (JupyterLab, Playwright) and Chromium, as the browser
tests do; it starts its server the way they do (tests/browser_util.py)."""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from browser_util import CHROMIUM, CHROMIUM_ARGS, lab_serving, wait_for  # noqa: E402

NOTEBOOK = "nbmon-screenshots.ipynb"
CELLS = [
    "%load_ext nbmon",
    "%resmon",
    # a short workload: a CPU burst over a 120 MiB array
    "import time\nimport numpy as np\n\n"
    "x = np.random.rand(4000, 4000)\n"
    "t0 = time.perf_counter()\n"
    "while time.perf_counter() - t0 < 3:\n"
    "    y = x @ x[:, :200]",
    # a monitored cell: 384 MiB kept, then 4 s of CPU
    "%%resmon --label train\n"
    "data = np.ones((48, 2**20))   # 384 MiB, kept\n"
    "t0 = time.perf_counter()\n"
    "while time.perf_counter() - t0 < 4:\n"
    "    total = float(data[:8].sum())",
]
# The live chart, drawn, with some points of the kernel's own traces.
CHART_POINTS = """() => {
  const plot = document.querySelector('.nbmon-live-record .js-plotly-plot');
  if (!plot || !plot.__nbmonDrawn) return 0;
  return Math.min(...plot.__nbmonDrawn.traces.filter(t => /^proc_/.test(t.meta)).map(t => t.y.length));
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--chromium", default=CHROMIUM)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="nbmon-shots-") as base, \
            lab_serving(Path(base), NOTEBOOK, CELLS) as lab, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1000}, device_scale_factor=1,
                                    color_scheme="light")
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?reset&token={lab.token}", timeout=120_000)
            page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\(ipykernel\) \| Idle")).wait_for(
                timeout=120_000)
            # the file browser closed: the notebook takes the width
            if page.locator("#jp-left-stack").is_visible():
                page.locator(".jp-NotebookPanel").first.click()
                page.keyboard.press("Control+b")
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

            cells = page.locator(".jp-Notebook .jp-Cell")
            record = cells.nth(3)
            record.locator(".nbmon-summary").wait_for(timeout=180_000)
            wait_for(lambda: record.locator("img").evaluate_all(
                "imgs => imgs.some(i => i.complete && i.naturalWidth > 0)"), 60, "the record's timeline picture")
            # a few seconds between cells on the chart, after the monitored cell
            page.wait_for_timeout(6000)
            wait_for(lambda: page.evaluate(CHART_POINTS) > 10, 90, "the live chart with data")
            # the first cell active: no selection bar or cell toolbar on those photographed
            cells.nth(0).locator(".jp-InputPrompt").click()
            page.keyboard.press("Escape")
            page.mouse.move(0, 0)   # no hover label over the chart
            page.wait_for_timeout(2500)

            chart = cells.nth(1).locator(".jp-OutputArea")
            chart.scroll_into_view_if_needed()
            chart.screenshot(path=str(args.out / "live-chart.png"))
            record.scroll_into_view_if_needed()
            record.screenshot(path=str(args.out / "cell-record.png"))
        finally:
            browser.close()
    for name in ("live-chart.png", "cell-record.png"):
        path = args.out / name
        print(f"{path}: {path.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
