"""Realistic notebooks (tests/corpus), run in real kernels plain, with auto
mode and with ``%%resmon`` on every cell (issue 41): nbmon changes none of
their outputs, adds one record per monitored cell that fits the page, and
its figures agree with what is measured outside it (the sizes a cell
allocates, the kernel's own message timestamps)."""
from __future__ import annotations

import datetime
import json
import re

import pytest

from browser_util import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, need_chromium
from corpus_notebooks import MODES, NOTEBOOKS, notebook, run, traceback_text
from helpers import figure

HISTORY = ("import nbmon\n"
           "print(nbmon.history()[['execution_count', 'duration_sec', 'mem_growth_mb']].to_json(orient='records'))")
PAGE_SHARE = {"auto": 0.15, "resmon": 0.30}   # nbmon's most of a page's height (issue 41)
MIB = 2 ** 20


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(notebook, mode): (the executed notebook, seconds)}, the history of
    the ``%%resmon`` runs in a last cell of their own."""
    cwd = tmp_path_factory.mktemp("corpus")
    done = {}
    for name in NOTEBOOKS:
        for mode in MODES:
            nb = notebook(name, mode, last=HISTORY if mode == "resmon" else None)
            done[name, mode] = nb, run(nb, cwd)
    return done


def is_nbmons(output) -> bool:
    """An output nbmon shows: a record, a line, a timeline, a kept place."""
    data = output.get("data", {})
    html, text = data.get("text/html", ""), data.get("text/plain", "")
    return 'class="nbmon-' in html or text.startswith("nbmon") or (text == "" and html == "" and "data" in output)


def own_outputs(cell) -> list[tuple]:
    """The cell's outputs but nbmon's, as plain IPython would show them
    across runs: timings, addresses, prompt and line numbers out."""
    out = []
    for o in cell.get("outputs", []):
        if is_nbmons(o):
            continue
        if o.output_type == "stream":   # %%time, %timeit: times and their units; one stream may come in parts
            text = re.sub(r"\d", "N", re.sub(r"[\d.]+\s*(ns|µs|μs|us|ms|s|min)\b", "T", o.text))
            if out and out[-1][0] == o.name:
                text = out.pop()[1] + text
            out.append((o.name, text))
        elif o.output_type == "error":   # line numbers: a %%resmon cell's lines are one further
            out.append((o.ename, re.sub(r"\d+", "N", o.evalue), traceback_text(o.traceback)))
        else:
            data = o.data
            out.append((o.output_type, o.get("execution_count"), sorted(data),
                        re.sub(r"0x[0-9a-f]+", "0x", data.get("text/plain", "")), data.get("text/html")))
    return out


def code_cells(nb) -> list:
    return [c for c in nb.cells[1:] if c.cell_type == "code"]


@pytest.mark.parametrize("mode", [m for m in MODES if m != "plain"])
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_nbmon_changes_no_output_of_a_realistic_notebook(runs, name, mode):
    plain, watched = code_cells(runs[name, "plain"][0]), code_cells(runs[name, mode][0])[:len(code_cells(runs[name, "plain"][0]))]
    differ = [(c.source, own_outputs(c), own_outputs(w)) for c, w in zip(plain, watched)
              if own_outputs(c) != own_outputs(w) or c.execution_count != w.execution_count]
    figure(f"corpus {name}: outputs that differ", mode=mode, cells=len(plain), differ=len(differ))
    assert differ == []
    assert all(any(o.output_type == "error" for o in c.outputs) for c in plain if "no_such" in c.source or
               "if results['k'] > 3:" in c.source)   # the notebooks' own errors happened


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_resmon_cell_keeps_one_record_that_fits(runs, name):
    nb, _ = runs[name, "resmon"]
    for cell in code_cells(nb)[:-1]:
        records = [o for o in cell.outputs if 'class="nbmon-summary"' in o.get("data", {}).get("text/html", "")]
        widgets = [o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert len(records) == 1 and widgets == [], cell.source   # the record, never the live meter
        text = records[0].data["text/plain"]
        if "<details>" in records[0].data["text/html"]:   # folded: a line
            assert len(text.splitlines()) <= 3, text


def kernel_seconds(cell) -> float:
    """The cell's run by the kernel's own message timestamps (nbclient keeps them)."""
    times = cell.metadata["execution"]
    start, end = (datetime.datetime.fromisoformat(times[k].replace("Z", "+00:00"))
                  for k in ("iopub.execute_input", "shell.execute_reply"))
    return (end - start).total_seconds()


def history_of(nb) -> dict[int, dict]:
    rows = json.loads(next(o.text for o in nb.cells[-1].outputs if o.output_type == "stream"))
    return {row["execution_count"]: row for row in rows}


def test_a_records_figures_agree_with_what_the_cell_did(runs):
    nb, _ = runs["fit", "resmon"]
    history = history_of(nb)
    by_source = {c.source.split("\n", 1)[1]: history[c.execution_count] for c in code_cells(nb)[:-1]}
    allocated = 4096 * 4096 * 8 / MIB   # np.ones((4096, 4096))
    made = next(v for k, v in by_source.items() if k.startswith("big = np.ones"))
    freed = by_source["del big"]
    figure("corpus: a 128 MiB array", made_mb=made["mem_growth_mb"], freed_mb=freed["mem_growth_mb"])
    assert made["mem_growth_mb"] == pytest.approx(allocated, abs=4)
    assert freed["mem_growth_mb"] == pytest.approx(-allocated, abs=4)

    plots, _ = runs["plots", "resmon"]
    rows = history_of(plots)
    panels = next(c for c in code_cells(plots) if "subplots(8, 8" in c.source)   # drawn after its code
    kernel_s, nbmon_s = kernel_seconds(panels), rows[panels.execution_count]["duration_sec"]
    figure("corpus: a cell of 64 plots", kernel_s=kernel_s, nbmon_s=nbmon_s)
    assert 0.8 * kernel_s <= nbmon_s <= kernel_s + 0.05


# The page's height, and the height of the outputs that are nbmon's: its records,
# lines, timelines (the pictures given, as base64) and the empty places it kept.
MEASURE = """(timelines) => {
  let nbmon = 0;
  for (const output of document.querySelectorAll(".jp-OutputArea-child")) {
    const img = output.querySelector("img");
    if (output.querySelector(".nbmon-summary, .nbmon-oneline")
        || (img && timelines.some((png) => img.src.endsWith(png)))
        || !output.querySelector(".jp-OutputArea-output").innerHTML.trim()) {
      nbmon += output.getBoundingClientRect().height;
    }
  }
  return { page: document.documentElement.scrollHeight, nbmon };
}"""


def timelines(nb) -> list[str]:
    return [o.data["image/png"] for c in nb.cells for o in c.get("outputs", [])
            if o.get("data", {}).get("text/plain", "").startswith("nbmon timeline")]


@pytest.fixture(scope="module")
def heights(runs, tmp_path_factory):
    """{(notebook, mode): {page, nbmon}: heights in px}, as nbconvert's HTML in Chromium."""
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    need_chromium()
    out, pages = {}, tmp_path_factory.mktemp("corpus-pages")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        for (name, mode), (nb, _) in runs.items():
            body, _ = HTMLExporter().from_notebook_node(nb)
            path = pages / f"{name}-{mode}.html"
            path.write_text(body, encoding="utf-8")
            page.goto(path.as_uri(), wait_until="load")
            out[name, mode] = page.evaluate(MEASURE, timelines(nb))
            if mode != "plain":
                page.screenshot(path=str(ARTIFACTS / f"corpus-{name}-{mode}.png"), full_page=True)
            if mode == "resmon":   # to look at: a line, an open record and a failed one, in the dark
                path.write_text(HTMLExporter(theme="dark").from_notebook_node(nb)[0], encoding="utf-8")
                page.goto(path.as_uri(), wait_until="load")
                page.screenshot(path=str(ARTIFACTS / f"corpus-{name}-{mode}-dark.png"), full_page=True)
        chromium.close()
    return out


@pytest.mark.browser
@pytest.mark.parametrize("mode", [m for m in MODES if m != "plain"])
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_nbmons_share_of_the_page_stays_small(runs, heights, name, mode):
    plain, watched = heights[name, "plain"], heights[name, mode]
    share = watched["nbmon"] / watched["page"]
    figure(f"corpus {name}: page height", mode=mode, plain_px=plain["page"], watched_px=watched["page"],
           nbmon_px=round(watched["nbmon"]), share=round(share, 3),
           plain_s=round(runs[name, "plain"][1], 2), watched_s=round(runs[name, mode][1], 2))
    assert plain["nbmon"] == 0   # what is counted is nbmon's only
    assert share <= PAGE_SHARE[mode]
