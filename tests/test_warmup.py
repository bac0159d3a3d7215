"""nbmon's own start-up stays out of the user's cells, in a real kernel
(nbclient): ``%load_ext nbmon`` starts the session's helper process (which
imports what the session needs there), so a monitored cell right after it
reports what the cell did (an idle block: no CPU, no memory), and plotly's
``fig.show()`` works as without nbmon (nbmon imports nothing of plotly's
into the kernel; where it does, with ``--session kernel``, it defers
nbformat, which a FigureWidget never uses)."""

from __future__ import annotations

import ast

import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from browser_util import mib, row, seconds, summary_rows

IDLE = "%%resmon --label {label}\nimport time\ntime.sleep(0.5)"
CELLS = [
    "%load_ext nbmon",
    IDLE.format(label="first"),      # right after %load_ext: today's warm-up landed here
    IDLE.format(label="second"),
    "import sys\nprint(sorted(m for m in ('nbformat', 'jsonschema', 'rfc3987_syntax') if m in sys.modules))",
    "import plotly.graph_objects as go\ngo.Figure(go.Scatter(x=[1, 2], y=[3, 4])).show(renderer='notebook_connected')",
    "print(sorted(m for m in ('nbformat', 'jsonschema') if m in sys.modules))",
]
IDLE_MIB = 1.0     # "an idle monitored block reports <= 1 MiB" (README); the warm-up added 4-26 MiB
IDLE_CPU_S = 0.1   # sleeping costs ~0.01 s of CPU; the warm-up added 0.4-0.6 s


@pytest.fixture(scope="module")
def executed():
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
                      cells=[new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    return nb


def figures(cell) -> dict[str, str]:
    (html,) = [o["data"]["text/html"] for o in cell.outputs if "nbmon-summary" in o.get("data", {}).get("text/html", "")]
    return summary_rows(html)


@pytest.mark.parametrize("index", [1, 2])
def test_an_idle_cell_right_after_load_ext_reports_only_itself(executed, index):
    rows = figures(executed.cells[index])
    assert float(row(rows, "CPU time").split()[0]) <= IDLE_CPU_S, rows
    assert abs(mib(row(rows, "Memory growth"))) <= IDLE_MIB, rows
    assert 0.45 <= seconds(row(rows, "Duration")) < 1.0, rows   # the cell's own time: no wait inside it


def test_plotly_imports_nbformat_only_when_it_needs_it(executed):
    before = ast.literal_eval(executed.cells[3].outputs[0]["text"])
    assert before == [], before            # the warm-up imported plotly, not nbformat -> jsonschema
    shown = [o for o in executed.cells[4].outputs if o["output_type"] == "display_data"]
    assert shown and "text/html" in shown[0]["data"], executed.cells[4].outputs   # fig.show() works
    assert ast.literal_eval(executed.cells[5].outputs[0]["text"]) == ["jsonschema", "nbformat"]
