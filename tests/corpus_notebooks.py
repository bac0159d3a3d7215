"""The corpus of realistic notebooks (``tests/corpus/*.ipynb``: pandas with
many small cells, matplotlib plots with and without ``;``, a model fitted
by hand with NumPy, ``%%time``/``%timeit``, errors) and how to run one as a
user would in each mode, in a real kernel (nbclient): plain, with
``%resmon auto on``, and with ``%%resmon`` on every cell. The test suite
(tests/test_corpus.py) and benchmarks/bench_corpus.py run them.

Every mode starts with one set-up cell (``pass`` when plain), so that the
notebook's own cells keep their prompt numbers in every mode.
"""
from __future__ import annotations

import copy
import re
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell

CORPUS = Path(__file__).parent / "corpus"
NOTEBOOKS = sorted(p.stem for p in CORPUS.glob("*.ipynb"))
SETUP = {"plain": "pass", "auto": "%load_ext nbmon\n%resmon auto on", "resmon": "%load_ext nbmon"}
MODES = tuple(SETUP)


def notebook(name: str, mode: str, *, last: str | None = None):
    """The corpus notebook ``name`` as run in ``mode``; ``last``: a cell added at its end."""
    nb = nbformat.read(CORPUS / f"{name}.ipynb", as_version=4)
    nb = copy.deepcopy(nb)
    if mode == "resmon":
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.source = "%%resmon\n" + cell.source
    nb.cells.insert(0, new_code_cell(SETUP[mode]))
    if last is not None:
        nb.cells.append(new_code_cell(last))
    return nb


def run(nb, cwd: Path, env: dict | None = None) -> float:
    """Execute ``nb`` in a fresh kernel (``env``: its environment), errors
    and all, as "Run All" does with errors allowed; the seconds its cells
    took, the kernel's start apart."""
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}})
    with client.setup_kernel(**({"env": env} if env is not None else {})):
        t0 = time.perf_counter()
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        seconds = time.perf_counter() - t0
    return seconds


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def traceback_text(lines: list[str]) -> str:
    """A traceback's text, prompt and line numbers out (a ``%%resmon`` cell's
    lines start at 2: the magic's line is 1, a blank line in its context)."""
    text = re.sub(r"\d+", "N", _ANSI.sub("", "\n".join(lines)))
    return re.sub(r"\n *N? *\n", "\n", text)
