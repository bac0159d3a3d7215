"""``nbmon report`` and ``nbmon compare`` on notebooks nobody executed with
this nbmon (issue 45): damaged files, foreign notebooks, records planted by
hand or written by a newer nbmon. Each is one line and exit status 2, or is
read as far as it can be and says what it passed over; nothing in a file is
run, and nothing in it reaches the terminal as an escape."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nbmon.report.notebooks import RECORD_MIME

NBMON = [sys.executable, "-m", "nbmon.cli"]


def nbmon(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*NBMON, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=60)


def summary(seconds: float, peak_mb: float, growth_mb: float) -> dict:
    return {"peak_rss_mb": peak_mb, "mean_rss_mb": peak_mb, "peak_gpu_mem_mb": None, "mean_gpu_util": None,
            "memory_growth_mb": growth_mb, "num_samples": 3, "duration_sec": seconds}


def notebook(*cells) -> dict:
    """nbformat 4 JSON, a code cell per (source, record data or None)."""
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "source": source, "metadata": {}, "execution_count": i + 1,
         "outputs": [] if data is None else [{"output_type": "display_data", "metadata": {},
                                              "data": {"text/plain": "nbmon", RECORD_MIME: data}}]}
        for i, (source, data) in enumerate(cells)]}


def record(s: dict, version: int = 1, **more) -> dict:
    return {"version": version, "kind": "line", "status": "ok", "summary": s, **more}


def write(path, content) -> str:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


@pytest.mark.parametrize("content, says", [
    ('{"nbformat": 4, "cells": [', "not a notebook (not JSON"),
    ("[" * 100_000, "not a notebook (not JSON"),
    ('{"cells": "x"}', "not a notebook (JSON without nbformat 4's cells)"),
    (json.dumps(notebook(("x = 1", None))), "no nbmon records in its outputs"),
])
def test_a_damaged_or_foreign_notebook_is_one_line_and_status_2(tmp_path, content, says):
    path = write(tmp_path / "bad.ipynb", content)
    for args in (("report", path), ("compare", path, path)):
        done = nbmon(*args, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", done
        [line] = done.stderr.splitlines()
        assert line.startswith("nbmon: error: ") and says in line, line


def test_a_missing_notebook_is_one_line(tmp_path):
    done = nbmon("report", tmp_path / "gone.ipynb", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "cannot be read" in done.stderr


def test_planted_and_newer_records_are_read_as_far_as_they_go(tmp_path):
    path = write(tmp_path / "planted.ipynb", notebook(
        ("\x1b]0;owned\x07print('hi')", record(summary(2.0, 300.0, 100.0))),
        (["x = ", 7, "\n"], record({"peak_rss_mb": "lots"})),   # a summary that does not read
        ("y = 2", record(summary(1.0, 200.0, 50.0), version=99, future_field={"a": 1})),
        ("z = 3", "not a dict"),
        ("w = 4", None)))
    done = nbmon("report", path, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "2 of 5 code cells have records" in done.stdout
    assert "records of a newer nbmon (version 99; this one writes 1)" in done.stdout
    assert "1 record(s) without a readable summary passed over" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert [row.split()[0] for row in rows] == ["[1]", "[3]"]   # the longest first


def test_compare_matches_cells_by_id_then_by_source(tmp_path):
    old = write(tmp_path / "old.ipynb", notebook(("a = 1", record(summary(1.0, 100.0, 10.0))),
                                                 ("b = 2", record(summary(1.0, 100.0, 10.0)))))
    new_nb = notebook(("a = 1", record(summary(1.0, 100.0, 10.0))), ("b = 2", record(summary(3.0, 100.0, 10.0))))
    for cell in new_nb["cells"]:
        cell["id"] = "other-" + cell["id"]   # a copy of the notebook: new ids, the same sources
    new = write(tmp_path / "new.ipynb", new_nb)
    done = nbmon("compare", old, new, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert [(c["old_index"], c["new_index"]) for c in got["cells"]] == [(1, 1), (0, 0)]   # the slower first
    assert got["cells"][0]["time"] == {"old": 1.0, "new": 3.0, "delta": 2.0, "ratio": 2.0}
    assert nbmon("compare", old, new, "--fail-if", "time>+1.5", cwd=tmp_path).returncode == 1
    assert nbmon("compare", old, new, "--fail-if", "time>+2.5", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("rule", ["time>+x%", "memory>+20%", "time<+1", ""])
def test_a_bad_rule_is_one_line_before_anything_is_read(tmp_path, rule):
    done = nbmon("compare", tmp_path / "a.ipynb", tmp_path / "b.ipynb", "--fail-if", rule, cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "expected METRIC>+N or METRIC>+N%" in done.stderr
