"""A cell's record outlives its kernel (issue 45): notebooks executed in real
kernels (nbclient with auto mode and ``%%resmon`` cells, ``jupyter nbconvert
--execute``), saved, and read back by ``nbmon report`` and ``nbmon compare``
as another process, the way a pipeline or CI would. Truth: the sizes the
cells allocate."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from nbmon.report.notebooks import RECORD_MIME

NBMON = [sys.executable, "-m", "nbmon.cli"]
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
BASE_MIB, HUNGRY_MIB, RESMON_MIB = 64, 192, 32   # the hungry run's cell allocates 3x the first run's
GROWTH_MARGIN_MIB = 8   # a cell's growth beyond its array (the allocator's and the kernel's own): 0.1 to 4.1 seen


def array_cell(mib: int) -> str:
    return f"a = np.ones({mib} * 2**20 // 8)\na.sum()"


def cells() -> list:
    return [new_code_cell("%load_ext nbmon\n%resmon auto on --threshold 0"),
            new_code_cell("import numpy as np"),
            new_code_cell(array_cell(BASE_MIB)),
            new_code_cell(f"%%resmon\nb = np.ones({RESMON_MIB} * 2**20 // 8)\nb[:10].sum()"),
            new_code_cell("import time\ntime.sleep(0.2)")]


def nbmon(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*NBMON, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The notebook run, saved, then its array cell made 3x hungrier and run
    again (same cells, same ids, as a user edits and reruns it): the paths."""
    root = tmp_path_factory.mktemp("records")
    nb = new_notebook(metadata={"kernelspec": KERNELSPEC}, cells=cells())
    paths = []
    for name, mib in (("old", BASE_MIB), ("new", HUNGRY_MIB)):
        nb.cells[2].source = array_cell(mib)
        NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
        nbformat.validate(nb)   # the record's data is valid nbformat (a JSON mime type)
        nbformat.write(nb, root / f"{name}.ipynb")
        paths.append(root / f"{name}.ipynb")
    return root, *paths


def test_every_record_carries_its_summary_as_data(runs):
    root, old, _new = runs
    nb = nbformat.read(old, as_version=4)
    found = {}
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if RECORD_MIME in out.get("data", {}):
                found[index] = out.data[RECORD_MIME]
                # front ends show the record's HTML; the data rides along unseen
                assert 'class="nbmon-' in out.data["text/html"]
    assert sorted(found) == [1, 2, 3, 4]   # auto mode's lines and the %%resmon cell's record
    assert {found[i]["kind"] for i in (1, 2, 4)} == {"line"} and found[3]["kind"] == "cell"
    for index, data in found.items():
        assert data["version"] == 1 and data["status"] == "ok" and data["host"]
        assert data["execution_count"] == nb.cells[index].execution_count
    assert found[2]["summary"]["memory_growth_mb"] == pytest.approx(BASE_MIB, abs=GROWTH_MARGIN_MIB)


def test_report_ranks_a_notebooks_cells_with_the_figures_they_allocated(runs):
    root, _old, new = runs
    done = nbmon("report", new, "--json", "--sort", "growth", cwd=root)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    first = got["cells"][0]
    assert (first["index"], first["first_line"]) == (2, f"a = np.ones({HUNGRY_MIB} * 2**20 // 8)")
    assert first["growth"] == pytest.approx(HUNGRY_MIB, abs=GROWTH_MARGIN_MIB)
    assert first["rise"] == pytest.approx(HUNGRY_MIB, abs=GROWTH_MARGIN_MIB)
    assert got["totals"]["code_cells"] == 5 and got["totals"]["cells_with_records"] == 4
    text = nbmon("report", new, "--top", "2", cwd=root)
    assert text.returncode == 0 and "4 of 5 code cells have records" in text.stdout
    assert len([line for line in text.stdout.splitlines() if line.startswith("[")]) == 2, text.stdout


def test_compare_puts_the_hungrier_cell_first_and_fails_ci_on_a_rule(runs):
    root, old, new = runs
    done = nbmon("compare", old, new, "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)["cells"][0]
    assert first["old_index"] == first["new_index"] == 2
    # each rise is its array's, within the margin: so is their ratio
    low = (HUNGRY_MIB - GROWTH_MARGIN_MIB) / (BASE_MIB + GROWTH_MARGIN_MIB) - 1
    high = (HUNGRY_MIB + GROWTH_MARGIN_MIB) / (BASE_MIB - GROWTH_MARGIN_MIB) - 1
    assert low <= first["rise"]["ratio"] <= high, first["rise"]
    assert first["growth"]["delta"] == pytest.approx(HUNGRY_MIB - BASE_MIB, abs=GROWTH_MARGIN_MIB)
    failed = nbmon("compare", old, new, "--fail-if", "rise>+50%", cwd=root)
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout.splitlines()[4].startswith("[3]")   # the table's first row: the hungrier cell
    [said] = failed.stderr.splitlines()   # one line: the one cell that broke the rule
    assert said.startswith(f"nbmon: [3] a = np.ones({HUNGRY_MIB} * 2**20 // 8): rise +")
    assert said.endswith("breaks rise>+50%")
    assert nbmon("compare", old, new, "--fail-if", "rise>+400%", cwd=root).returncode == 0


def test_a_notebook_executed_by_nbconvert_is_read(runs):
    root, old, _new = runs
    nb = nbformat.read(old, as_version=4)
    for cell in nb.cells:
        cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, root / "plain.ipynb")
    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                           "plain.ipynb", "--output", "converted.ipynb"], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = nbmon("report", root / "converted.ipynb", "--json", cwd=root)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["totals"]["cells_with_records"] == 4


def test_a_cell_run_again_says_how_it_compares_with_its_last_run(tmp_path):
    """The same cell run twice in one kernel, the second time allocating
    96 MiB while the first run's 32 MiB are still held: its line and its
    history row say the kernel's peak rose by the 96 MiB."""
    same = "x = np.ones(n * 2**20 // 8)"
    nb = new_notebook(metadata={"kernelspec": KERNELSPEC}, cells=[
        new_code_cell("%load_ext nbmon\n%resmon auto on --threshold 0"), new_code_cell("import numpy as np"),
        new_code_cell("n = 32"), new_code_cell(same), new_code_cell("n = 96"), new_code_cell(same),
        new_code_cell("import nbmon\nh = nbmon.history()\n"
                      "print(h[['execution_count', 'peak_mem_vs_last_mb']].to_json(orient='values'))")])
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    rows = dict(json.loads(next(o.text for o in nb.cells[-1].outputs if o.output_type == "stream")))
    assert rows[4] is None and rows[2] is None   # a first run: nothing to compare with
    assert rows[6] == pytest.approx(96, abs=GROWTH_MARGIN_MIB)
    [first], [again] = ([o.data["text/plain"] for o in nb.cells[i].outputs] for i in (3, 5))
    assert "vs its last run" not in first
    said = re.search(r"vs its last run: [-+][\d.]+ m?s, peak \+([\d.]+) MiB$", again)
    assert said and float(said[1]) == pytest.approx(96, abs=GROWTH_MARGIN_MIB), again
