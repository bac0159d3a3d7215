"""``%resmon --dask`` in a real JupyterLab driven by headless Chromium: the
live cluster chart grows while the workers work, streams one way (nothing
goes back to the kernel while it draws), and ``%resmon stop`` replaces it
with its static record."""
from __future__ import annotations

import json
import re

import pytest

from browser_util import chromium_page, lab_serving, mib, run_all_cells, wait_for
from dashboard_page import INIT_SCRIPT, idle_figures
from test_browser import ARTIFACTS, CHROMIUM_ARGS, chromium_path  # noqa: F401 - a fixture

NOTEBOOK = "nbmon-dask-browser.ipynb"
STREAM_S = 5.0   # the chart watched while it grows: what crosses the websocket then
CELLS = [
    "%load_ext nbmon\nfrom distributed import Client, LocalCluster\n"
    "cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=':0')\nclient = Client(cluster)",
    "%resmon --dask client",
    # Busy until the test has seen the chart grow (it then makes the file "release"), two minutes at most.
    "import os\n\ndef work(release):\n    import os, time\n    block = b'\\x01' * (200 << 20)\n"
    "    t0 = time.time()\n    while not os.path.exists(release) and time.time() - t0 < 120:\n"
    "        sum(range(10000))\n    return len(block)\n\n"
    "client.gather(client.map(work, [os.path.abspath('release')] * 2, pure=False))",
    "%resmon stop\nclient.close()\ncluster.close()",
]

# Every 100 ms: the points of the cluster chart's traces, summed (the workers'
# traces gain a point a second; the totals keep a fixed number).
RECORDER = """() => {
  const log = window.__nbmonCluster = [];
  const t0 = performance.now();
  window.setInterval(() => {
    const plot = document.querySelectorAll('.jp-Notebook .jp-Cell')[1].querySelector('.js-plotly-plot');
    const drawn = plot && plot.__nbmonDrawn ? plot.__nbmonDrawn.traces : [];
    const points = drawn.reduce((n, t) => n + t.x.length, 0);
    if (points) log.push([performance.now() - t0, points]);
  }, 100);
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_serving(tmp_path_factory.mktemp("jupyterlab-dask"), NOTEBOOK, CELLS) as server:
        server.release = server.root / "release"
        yield server


def _growth(log):
    """(first reading with points, a reading at least 2 s later with more), or None yet."""
    readings = [r for r in log if r[1] > 0]
    later = [r for r in readings if readings and r[0] >= readings[0][0] + 2000 and r[1] > readings[0][1]]
    return (readings[0], later[-1]) if later else None


def test_the_cluster_chart_grows_and_stop_leaves_its_record(lab, chromium_path):
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page(chromium_path, CHROMIUM_ARGS, lab, ARTIFACTS / "browser-dask-failure.png") as page:
        try:
            page.add_init_script(INIT_SCRIPT)   # every websocket frame, from the page's start
            run_all_cells(page, lab, NOTEBOOK, RECORDER)
            view_cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
            view_cell.locator(".js-plotly-plot").wait_for(timeout=120_000)
            wait_for(lambda: _growth(page.evaluate("window.__nbmonCluster")), 60,
                     "the cluster chart to gain points over two seconds")
            t0 = page.evaluate("performance.now()")
            page.wait_for_timeout(STREAM_S * 1000)   # Playwright delivers events only inside its calls
            streamed = idle_figures(page.evaluate("window.__nbmonFrames"), t0, page.evaluate("performance.now()"))
            (ARTIFACTS / "browser-dask-stream.json").write_text(json.dumps(streamed, indent=1))
            assert streamed["browser_to_kernel"] == 0, streamed   # one way: no echo of what was drawn
            assert streamed["kernel_to_browser_messages"] >= STREAM_S / 2, streamed   # a frame a batch: streaming
            page.screenshot(path=str(ARTIFACTS / "browser-dask-running.png"))
            plot = page.evaluate("() => { const p = document.querySelectorAll('.jp-Notebook .jp-Cell')[1]"
                                 ".querySelector('.js-plotly-plot');"
                                 " return {title: p.__nbmonDrawn.title.text, names: p.data.map(t => t.name)}; }")
            assert re.match(r"Dask cluster · 2 workers · CPU \d", plot["title"]), plot
            assert {"0", "1", "cluster total"} <= set(plot["names"]), plot   # a trace per worker, by name
        finally:
            lab.release.touch()   # the work cell ends, %resmon stop runs

        record = view_cell.locator(".nbmon-cluster-record")
        wait_for(lambda: "stopped" in record.inner_text(), 120, "the cluster view's final record")
        assert view_cell.locator(".js-plotly-plot").count() == 0
        rows = record.locator("table tr").all()[1:]
        assert len(rows) == 2
        peaks = [mib(r.locator("td").nth(2).inner_text().split(" (")[0]) for r in rows]   # "253 MiB (exact)"
        assert min(peaks) >= 200, peaks   # each worker held its task's 200 MiB
        page.screenshot(path=str(ARTIFACTS / "browser-dask.png"))
