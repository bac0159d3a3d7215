"""The shipped notebooks, executed by nbclient in a real ``python3`` kernel,
then exported to HTML with nbconvert."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from browser_util import mib, percent, row, seconds, summary_rows

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def execute(name: str, tmp_path_factory) -> nbformat.NotebookNode:
    work = tmp_path_factory.mktemp(name.removesuffix(".ipynb"))
    shutil.copy(NOTEBOOKS / name, work / name)
    nb = nbformat.read(work / name, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    nbformat.write(nb, work / name)
    return nb


def cell(nb, starts_with: str):
    found = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts_with)]
    assert len(found) == 1, f"expected one code cell starting with {starts_with!r}, found {len(found)}"
    return found[0]


def html_outputs(c) -> list[str]:
    return [o["data"]["text/html"] for o in c.outputs if "text/html" in o.get("data", {})]


def stdout(c) -> str:
    return "".join(o["text"] for o in c.outputs if o["output_type"] == "stream" and o["name"] == "stdout")


@pytest.mark.parametrize("name", ["quickstart.ipynb", "gpu.ipynb"])
def test_saved_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, c.source
    assert "widgets" not in nb.metadata


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    return execute("quickstart.ipynb", tmp_path_factory)


def test_quickstart_cell_summary_has_the_cells_numbers(quickstart):
    c = cell(quickstart, '%%resmon --label "cpu+memory"')
    # the live meter was replaced in place by the static summary
    assert not [o for o in c.outputs if WIDGET_MIME in o.get("data", {})]
    (summary,) = [h for h in html_outputs(c) if "nbmon-summary" in h]
    assert 'data-status="ok"' in summary
    assert "<b>nbmon · cpu+memory: " in summary   # its line, as the table's title: the record is open
    assert [o for o in c.outputs if "image/png" in o.get("data", {})]   # the timeline: a picture of its own
    rows = summary_rows(summary)
    assert mib(row(rows, "Peak memory")) >= 150, rows
    assert mib(row(rows, "Memory growth")) >= 150, rows
    assert percent(row(rows, "CPU mean")) > 20, rows
    assert seconds(row(rows, "Duration")) >= 1.0, rows
    assert int(row(rows, "Samples")) >= 2, rows
    (result,) = [o for o in c.outputs if o["output_type"] == "execute_result"]
    assert result["data"]["text/plain"].endswith("200 MiB allocated'")


def test_quickstart_failing_cell_shows_failed_summary_and_error(quickstart):
    c = cell(quickstart, "%%resmon --label failing")
    assert "raises-exception" in c.metadata.tags
    (summary,) = [h for h in html_outputs(c) if "nbmon-summary" in h]
    assert 'data-status="failed"' in summary
    assert "<b>nbmon · failing: " in summary and " · failed</b>" in summary
    (error,) = [o for o in c.outputs if o["output_type"] == "error"]
    assert error["ename"] == "ZeroDivisionError"
    # the traceback shows the failing line of the cell itself
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
    assert re.search(r"----> 3 values\[3\] / 0", text), text


def test_quickstart_history_lists_both_cells(quickstart):
    c = cell(quickstart, "nbmon.history()")
    (table,) = html_outputs(c)
    body = re.search(r"<tbody>(.*?)</tbody>", table, re.S).group(1)
    assert body.count("<tr") >= 2
    for text in ("cpu+memory", "failing", ">ok<", ">failed<", "peak_rss_mb", "memory_growth_mb"):
        assert text in table, text


def test_quickstart_stop_freezes_the_dashboard(quickstart):
    (dashboard,) = [c for c in quickstart.cells if c.source.strip() == "%resmon"]
    # the live chart's output slot now holds the static record, not the widget
    assert not [o for o in dashboard.outputs if WIDGET_MIME in o.get("data", {})]
    (record,) = html_outputs(dashboard)
    assert 'class="nbmon-live-record"' in record and [o for o in dashboard.outputs if "image/png" in o["data"]]
    stop = cell(quickstart, "%resmon stop")
    (summary,) = html_outputs(stop)
    rows = summary_rows(summary)
    # a peak between samples reads "354 MiB (at most 363 MiB)": the figure is the first amount
    peak = row(rows, "Peak memory").split(" (at most ")[0]
    assert int(row(rows, "Samples")) >= 10 and mib(peak) >= 150, rows


def test_quickstart_keeps_no_plotly_bundle_in_widget_state(quickstart):
    # headless runs store every widget's state: the dashboard's holds no plotly.js (it was 5.1 MB)
    state = json.dumps(quickstart.metadata.get("widgets", {}))
    assert len(state) < 300_000, len(state)


def test_quickstart_exports_to_html_with_static_records(quickstart):
    body, _ = HTMLExporter().from_notebook_node(quickstart)
    assert "nbmon-summary" in body
    assert re.search(r'<div class="jp-RenderedImage[^>]*>\s*<img [^>]*src="data:image/png;base64,', body)   # timelines
    assert 'data-status="failed"' in body
    assert "nbmon-live-record" in body


GPU_COUNT = """
from nbmon.sources.gpus import GPUs
gpus = GPUs()
gpus.start(0.0)
print(len(gpus.devices))
"""


def gpu_count_here() -> int:
    """What the kernel will see: asked in a fresh interpreter (the test
    process's NVML state may be a fake's), as the notebook asks."""
    out = subprocess.run([sys.executable, "-c", GPU_COUNT], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_gpu_notebook_runs_and_says_what_it_did(tmp_path_factory):
    nb = execute("gpu.ipynb", tmp_path_factory)
    for c in nb.cells:
        if c.cell_type == "code":
            assert not [o for o in c.outputs if o["output_type"] == "error"], c.source
    first = stdout(cell(nb, "import nbmon"))
    if gpu_count_here() == 0:
        m = re.fullmatch(r"no NVIDIA GPU here: (.+)\n", first)
        assert m, first
        assert m.group(1) not in ("ok", "not initialised")
        assert stdout(cell(nb, "try:")) == "skipping the GPU workload: there is no NVIDIA GPU\n"
        assert cell(nb, "WORKLOAD").outputs == [] and cell(nb, "if RUN_GPU:").outputs == []
        return
    assert re.fullmatch(r"\d+ NVIDIA GPU\(s\): nbmon will report GPU figures\n", first), first
    skipped = stdout(cell(nb, "try:"))
    if skipped:  # a GPU, but no CUDA build of torch: the notebook says so and stops
        assert skipped == "skipping the GPU workload: PyTorch with CUDA is not installed\n"
        return
    (summary,) = [h for h in html_outputs(cell(nb, "WORKLOAD")) if "nbmon-summary" in h]
    rows = summary_rows(summary)
    assert "torch matmul" in summary and 'data-status="ok"' in summary
    assert percent(row(rows, "GPU util mean")) > 0, rows
    # the device's memory: per-process figures may be hidden inside a container
    assert mib(row(rows, "GPU memory peak (all GPUs)")) > 0, rows
    (table,) = html_outputs(cell(nb, "if RUN_GPU:"))
    assert "peak_gpu_mem_mb" in table and "mean_gpu_util" in table
