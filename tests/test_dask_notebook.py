"""notebooks/dask.ipynb executed by nbclient in a real ``python3`` kernel:
a LocalCluster of two worker processes watched with ``%resmon --dask``."""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from browser_util import mib, row, summary_rows

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "dask.ipynb"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_CELLS = re.compile(r"<tr>(<td[^>]*>.*?</td>)+</tr>", re.S)


def cell(nb, starts_with: str):
    (found,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts_with)]
    return found


def html_outputs(c) -> list[str]:
    return [o["data"]["text/html"] for o in c.outputs if "text/html" in o.get("data", {})]


def table_rows(fragment: str, cls: str) -> list[list[str]]:
    """The body rows of the first ``cls`` table in ``fragment``, as text (its
    first row, the header, left out)."""
    part = fragment[fragment.index(f'class="{cls}"'):]
    part = part[:part.index("</table>")]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row.group(0)) for row in _CELLS.finditer(part)][1:]


def test_saved_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    work = tmp_path_factory.mktemp("dask-notebook")
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    nb = nbformat.read(work / NOTEBOOK.name, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    return nb


def test_no_cell_failed(executed):
    for c in executed.cells:
        if c.cell_type == "code":
            assert not [o for o in c.outputs if o["output_type"] == "error"], (c.source, c.outputs)


def told(executed) -> dict:
    """What the pinned task saw of its own process: RSS before and while holding 300 MiB."""
    (result,) = [o for o in cell(executed, "%%resmon").outputs if o["output_type"] == "execute_result"]
    said = ast.literal_eval(result["data"]["text/plain"])
    assert said["held_mb"] - said["before_mb"] > 290, said
    return said


def test_the_cell_is_summarised_on_each_worker(executed):
    c = cell(executed, "%%resmon")
    (html,) = [h for h in html_outputs(c) if "nbmon-summary" in h]
    assert "300 MiB on one worker" in html
    assert row(summary_rows(html), "Peak memory")   # the kernel's own summary, beside the workers'
    workers = table_rows(html, "nbmon-workers")
    assert len(workers) == 2, workers
    other, pinned = sorted(mib(cells[2].replace(" (exact)", "")) for cells in workers)
    held = told(executed)["held_mb"]
    assert pinned >= 0.95 * held and other < held - 200, (workers, held)
    assert all(cells[2].endswith("(exact)") for cells in workers)


def test_history_and_samples_have_a_row_per_worker(executed):
    (table,) = html_outputs(cell(executed, "nbmon.history(workers=True)"))
    assert table.count("300 MiB on one worker") == 2 and table.count("tcp://") == 2
    text = cell(executed, "nbmon.samples(workers=True)").outputs[0]["data"]["text/plain"]
    other, pinned = sorted(float(v) for v in re.findall(r"tcp://\S+\s+([\d.]+)", text))
    held = told(executed)["held_mb"]
    assert pinned >= 0.95 * held and other < held - 200, text


def test_stop_leaves_a_static_record_and_no_thread_on_the_workers(executed):
    view = cell(executed, "%resmon --dask")
    assert not [o for o in view.outputs if WIDGET_MIME in o.get("data", {})]
    (record,) = html_outputs(view)
    assert "nbmon-cluster-record" in record and "2 workers" in record
    (picture,) = [o for o in view.outputs if "image/png" in o.get("data", {})]   # the totals' timeline
    assert picture["metadata"]["image/png"]["width"] > 100
    rows = table_rows(record, "nbmon-workers")
    assert len(rows) == 2 and max(mib(r[2].split(" (")[0]) for r in rows) >= 300, rows   # "300 MiB (exact)"
    left = ast.literal_eval(cell(executed, "import threading").outputs[0]["data"]["text/plain"])
    assert len(left) == 2 and all(names == [] for names in left.values()), left
