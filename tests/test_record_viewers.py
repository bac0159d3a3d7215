"""A saved notebook's nbmon records read right wherever it goes: a notebook
run by nbclient (so never signed: untrusted, like a colleague's copy or a
repository checkout) and the same notebook trusted, opened in JupyterLab and
Notebook 7 in headless Chromium, exported by nbconvert with and without
``--sanitize-html``, and rendered with a strict allowlist like GitHub's
(html-pipeline's: no styles, classes, SVG or scripts). In each, light and
dark: the table is a table (every figure in its own cell, no markup shown as
text), the timeline is a picture the browser decoded, and the live
dashboard's record says that a live chart stood there. Screenshots:
tests/artifacts/record-<viewer>-<theme>.png."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys

import bleach
import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from nbformat.v4 import new_code_cell, new_notebook

from browser_util import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, JupyterLab, need_chromium, wait_for
from dashboard_page import COLORS
from nbmon.report.notebooks import RECORD_MIME

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
WORK = ("%%resmon --label work\nimport time\nblock = bytearray(200 * 2**20)\nt0 = time.perf_counter()\n"
        "while time.perf_counter() - t0 < 0.8:\n    pass\n'done'")
CELLS = ["%load_ext nbmon", "%resmon --interval 0.05", WORK,
         "time.sleep(3)",   # the dashboard re-sends its record at most every 2 s: the last one has the cell
         "import nbmon\nnbmon.history()[['label', 'status']]"]   # a DataFrame: how the viewer shows any table
RECORDS = 2          # the dashboard's record and the cell's
PICTURE_PX = 720     # a timeline's width in pixels (360 CSS px, twice the resolution)
THEMES = ("light", "dark")

# GitHub's notebook renderer sanitizes HTML outputs with html-pipeline's
# SanitizationFilter allowlist (lib/html/pipeline/sanitization_filter.rb).
GITHUB_TAGS = ["h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "br", "b", "i", "strong", "em", "a", "pre", "code",
               "img", "tt", "div", "ins", "del", "sup", "sub", "p", "ol", "ul", "table", "thead", "tbody", "tfoot",
               "blockquote", "dl", "dt", "dd", "kbd", "q", "samp", "var", "hr", "ruby", "rt", "rp", "li", "tr", "td",
               "th", "s", "strike", "summary", "details"]
GITHUB_ALL = ["abbr", "accept", "accept-charset", "accesskey", "action", "align", "alt", "axis", "border",
              "cellpadding", "cellspacing", "char", "charoff", "charset", "checked", "clear", "cols", "colspan",
              "color", "compact", "coords", "datetime", "dir", "disabled", "enctype", "for", "frame", "headers",
              "height", "hreflang", "hspace", "ismap", "label", "lang", "maxlength", "media", "method", "multiple",
              "name", "nohref", "noshade", "nowrap", "open", "prompt", "readonly", "rel", "rev", "rows", "rowspan",
              "rules", "scope", "selected", "shape", "size", "span", "start", "summary", "tabindex", "target",
              "title", "type", "usemap", "valign", "value", "vspace", "width", "itemprop"]
GITHUB_ATTRS = {"*": GITHUB_ALL, "a": ["href"] + GITHUB_ALL, "img": ["src", "longdesc"] + GITHUB_ALL,
                "div": ["itemscope", "itemtype"] + GITHUB_ALL}
GITHUB_CSS = {"light": "body{font:14px/1.5 sans-serif;background:#fff;color:#1f2328;margin:16px}",
              "dark": "body{font:14px/1.5 sans-serif;background:#0d1117;color:#e6edf3;margin:16px}"}


def github_page(nb, theme: str) -> str:
    """The notebook as GitHub shows one: per output its HTML (allowlist-sanitized),
    else its PNG, else its text."""
    parts = []
    for cell in nb.cells:
        parts.append(f"<pre>{html.escape(cell.source)}</pre>")
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/html" in data:
                body = bleach.clean(data["text/html"], tags=GITHUB_TAGS, attributes=GITHUB_ATTRS, strip=True)
            elif "image/png" in data:
                width = out.get("metadata", {}).get("image/png", {}).get("width")
                body = f'<img src="data:image/png;base64,{data["image/png"]}"' + (f' width="{width}">' if width else ">")
            else:
                body = f"<pre>{html.escape(data.get('text/plain', out.get('text', '')))}</pre>"
            parts.append(f'<div class="gh-output">{body}</div>')
    return f"<!DOCTYPE html><html><head><style>{GITHUB_CSS[theme]}</style></head><body>{''.join(parts)}</body></html>"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The notebook run by nbclient and written to disk, never signed; and a trusted copy."""
    need_chromium()
    base = tmp_path_factory.mktemp("viewers")
    root = base / "root"
    root.mkdir()
    nb = new_notebook(metadata={"kernelspec": KERNELSPEC}, cells=[new_code_cell(c) for c in CELLS])
    runtime = base / "runtime"   # a private directory of its own: no post-mortem of another test's kernel
    runtime.mkdir(mode=0o700)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_RUNTIME_DIR", str(runtime))
        NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
    assert "a kernel of yours died" not in json.dumps(nb.cells[0].outputs)
    work = nb.cells[CELLS.index(WORK)].outputs
    # The notebook itself holds the cell's record, before any viewer reads it.
    assert any("Duration" in out.get("data", {}).get("text/html", "") for out in work), \
        [(out.output_type, out.get("text") or out.get("data", {}).get("text/plain", "")) for out in work]
    nbformat.write(nb, root / "untrusted.ipynb")
    trusted = nbformat.from_dict({**nb, "metadata": {**nb.metadata, "copy": "trusted"}})
    nbformat.write(trusted, root / "trusted.ipynb")   # other bytes: a signature is of the content, not the name
    server = JupyterLab(base, root)
    done = subprocess.run([sys.executable, "-m", "jupyter", "trust", str(root / "trusted.ipynb")],
                          env=server.env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    server.start()
    try:
        yield server, nb
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


# What the page shows: every table that has a "Duration" row, the elements
# around it up to its output, the pictures, and contrasts, read in the page.
READ = "() => {" + COLORS + r"""
  const output = (el) => el.closest(".jp-OutputArea-output, .gh-output") || el.parentElement;
  const tables = [...document.querySelectorAll("table")].filter((t) =>
    [...t.querySelectorAll("td, th")].some((c) => c.textContent.trim() === "Duration"));
  const records = tables.map((t) => {
    const out = output(t);
    const cell = t.querySelector("td");
    const bg = backdrop(cell);
    return {
      rows: [...t.rows].map((r) => [...r.cells].map((c) => c.textContent.trim())),
      text: out.textContent, svg: out.querySelectorAll("svg").length,
      contrast: contrast(over(rgb(getComputedStyle(cell).color), bg), bg),
    };
  });
  const pictures = [...document.querySelectorAll("img")].filter((i) => i.complete && i.naturalWidth === %PX%)
    .map((img) => {
      const canvas = document.createElement("canvas");
      canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
      const ctx = canvas.getContext("2d");
      ctx.drawImage(img, 0, 0);
      const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
      let drawn = 0;
      for (let i = 0; i < px.length; i += 4) if (px[i + 3] === 255 && Math.max(px[i], px[i + 1], px[i + 2]) - Math.min(px[i], px[i + 1], px[i + 2]) > 60) drawn++;
      // its size as laid out, or as set (Notebook 7 lays out cells out of view lazily)
      return { width: img.getBoundingClientRect().width || +img.getAttribute("width"), drawn };
    });
  const frames = [...document.querySelectorAll("table")].filter((t) => t.textContent.includes("work")
    && !tables.includes(t)).map((t) => output(t).textContent);
  // textContent, not innerText: Notebook 7 renders cells out of view lazily
  return { records, pictures, frames, body: document.body.textContent };
}""".replace("%PX%", str(PICTURE_PX))

TAG_TEXT = re.compile(r"</?[a-z][a-z0-9]*\b[^<>]*>")


def check(shown: dict, viewer: str) -> None:
    records = shown["records"]
    assert len(records) == RECORDS, (viewer, records)
    for record in records:
        rows = {r[0]: r[1:] for r in record["rows"]}
        assert all(len(r) == 2 for r in record["rows"]), record["rows"]   # a label and its figure
        assert re.fullmatch(r"\d+\.\d\d s", rows["Duration"][0]), rows
        # a sampled peak may carry the bound of what it could have missed: '300 MiB (at most 302 MiB)'
        assert re.fullmatch(r"[\d.]+ (MiB|GiB)( \(at most [\d.]+ (MiB|GiB)\))?",
                            next(v[0] for k, v in rows.items() if k.startswith("Peak memory")))
        assert rows["Timeline, below"][0].startswith("top: CPU to "), rows
        assert record["svg"] == 0, viewer                   # no inline SVG anywhere
        assert record["contrast"] >= 4.5, (viewer, record["contrast"])
        leaked = set(TAG_TEXT.findall(record["text"]))
        if viewer == "nbconvert-sanitized":
            # nbconvert's sanitizer escapes the tbody that every table gets while
            # parsing (a DataFrame's the same, below): nbconvert's, not ours
            assert leaked <= {"<tbody>", "</tbody>"}, leaked
            assert all("<tbody>" in text for text in shown["frames"]), shown["frames"]
        else:
            assert not leaked, (viewer, leaked)
        assert "&lt;" not in record["text"] and "style=" not in record["text"]
    assert "a live chart stood here; its figures as of" in shown["body"], viewer
    pictures = shown["pictures"]
    assert len(pictures) == RECORDS, (viewer, pictures)
    assert all(p["width"] == PICTURE_PX / 2 and p["drawn"] > 300 for p in pictures), (viewer, pictures)


def set_theme(lab, theme: str) -> None:
    path = lab.base / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"theme": "JupyterLab Dark" if theme == "dark" else "JupyterLab Light"}))


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("front", ["lab", "nb7"])
@pytest.mark.parametrize("trust", ["untrusted", "trusted"])
def test_jupyterlab_and_notebook7(saved, browser, front, trust, theme):
    lab, _nb = saved
    viewer = f"{front}-{trust}"
    set_theme(lab, theme)
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    try:
        path = "lab/tree" if front == "lab" else "notebooks"
        page.goto(f"{lab.url}/{path}/{trust}.ipynb?reset&token={lab.token}", timeout=120_000)
        page.wait_for_function(f"document.body.dataset.jpThemeLight === '{str(theme == 'light').lower()}'",
                               timeout=60_000)
        shown = wait_for(lambda: (s := page.evaluate(READ)) and len(s["pictures"]) == RECORDS and s, 60,
                         f"the records in {viewer}")
        page.screenshot(path=str(ARTIFACTS / f"record-{viewer}-{theme}.png"), full_page=True)
        check(shown, viewer)
        # what the server told the front end: the signature checked, outputs trusted or not
        cells = lab.api(f"/api/contents/{trust}.ipynb")["content"]["cells"]
        assert {c["metadata"].get("trusted") for c in cells} == {trust == "trusted"}
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"record-{viewer}-{theme}-failure.png"), full_page=True)
        raise
    finally:
        page.close()
        for kernel in lab.api("/api/kernels") or []:
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("viewer", ["nbconvert", "nbconvert-sanitized", "github"])
def test_static_html(saved, browser, tmp_path, viewer, theme):
    _lab, nb = saved
    if viewer == "github":
        body = github_page(nb, theme)
    else:
        body, _ = HTMLExporter(sanitize_html=viewer == "nbconvert-sanitized", theme=theme).from_notebook_node(nb)
    path = tmp_path / f"{viewer}.html"
    path.write_text(body, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    try:
        page.goto(path.as_uri())
        shown = wait_for(lambda: (s := page.evaluate(READ)) and len(s["pictures"]) == RECORDS and s, 30,
                         f"the records in {viewer}")
        page.screenshot(path=str(ARTIFACTS / f"record-{viewer}-{theme}.png"), full_page=True)
        check(shown, viewer)
    finally:
        page.close()


def test_jupyterlab_saves_the_records_data(saved, browser):
    """Saved through JupyterLab's UI, the notebook keeps what each record
    carries as data (issue 45), which no viewer shows."""
    lab, nb = saved
    path = lab.root / "saved-in-lab.ipynb"
    nbformat.write(nb, path)
    written = path.stat().st_mtime_ns
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    try:
        page.goto(f"{lab.url}/lab/tree/{path.name}?reset&token={lab.token}", timeout=120_000)
        wait_for(lambda: (s := page.evaluate(READ)) and len(s["pictures"]) == RECORDS and s, 60, "the records")
        assert RECORD_MIME.split("/")[1] not in page.evaluate(READ)["body"]   # the data is not shown
        page.click(".jp-NotebookPanel .jp-Cell .jp-InputPrompt")
        page.keyboard.press("Control+s")
        wait_for(lambda: path.stat().st_mtime_ns != written, 30, "JupyterLab's save")
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "record-lab-save-failure.png"), full_page=True)
        raise
    finally:
        page.close()
        for kernel in lab.api("/api/kernels") or []:
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)
    kept = [out.data[RECORD_MIME] for out in nbformat.read(path, as_version=4).cells[CELLS.index(WORK)].outputs
            if RECORD_MIME in out.get("data", {})]
    assert len(kept) == 1 and kept[0]["label"] == "work" and kept[0]["kind"] == "cell", kept
    assert kept[0]["summary"]["duration_sec"] >= 0.8   # the cell's own loop ran 0.8 s
