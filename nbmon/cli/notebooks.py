"""``nbmon report NOTEBOOK.ipynb`` and ``nbmon compare OLD.ipynb NEW.ipynb``:
what each cell of a saved or executed notebook cost, from the records nbmon
left in its outputs (:mod:`nbmon.report.notebooks`), and what changed
between two runs of it. A file that is no notebook, or holds no record, is
one line and exit status 2; a ``--fail-if`` rule broken is exit status 1."""
from __future__ import annotations

import json
import sys

from ..format import printable
from ..report import notebooks

SORTS = tuple(name for name, _, _ in notebooks.METRICS)


def is_notebook_file(path: str) -> bool:
    """Whether ``path`` holds a notebook (told by its content: one JSON
    document with nbformat's cells; a ranks file is JSON Lines); a file
    named .ipynb is taken for one, whatever it holds, to be refused as one."""
    if path.endswith(".ipynb"):
        return True
    try:
        with open(path, encoding="utf-8") as f:
            return notebooks.is_notebook(json.load(f))
    except (OSError, UnicodeDecodeError, ValueError):
        return False


def _read(path: str) -> notebooks.NotebookCosts:
    costs = notebooks.read_notebook(path)
    if not costs.cells and not costs.notes:   # a post-mortem alone is worth its line
        raise notebooks.NotebookError(f"{path}: no nbmon records in its outputs (run it with %load_ext nbmon and "
                                      "%resmon auto on, or %%resmon cells, and save it)")
    return costs


def report(path: str, sort: str, top: int | None, as_json: bool, html: str | None, force: bool) -> int:
    from ..views.pages import write_page

    costs = _read(path)
    if as_json:
        print(json.dumps(notebooks.report_json(costs, sort, top), indent=1))
    else:
        print(printable(notebooks.report_text(costs, sort, top)))
    if html:
        write_page(html, path, notebooks.report_html(costs, sort, top), overwrite=force)
    return 0


def compare(old_path: str, new_path: str, rules: list[str], top: int | None, as_json: bool) -> int:
    parsed = [notebooks.parse_rule(rule) for rule in rules]
    old, new = _read(old_path), _read(new_path)
    if as_json:
        print(json.dumps(notebooks.compare_json(old, new), indent=1))
    else:
        print(printable(notebooks.compare_text(old, new, top)))
    changes, _, _ = notebooks.match(old, new)
    broken = notebooks.broken(changes, parsed)
    for line in broken:
        print(printable(f"nbmon: {line}"), file=sys.stderr)
    return 1 if broken else 0
