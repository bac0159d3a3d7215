"""nbmon in a real JupyterLab, driven by a real (headless) Chromium through
Playwright: the cell meter ticks, and the cell's summary replaces the meter
when the cell ends. (The live dashboard: test_dashboard_browser.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from browser_util import (ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_page, lab_serving, mib, row,
                          run_all_cells, seconds, wait_for)

NOTEBOOK = "nbmon-browser.ipynb"

GO = "go"   # the test creates it once it has seen the meter tick
# CPU work with small sleeps for at least 4 s and until the test has seen
# what it needs (bounded): a fixed-length cell is over before a page slow to
# render its first widget (a fresh machine's first run) has shown it ticking.
WORKLOAD = f'''%%resmon --label browser
import pathlib, time
block = b"\\x01" * (150 * 2**20)  # about 150 MiB, kept: the record opens
t0 = time.perf_counter()
while time.perf_counter() - t0 < 4 or not pathlib.Path("{GO}").exists() and time.perf_counter() - t0 < 120:
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < 0.05:
        pass
    time.sleep(0.005)
"done"'''

# Installed in the page before the cells run: every 100 ms it notes the
# meter's values, so that what the page showed is judged afterwards,
# independently of how promptly this process polls.
RECORDER = """() => {
  const log = window.__nbmonLog = {meter: []};
  const t0 = performance.now();
  window.setInterval(() => {
    const t = performance.now() - t0;
    const meter = document.querySelector('.nbmon-meter');
    if (meter) {
      const read = name => {
        const el = meter.querySelector(`[data-nbmon="${name}"]`);
        return el ? [el.textContent, el.dataset.value] : null;
      };
      log.meter.push({t, status: meter.dataset.status, elapsed: read('elapsed'), cpu: read('cpu'),
                      ram: read('ram'), label: read('label')});
    }
  }, 100);
}"""


def extension_names(env) -> str:
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], env=env,
                         capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def chromium_path() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (set NBMON_CHROMIUM to another path, or "
                    "install the distribution's chromium package): the browser test needs a real browser")
    return CHROMIUM


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_serving(tmp_path_factory.mktemp("jupyterlab"), NOTEBOOK, ["%load_ext nbmon", WORKLOAD]) as server:
        yield server


def test_lab_finds_the_widget_extensions(lab):
    # JUPYTER_DATA_DIR is a temporary directory: sys.prefix's extensions must still be found.
    listing = extension_names(lab.env())
    for name in ("@jupyter-widgets/jupyterlab-manager", "anywidget", "jupyterlab-plotly"):
        assert re.search(rf"{re.escape(name)} v\S+ .*enabled.*OK", listing), listing
    assert str(Path(sys.prefix) / "share" / "jupyter" / "labextensions") in listing


def running(log) -> list[dict]:
    return [m for m in log["meter"] if m["status"] == "running"]


def ticked(meter) -> bool:
    """The meter was seen live: elapsed and CPU changed while running."""
    elapsed = [float(m["elapsed"][1]) for m in meter if m["elapsed"] and m["elapsed"][1]]
    cpu = {m["cpu"][1] for m in meter if m["cpu"] and m["cpu"][1]}
    return len(set(elapsed)) >= 2 and elapsed[-1] > elapsed[0] and len(cpu) >= 2


def test_meter_ticks_and_summary_replaces_it(lab, chromium_path):
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page(chromium_path, CHROMIUM_ARGS, lab, ARTIFACTS / "browser-failure.png") as page:
        run_all_cells(page, lab, NOTEBOOK, RECORDER)

        long_cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        long_cell.locator(".nbmon-meter").wait_for(timeout=120_000)
        # the meter is live while the cell runs: elapsed and CPU change; then the cell may end
        wait_for(lambda: ticked(running(page.evaluate("window.__nbmonLog"))), 60, "the meter to tick")
        page.screenshot(path=str(ARTIFACTS / "browser-running.png"))
        (lab.root / GO).touch()
        summary = long_cell.locator(".nbmon-summary")
        summary.wait_for(timeout=120_000)

        meter = running(page.evaluate("window.__nbmonLog"))
        assert all(m["elapsed"][0].strip() for m in meter)  # the text the user sees
        assert meter[-1]["label"][0] == "browser"

        # the cell's summary replaced its meter
        assert long_cell.locator(".nbmon-meter").count() == 0
        assert summary.get_attribute("data-status") == "ok"
        assert "browser" in summary.inner_text()
        # the timeline: a picture of its own after the table, drawn (the browser decoded it)
        picture = long_cell.locator(".jp-OutputArea-child:has(.nbmon-summary) + .jp-OutputArea-child img")
        assert picture.evaluate("img => img.complete && img.naturalWidth") == 720
        rows = {r.locator("td").nth(0).inner_text().strip(): r.locator("td").nth(1).inner_text().strip()
                for r in summary.locator("tr").all()}
        assert re.search(r"\d (MiB|GiB)$", row(rows, "Peak memory")), rows
        assert mib(row(rows, "Peak memory")) >= 100, rows
        assert mib(row(rows, "Memory growth")) >= 90, rows
        assert seconds(row(rows, "Duration")) >= 3, rows
        assert "done" in long_cell.locator(".jp-OutputArea-output").last.inner_text()
        page.screenshot(path=str(ARTIFACTS / "browser.png"))
