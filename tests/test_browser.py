"""nbmon in a real JupyterLab, driven by a real (headless) Chromium through
Playwright: the live dashboard streams, the cell meter ticks, and the cell's
summary replaces the meter when the cell ends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from browser_util import chromium_page, lab_serving, mib, row, run_all_cells, seconds, wait_for

CHROMIUM = os.environ.get("NBMON_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
NOTEBOOK = "nbmon-browser.ipynb"

WORKLOAD = '''%%resmon --label browser
import time
block = b"\\x01" * (100 * 2**20)  # about 100 MiB, kept
t0 = time.perf_counter()
while time.perf_counter() - t0 < 4:  # about 4 s of CPU work, with small sleeps
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < 0.05:
        pass
    time.sleep(0.005)
"done"'''

# Installed in the page before the cells run: every 100 ms it notes the
# first trace's length and the meter's values, so that what the page showed
# is judged afterwards, independently of how promptly this process polls.
RECORDER = """() => {
  const log = window.__nbmonLog = {plot: [], meter: []};
  const t0 = performance.now();
  window.setInterval(() => {
    const t = performance.now() - t0;
    const plot = document.querySelector('.js-plotly-plot');
    if (plot && plot.data && plot.data[0] && plot.data[0].x) log.plot.push([t, plot.data[0].x.length]);
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
    with lab_serving(tmp_path_factory.mktemp("jupyterlab"), NOTEBOOK,
                     ["%load_ext nbmon", "%resmon --interval 0.1", WORKLOAD]) as server:
        yield server


def test_lab_finds_the_widget_extensions(lab):
    # JUPYTER_DATA_DIR is a temporary directory: sys.prefix's extensions must still be found.
    listing = extension_names(lab.env())
    for name in ("@jupyter-widgets/jupyterlab-manager", "anywidget", "jupyterlab-plotly"):
        assert re.search(rf"{re.escape(name)} v\S+ .*enabled.*OK", listing), listing
    assert str(Path(sys.prefix) / "share" / "jupyter" / "labextensions") in listing


def test_dashboard_streams_meter_ticks_and_summary_replaces_it(lab, chromium_path):
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page(chromium_path, CHROMIUM_ARGS, lab, ARTIFACTS / "browser-failure.png") as page:
        run_all_cells(page, lab, NOTEBOOK, RECORDER)

        cells = page.locator(".jp-Notebook .jp-Cell")
        long_cell = cells.nth(2)
        long_cell.locator(".nbmon-meter").wait_for(timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / "browser-running.png"))
        summary = long_cell.locator(".nbmon-summary")
        summary.wait_for(timeout=120_000)

        # (a) the dashboard streams: its trace gained points over at least a second
        log = wait_for(lambda: _plot_span(page.evaluate("window.__nbmonLog")), 60,
                       "the dashboard to be recorded over more than a second")
        first, later = log
        assert later[1] > first[1], f"trace did not grow: {first} -> {later}"
        assert long_cell.locator(".js-plotly-plot").count() == 0
        assert cells.nth(1).locator(".js-plotly-plot .scatterlayer .trace").count() >= 2

        # (b) the meter was live while the cell ran: elapsed and CPU changed
        meter = [m for m in page.evaluate("window.__nbmonLog.meter") if m["status"] == "running"]
        assert meter, "the meter was never seen running"
        elapsed = [float(m["elapsed"][1]) for m in meter if m["elapsed"] and m["elapsed"][1]]
        cpu = {m["cpu"][1] for m in meter if m["cpu"] and m["cpu"][1]}
        assert len(set(elapsed)) >= 2 and elapsed[-1] > elapsed[0], meter
        assert len(cpu) >= 2, meter
        assert all(m["elapsed"][0].strip() for m in meter)  # the text the user sees
        assert meter[-1]["label"][0] == "browser"

        # (c) the cell's summary replaced its meter
        assert long_cell.locator(".nbmon-meter").count() == 0
        assert summary.get_attribute("data-status") == "ok"
        assert "browser" in summary.inner_text()
        assert long_cell.locator("svg.nbmon-timeline").count() == 1
        rows = {r.locator("th").inner_text().strip(): r.locator("td").inner_text().strip()
                for r in summary.locator("tr").all()}
        assert re.search(r"\d (MiB|GiB)$", row(rows, "Peak RSS")), rows
        assert mib(row(rows, "Peak RSS")) >= 100, rows
        assert mib(row(rows, "RSS growth")) >= 90, rows
        assert seconds(row(rows, "Duration")) >= 3, rows
        assert "done" in long_cell.locator(".jp-OutputArea-output").last.inner_text()
        page.screenshot(path=str(ARTIFACTS / "browser.png"))


def _plot_span(log):
    """(first reading with points, a later reading at least 1 s after it), or None yet."""
    readings = [r for r in log["plot"] if r[1] > 0]
    if not readings:
        return None
    first = readings[0]
    later = [r for r in readings if r[0] >= first[0] + 1000]
    return (first, later[-1]) if later else None
