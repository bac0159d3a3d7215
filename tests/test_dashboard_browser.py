"""The live dashboard in a real JupyterLab and Notebook 7, driven by headless
Chromium: it shows at once, streams one-way (no message back, no kernel
status flicker, a few KiB/s), marks cells, follows the dark theme, and a
notebook saved while it runs shows its figures after the kernel is gone."""

from __future__ import annotations

import base64
import contextlib
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from browser_util import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, JupyterLab, need_chromium, wait_for
from dashboard_page import CONTRASTS, INIT_SCRIPT, execute_time, idle_figures

IDLE_S = 30            # the window: an open dashboard, nothing running
FIRST_OUTPUT_S = 0.5   # %resmon to its first output in the page
KIB_PER_S = 4.0        # kernel -> browser while idle, default settings
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
# Cells 3 and 4 each run long enough (~1.3 s, ~0.8 s) for their bands to stand apart,
# each with its label, on the axis of the chart's first minute, however short the gap
# between them: bands less than 6 px apart merge where one is under 6 px wide, and a
# label shows only where it fits before the next band.
CELLS = ["%load_ext nbmon", "%resmon", "import time\ntotal = sum(range(3 * 10**7))\ntime.sleep(1)",
         "%%resmon --label labelled\ntime.sleep(0.8)\ntotal + 1"]
# A cell that runs until the test has seen what it needs (a file appears),
# not for a fixed time that a slow first page load could outlast.
WAIT_FOR = ("import pathlib, time\nt0 = time.monotonic()\n"
            "while not pathlib.Path({name!r}).exists() and time.monotonic() - t0 < 180:\n    time.sleep(0.05)")
WAIT_FOR_TEST = WAIT_FOR.format(name="go")
WINDOW_S = 8.0         # the window test's --window
MIN_CONTRAST = 4.5     # WCAG AA, for every text of the chart
# JS, with `full` a plot's _fullLayout: the bottom edge of its lowest subplot, where x tick labels go
PLOT_BOTTOM = ("Math.max(...Object.keys(full).filter(k => /^yaxis[0-9]*$/.test(k))"
               ".map(k => full[k]._offset + full[k]._length))")


def write_notebook(path: Path, cells) -> None:
    nbformat.write(new_notebook(metadata={"kernelspec": KERNELSPEC}, cells=[new_code_cell(c) for c in cells]), path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    need_chromium()
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "root"
    root.mkdir()
    for name in ("lab.ipynb", "nb7.ipynb"):
        write_notebook(root / name, CELLS)
    write_notebook(root / "stop.ipynb", ["%load_ext nbmon", "%resmon", WAIT_FOR_TEST, "%resmon stop"])
    write_notebook(root / "window.ipynb", ["%load_ext nbmon", f"%resmon --window {WINDOW_S:g} --interval 0.1", "x = 1",
                                           WAIT_FOR.format(name="window-go"), "%resmon stop"])
    # A threshold every kernel is past (0.5 % of the machine, or of a container's limit): the warning shows at once.
    write_notebook(root / "warning.ipynb", ["%load_ext nbmon", "%resmon --memory-warning 0.5",
                                            WAIT_FOR.format(name="warning-go"), "%resmon stop"])
    write_notebook(root / "classes.ipynb", ["%load_ext nbmon", "%resmon", WAIT_FOR.format(name="classes-go"),
                                            "%resmon stop"])
    write_notebook(root / "own.ipynb", ["%env NBMON_CHART_OUTPUT=widget", "%load_ext nbmon", "%resmon",
                                        WAIT_FOR.format(name="own-go"), "%resmon stop"])
    server = JupyterLab(base, root)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser(lab):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Page:
    """A page of the server with the frame recorder installed, its console
    errors kept, and a screenshot under tests/artifacts/ if the test fails."""

    def __init__(self, browser, lab, name: str):
        self.lab, self.name = lab, name
        self.page = browser.new_page(viewport={"width": 1300, "height": 1000})
        self.page.add_init_script(INIT_SCRIPT)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))

    def open(self, url: str) -> None:
        # reset: no tab left open by an earlier test's page comes back with the workspace
        self.page.goto(f"{self.lab.url}{url}?reset&token={self.lab.token}", timeout=120_000)
        if url.startswith("/lab"):  # its status bar names the kernel once the session is up
            self.page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\(ipykernel\) \| Idle")).wait_for(
                timeout=120_000)
        else:  # Notebook 7 has no status bar: its kernel idle for the server, and its toolbar's text
            wait_for(lambda: [s for s in self.lab.api("/api/sessions")
                              if s["path"] == url.split("/")[-1] and s["kernel"]["execution_state"] == "idle"],
                     120, "the notebook's kernel to be idle")
            self.page.get_by_text("Kernel status: Idle").wait_for(state="attached", timeout=120_000)

    def run_all(self) -> None:
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

    def frames(self):
        return self.page.evaluate("window.__nbmonFrames")

    def marks(self):
        return self.page.evaluate("window.__nbmonMarks")

    def now(self) -> float:
        return self.page.evaluate("performance.now()")

    def chart(self):
        """The live chart: what plotly drew, read from the page."""
        return self.page.evaluate("""async () => {
            const plot = document.querySelector('.nbmon-live-record .js-plotly-plot');
            if (!plot || !plot._fullLayout || !plot.__nbmonDrawn) return null;
            const drawn = plot.__nbmonDrawn.traces;
            // The canvas's pixels (painted by a worker: it sends them) in each kernel trace's own
            // colour: the lines as painted.
            const canvas = await plot.__nbmonPixels(), pixels = canvas.pixels;
            const hex = (c) => (c.match(/^#(..)(..)(..)$/) || []).slice(1).map(h => parseInt(h, 16));
            const inked = Object.fromEntries(plot._fullData.filter(t => /^proc_/.test(t.meta)).map(t => {
                const [r, g, b] = hex(t.line.color);
                let n = 0;
                for (let i = 0; i < pixels.length; i += 4) {
                    if (Math.abs(pixels[i] - r) + Math.abs(pixels[i + 1] - g) + Math.abs(pixels[i + 2] - b) < 30
                        && pixels[i + 3] > 200) n += 1;
                }
                return [t.meta, n];
            }));
            // Ink on the canvas in a box of the chart's pixels: under the bottom plot (the painted
            // x tick labels), in a band label's box or the title's (texts painted, not only reported).
            const full = plot._fullLayout, ratio = canvas.width / full.width;
            const ink = ([x, y, w, h], color = null) => {
                const [cr, cg, cb] = color ? color.match(/\\d+/g).map(Number) : [];
                let n = 0;
                for (let r = Math.max(0, Math.floor(y * ratio)); r < Math.min(canvas.height, (y + h) * ratio); r++)
                    for (let c = Math.max(0, Math.floor(x * ratio)); c < Math.min(canvas.width, (x + w) * ratio); c++) {
                        const i = 4 * (r * canvas.width + c);
                        if (pixels[i + 3] > 128 && (!color || Math.abs(pixels[i] - cr) + Math.abs(pixels[i + 1] - cg)
                                                     + Math.abs(pixels[i + 2] - cb) < 60)) n += 1;
                    }
                return n;
            };
            const bottom = PLOT_BOTTOM;
            const tickInk = ink([0, bottom + 2, full.width, 14]);
            const {labels, title} = plot.__nbmonDrawn;
            return {points: Object.fromEntries(drawn.map(t => [t.meta, t.y.length])), inked,
                    reacts: window.__nbmonReacts.length, redraws: window.__nbmonRedraws.length,
                    rendered: window.__nbmonRedraws.map(
                        r => (window.__nbmonRedrawFrames.find(f => f.t === r.t)?.ms ?? NaN) - r.ms),
                    names: plot.data.map(t => t.name), title: ink(title.box, title.color) > 20 ? title.text : null,
                    font: plot._fullLayout.font.color, width: plot._fullLayout.width,
                    room: plot.closest('.nbmon-live-record').clientWidth,
                    cells: labels.filter(l => ink(l.box, l.color) > 5).map(l => l.text),
                    hover: plot.__nbmonDrawn.bands,
                    bands: plot.__nbmonDrawn.x.bands, ticks: plot.__nbmonDrawn.x.ticks, tickInk,
                    last: Math.max(...drawn.map(t => t.x[t.x.length - 1] ?? -1)),
                    xrange: plot.__nbmonDrawn.x.range, plotlyX: full.xaxis.range, yrange: full.yaxis2.range};
        }""".replace("PLOT_BOTTOM", PLOT_BOTTOM))

    def download(self) -> dict:
        """Click the chart's download button; what the PNG holds, decoded by the browser: its size,
        the pixels in the first kernel trace's colour, and the ink under the bottom plot (tick labels)."""
        with self.page.expect_download(timeout=30_000) as info:
            self.page.locator('.nbmon-live-record .modebar-btn[data-title="Download plot as a PNG"]').first.click()
        data = base64.b64encode(Path(info.value.path()).read_bytes()).decode()
        return self.page.evaluate("""async (data) => {
            const plot = document.querySelector('.nbmon-live-record .js-plotly-plot');
            const full = plot._fullLayout;
            const image = await createImageBitmap(await (await fetch('data:image/png;base64,' + data)).blob());
            const canvas = Object.assign(document.createElement('canvas'), {width: image.width, height: image.height});
            const ctx = canvas.getContext('2d');
            ctx.drawImage(image, 0, 0);
            const pixels = ctx.getImageData(0, 0, image.width, image.height).data;
            const trace = plot._fullData.find(t => /^proc_/.test(t.meta));
            const [r, g, b] = trace.line.color.match(/^#(..)(..)(..)$/).slice(1).map(h => parseInt(h, 16));
            const bottom = PLOT_BOTTOM;
            let line = 0, ticks = 0;
            for (let i = 0; i < pixels.length; i += 4) {
                const y = Math.floor(i / 4 / image.width);
                if (pixels[i + 3] > 200 && Math.abs(pixels[i] - r) + Math.abs(pixels[i + 1] - g)
                    + Math.abs(pixels[i + 2] - b) < 30) line += 1;
                if (y > bottom + 2 && y < bottom + 16 && pixels[i + 3] > 128) ticks += 1;
            }
            return {size: [image.width, image.height], chart: [full.width, full.height], line, ticks};
        }""".replace("PLOT_BOTTOM", PLOT_BOTTOM), data)

    def contrasts(self) -> dict:
        return self.page.evaluate(CONTRASTS, self.page.locator(".nbmon-live-record .js-plotly-plot").first.element_handle())

    def plot_area(self) -> dict:
        """The first row's plot area on screen."""
        return self.page.locator(".nbmon-live-record .js-plotly-plot .nsewdrag").first.bounding_box()

    def hover(self, seconds: float) -> None:
        """Move the mouse to and fro across the first row for ``seconds``."""
        box = self.plot_area()
        steps = int(seconds / 0.05)
        for k in range(steps):
            frac = 0.1 + 0.8 * abs((k % 40) - 20) / 20
            self.page.mouse.move(box["x"] + box["width"] * frac, box["y"] + box["height"] / 2)
            self.page.wait_for_timeout(50)

    def sent(self, t0: float) -> list:
        return [f for f in self.frames() if f["dir"] == "send" and f["t"] >= t0]

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(ARTIFACTS / name), full_page=True)

    def failed(self, shot: str) -> None:
        """What a failed test leaves: a screenshot, and printed the page's errors,
        the cells' outputs as the page shows them and the server's log."""
        self.shot(shot)
        outputs = self.page.locator(".jp-OutputArea").all_inner_texts()
        print("page errors:", self.errors, "\n--- outputs ---\n", "\n--\n".join(o[:500] for o in outputs),
              "\n--- server log ---\n", self.lab.log_text())

    def idle_for(self, seconds: float) -> dict:
        t0 = self.now()
        self.page.wait_for_timeout(seconds * 1000)  # Playwright delivers events only inside its calls
        return idle_figures(self.frames(), t0, self.now())


def kernel_traces(chart) -> dict:
    """{trace: points drawn} of the kernel's own traces (its process tree's)."""
    return {k: n for k, n in chart["points"].items() if k.startswith("proc_")}


def wait_for_chart(page: Page, cells: int = 0, timeout: float = 90, ended: bool = False):
    """The chart once it has data and ``cells`` cell bands (with ``ended``,
    none of them a cell still running: a band's hover says "running" until
    its cell ends)."""
    seen = {}   # the last chart read, for the message if the wait fails

    def ready():
        seen["chart"] = chart = page.chart()
        return (chart and min(kernel_traces(chart).values()) > 3 and len(chart["cells"]) >= cells
                and not (ended and any(h.endswith("running") for h in chart["hover"])) and chart)

    try:
        return wait_for(ready, timeout, f"the live chart with data and {cells} cell band(s)")
    except AssertionError as err:
        chart = seen.get("chart") or {}
        raise AssertionError(f"{err}; last read: points {chart.get('points')}, labels {chart.get('cells')}, "
                             f"bands {chart.get('hover')}") from None


def save(page: Page, lab, name: str) -> dict:
    """Save through the front end and read the notebook back from disk."""
    page.page.keyboard.press("Control+s")
    path = lab.root / name
    return wait_for(lambda: (nb := json.loads(path.read_text())) and any(
        "nbmon-live-record" in json.dumps(c.get("outputs", [])) for c in nb["cells"]) and nb, 30,
        f"{name} saved with the dashboard's record")


def shut_down_kernels(lab) -> None:
    for kernel in lab.api("/api/kernels") or []:
        lab.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)


def assert_record_shows_figures(page: Page) -> None:
    record = page.page.locator(".nbmon-live-record").first
    record.wait_for(timeout=60_000)
    page.page.wait_for_timeout(3000)  # give a widget error time to appear, if one would
    text = page.page.locator("body").inner_text()
    assert "Error displaying widget" not in text and "model not found" not in text
    assert record.locator(".nbmon-summary").is_visible()
    assert re.search(r"Peak memory.*\d (MiB|GiB)", record.inner_text(), re.S)
    assert "a live chart stood here" in record.inner_text()   # saved while live: it says so
    # the timeline: the next output, a picture the browser decoded
    picture = page.page.locator(".jp-OutputArea-child:has(.nbmon-live-record) + .jp-OutputArea-child img").first
    assert picture.evaluate("img => img.complete && img.naturalWidth") == 720


def test_lab_dashboard_is_quick_one_way_and_survives_the_kernel(lab, browser):
    page = Page(browser, lab, "lab")
    try:
        page.open("/lab/tree/lab.ipynb")
        page.run_all()
        chart = wait_for_chart(page, cells=2, ended=True)   # Run All may still be in its last cell
        frames, marks = page.frames(), page.marks()
        started = execute_time(frames, r"^%resmon$")
        first_output = (marks["record"] - started) / 1000
        assert first_output <= FIRST_OUTPUT_S, f"%resmon showed its first output after {first_output:.2f} s"
        # plotly's bundle came once, unasked, never as widget state, and ahead of
        # the chart's own model: through a model opened for it and closed at once
        # (with its Layout), so that the page imports it while the chart is built
        (bundle,) = [f for f in frames if f["kind"] == "nbmon:bundle"]
        assert bundle["dir"] == "recv"
        opened = [f for f in frames if f["type"] == "comm_open" and f["dir"] == "recv" and f["t"] > started]
        carrier = {f["comm"] for f in opened if f["t"] < bundle["t"]}   # its model and its Layout
        closed = {f["comm"] for f in frames if f["type"] == "comm_close" and f["dir"] == "recv"}
        assert bundle["comm"] in carrier and len(carrier) == 2 and carrier <= closed, (bundle, carrier, closed)
        assert any("_nbmon" in (f["keys"] or ()) for f in opened if f["comm"] not in carrier), \
            "the chart's own model opened after the bundle"

        # readable: the kernel's own traces, machine bands, cells labelled, full width
        assert chart["names"][:2] == ["CPU, machine (100 = every CPU)", "CPU, process tree (100 = one core)"]
        assert "[3]" in chart["cells"] and "[4]" in chart["cells"]
        assert any("labelled" in h for h in chart["hover"]) and all(re.search(r"\d s$", h) for h in chart["hover"])
        assert chart["width"] >= chart["room"] - 2 > 600  # responsive: as wide as the output area
        # the lines are painted, each in its trace's colour (a 2 px line over hundreds of pixels,
        # once the run is long enough for CPU %, from its second sample, to span the plot)
        chart = wait_for(lambda: (c := page.chart()) and min(c["inked"].values()) > 300 and c, 30,
                         "the lines painted over hundreds of pixels")
        assert re.fullmatch(r"CPU \d.* · Memory \d.* (MiB|GiB)", chart["title"]), chart["title"]
        page.shot("dashboard-light.png")

        # one-way and cheap while idle
        idle = page.idle_for(IDLE_S)
        assert idle["browser_to_kernel"] == 0, idle
        assert idle["status"] == 0, idle
        assert idle["kernel_to_browser_bytes_per_s"] <= KIB_PER_S * 1024, idle
        later = page.chart()
        assert all(later["points"][k] > n for k, n in kernel_traces(chart).items()), "the chart stopped growing"

        # saved while running; then the kernel restarts: the chart says it is not live any more
        save(page, lab, "lab.ipynb")
        for kernel in lab.api("/api/kernels"):
            lab.api(f"/api/kernels/{kernel['id']}/restart", method="POST", timeout=60.0)
        note = page.page.locator('.nbmon-live-record [data-nbmon="disconnected"]')
        note.wait_for(timeout=60_000)
        # Either the silence came first (the view stays, dimmed) or the restart closed the
        # chart's model first (the view is gone, the record's figures show): no undimmed view.
        assert page.page.locator(".nbmon-live-record:not(.nbmon-live-stale) > .nbmon-live-view").count() == 0
        page.shot("dashboard-disconnected.png")
        # kernel gone, notebook reopened: figures, not a widget error
        shut_down_kernels(lab)
        page.page.reload()
        assert_record_shows_figures(page)
        page.shot("dashboard-reopened-lab.png")
    except BaseException:
        page.failed("dashboard-lab-failure.png")
        raise
    finally:
        page.page.close()
        shut_down_kernels(lab)


def test_dark_theme_and_a_clean_stop(lab, browser):
    page = Page(browser, lab, "stop")
    theme = lab.base / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    theme.parent.mkdir(parents=True, exist_ok=True)
    try:
        theme.write_text(json.dumps({"theme": "JupyterLab Dark"}))  # the user's setting, read at page load
        page.open("/lab/tree/stop.ipynb")
        page.page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.run_all()
        wait_for_chart(page)
        # dark: the chart's text follows the theme, the record's too
        assert sum(map(int, re.findall(r"\d+", page.chart()["font"])[:3])) > 3 * 128, page.chart()["font"]
        wait_for_chart(page, cells=1)
        page.hover(1.0)   # the hover box: light text on a dark box, not white on white
        contrasts = page.contrasts()
        assert contrasts["hover"] and min(contrasts["hover"]) >= MIN_CONTRAST, contrasts
        assert contrasts["labels"] and min(contrasts["labels"]) >= MIN_CONTRAST, contrasts
        page.shot("dashboard-dark.png")
        (lab.root / "go").touch()
        # %resmon stop ran: the chart is gone, the final record shows, and no page error
        record = page.page.locator(".nbmon-live-record").first
        wait_for(lambda: "stopped" in record.inner_text(), 90, "the final record of the stopped dashboard")
        wait_for(lambda: page.page.locator(".jp-Cell").nth(3).locator(".nbmon-summary").count() == 1, 30,
                 "the run's summary under %resmon stop")
        assert page.page.locator(".js-plotly-plot").count() == 0
        page.page.wait_for_timeout(1000)
        assert not page.errors, page.errors
        # dark: light text on the dark page
        color = page.page.evaluate("""() => getComputedStyle(
            document.querySelector('.nbmon-summary td')).color""")
        assert sum(map(int, re.findall(r"\d+", color)[:3])) > 3 * 128, color
        page.shot("dashboard-dark-stopped.png")
    except BaseException:
        page.failed("dashboard-dark-failure.png")
        raise
    finally:
        theme.unlink(missing_ok=True)
        page.page.close()
        shut_down_kernels(lab)


def test_notebook7_dashboard_survives_the_kernel(lab, browser):
    page = Page(browser, lab, "nb7")
    try:
        page.open("/notebooks/nb7.ipynb")
        page.run_all()
        wait_for_chart(page, cells=1)
        # saved once Run All's last cell has ended: its record, not its running meter (a widget)
        wait_for(lambda: page.page.locator(".jp-Cell").nth(3).locator(".nbmon-summary").count() == 1, 60,
                 "the %%resmon cell's record")
        save(page, lab, "nb7.ipynb")
        shut_down_kernels(lab)
        page.page.reload()
        assert_record_shows_figures(page)
        page.shot("dashboard-reopened-nb7.png")
    except BaseException:
        page.failed("dashboard-nb7-failure.png")
        raise
    finally:
        page.page.close()
        shut_down_kernels(lab)


def boxes_meet(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] \
        and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def test_the_window_holds_and_hover_zoom_or_resize_send_nothing(lab, browser):
    page = Page(browser, lab, "window")
    try:
        page.open("/lab/tree/window.ipynb")
        page.run_all()
        # the window holds whatever cells ran: the x axis is the last WINDOW_S seconds, the
        # bands those that reach into it (the quick cell left with its time; plotly clips the running one)
        chart = wait_for(lambda: (c := wait_for_chart(page, cells=1)) and c["last"] > 2 * WINDOW_S and c, 90,
                         "a full window")
        x0, x1 = chart["xrange"]
        assert x1 - x0 <= WINDOW_S + 0.5 and x1 >= chart["last"] - 1.0, chart["xrange"]
        assert chart["bands"] and all(a <= x1 and b >= x0 for a, b in chart["bands"]), chart
        assert chart["cells"] == ["[4]"], chart["cells"]
        # its x tick labels are painted under the plot, within the window
        assert chart["tickInk"] > 100 and 3 <= len(chart["ticks"]) <= 11, chart["ticks"]
        assert all(x0 - 0.01 <= float(t) <= x1 + 0.01 for t in chart["ticks"]), (chart["ticks"], chart["xrange"])
        # a full window scrolls: its redraws paint, and move neither plotly's x axes (the
        # costly relayout) nor run its whole pipeline (Plotly.react: one where the legend wraps);
        # they change nothing in the page (no frame of the page's to render: the band labels and
        # the title are painted too), and the canvas is painted off the page's thread (a worker's)
        page.page.evaluate("""() => {
            const view = document.querySelector('.nbmon-live-record .nbmon-live-view');
            window.__nbmonMutated = [];
            // plotly's own parts are not nbmon's (a y axis's relayout, the react counted above;
            // what it replaced is no longer in the page)
            const ours = (node) => node.isConnected && node !== view
                && (!node.closest('.svg-container') || node.closest('.gtitle'));
            new MutationObserver((records) => window.__nbmonMutated.push(...records
                .filter(r => ours(r.target.nodeType === 1 ? r.target : r.target.parentElement))
                .map(r => `${r.type} ${r.target.className?.baseVal ?? r.target.className}`)))
                .observe(view, {subtree: true, childList: true, attributes: true, characterData: true});
        }""")
        page.page.wait_for_timeout(10_000)
        later = page.chart()
        assert page.page.evaluate("window.__nbmonMutated") == [], page.page.evaluate("window.__nbmonMutated")
        with pytest.raises(Exception, match="transferred|InvalidStateError"):
            page.page.evaluate("document.querySelector('.nbmon-live-record canvas.nbmon-lines').getContext('2d')")
        assert later["redraws"] - chart["redraws"] >= 2, (chart["redraws"], later["redraws"])
        assert later["reacts"] - chart["reacts"] <= 1, (chart["reacts"], later["reacts"])
        assert later["xrange"][0] > x0 + 5 and later["ticks"] != chart["ticks"], (chart["xrange"], later["xrange"])
        if later["reacts"] == chart["reacts"]:
            assert later["plotlyX"] == chart["plotlyX"], (chart["plotlyX"], later["plotlyX"])
        # each redraw is timed again to the end of the frame that rendered it (what the wait
        # rule counts): from the same start, and no shorter (the newest one's frame may be under way)
        rendered = later["rendered"][chart["redraws"]:-1]
        assert rendered and all(ms >= 0 for ms in rendered), later["rendered"]

        # hovering: nothing to the kernel, and the hover box reads
        t0 = page.now()
        page.hover(3.0)
        assert page.sent(t0) == [], page.sent(t0)
        contrasts = page.contrasts()
        assert contrasts["hover"] and min(contrasts["hover"]) >= MIN_CONTRAST, contrasts
        assert contrasts["labels"] and min(contrasts["labels"]) >= MIN_CONTRAST, contrasts
        page.shot("dashboard-hover.png")
        # the download button: plotly draws the whole chart, its lines, x tick labels and all
        image = page.download()
        assert image["size"] == image["chart"] and image["line"] > 300 and image["ticks"] > 100, image

        # zoom into the live part: nothing sent, and the zoom stays while points arrive
        box = page.plot_area()
        t0 = page.now()
        page.page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
        page.page.mouse.down()
        page.page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2, steps=8)
        page.page.mouse.up()
        page.page.wait_for_timeout(500)
        zoomed = page.chart()["xrange"]
        # the part of the window that was shown (plotly's x axes had stayed where its last react put them)
        assert zoomed[1] - zoomed[0] < 0.5 * (x1 - x0) and zoomed[0] > later["xrange"][0], (later["xrange"], zoomed)
        page.page.wait_for_timeout(2000)
        assert page.chart()["xrange"] == zoomed
        # a double click follows the window again
        page.page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        wait_for(lambda: page.chart()["xrange"][1] > zoomed[1] + 1, 30, "the chart to follow the window again")
        # a zoom of the kernel's axis (the front end sets every range) stays too, until a double click
        middle = box["x"] + box["width"] / 2
        full_y = page.chart()["yrange"]
        page.page.mouse.move(middle, box["y"] + box["height"] * 0.3)
        page.page.mouse.down()
        page.page.mouse.move(middle, box["y"] + box["height"] * 0.7, steps=8)
        page.page.mouse.up()
        page.page.wait_for_timeout(500)
        zoomed_y = page.chart()["yrange"]
        assert zoomed_y[0] > 0 and zoomed_y[1] - zoomed_y[0] < 0.6 * (full_y[1] - full_y[0]), (full_y, zoomed_y)
        page.page.wait_for_timeout(2500)
        assert page.chart()["yrange"] == zoomed_y
        page.page.mouse.dblclick(middle, box["y"] + box["height"] / 2)
        wait_for(lambda: page.chart()["yrange"][0] == 0, 30, "the kernel's axis to follow its points again")
        assert page.sent(t0) == [], page.sent(t0)

        # half the width: nothing sent, and still legible (no title under the legend or the toolbar)
        t0 = page.now()
        page.page.set_viewport_size({"width": 760, "height": 1000})
        wait_for(lambda: (c := page.chart()) and c["width"] <= c["room"] + 2 and c["room"] < 600, 30,
                 "the chart to follow the narrower page")
        page.page.wait_for_timeout(1500)
        page.hover(1.0)   # the toolbar shows while the mouse is over the chart
        plot = page.page.locator(".nbmon-live-record .js-plotly-plot").first
        assert page.chart()["title"], "the title is painted"
        title = plot.evaluate("""(plot) => {
            const [x, y, width, height] = plot.__nbmonDrawn.title.box, at = plot.getBoundingClientRect();
            return {x: at.x + x, y: at.y + y, width, height};
        }""")
        legend = plot.locator(".infolayer .legend").first.bounding_box()
        toolbar = plot.locator(".modebar").first.bounding_box()
        assert not boxes_meet(title, legend), (title, legend)
        assert not boxes_meet(title, toolbar), (title, toolbar)
        assert page.sent(t0) == [], page.sent(t0)
        page.shot("dashboard-narrow.png")
        (lab.root / "window-go").touch()
    except BaseException:
        page.failed("dashboard-window-failure.png")
        raise
    finally:
        (lab.root / "window-go").touch()
        page.page.close()
        shut_down_kernels(lab)


@contextlib.contextmanager
def running(browser, lab, name: str):
    """A page running ``name``.ipynb to its wait for ``name``-go: on failure
    a shot and the server's log; then the go, and its kernel shut down."""
    page = Page(browser, lab, name)
    try:
        page.open(f"/lab/tree/{name}.ipynb")
        page.run_all()
        yield page
    except BaseException:
        page.failed(f"dashboard-{name}-failure.png")
        raise
    finally:
        (lab.root / f"{name}-go").touch()
        page.page.close()
        shut_down_kernels(lab)


# JS: the live record's output area with every "jp-" class gone (a front end
# that names its outputs otherwise, as VS Code does); what of it is visible.
WITHOUT_JP_CLASSES = """() => {
    const record = document.querySelector('.nbmon-live-record.nbmon-live-mounted');
    const area = record.closest('.jp-OutputArea');
    for (const el of [area, ...area.querySelectorAll('*')]) {
        for (const name of [...el.classList].filter(c => c.startsWith('jp-'))) el.classList.remove(name);
    }
    // Laid out as plain blocks, as such a front end's would be (JupyterLab's table layout went with its classes).
    for (let el = record.parentElement; el !== area.parentElement; el = el.parentElement) {
        Object.assign(el.style, {display: 'block', width: '100%'});
    }
    return new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done({
        pictures: [...area.querySelectorAll('img')].filter(i => !i.closest('.nbmon-live-view')).length,
        shown: [...area.querySelectorAll('img, .nbmon-live-static')]
            .filter(e => !e.closest('.nbmon-live-view') && e.checkVisibility()).map(e => e.outerHTML.slice(0, 80)),
        chart: record.querySelector('.nbmon-live-view').checkVisibility(),
    }))));
}"""


WARNING = """() => {
    const plot = document.querySelector('.nbmon-live-record .js-plotly-plot');
    const full = plot && plot._fullLayout;
    if (!full) return null;
    const line = (full.shapes || []).find(s => s.name === 'nbmon-warning-line');
    const note = [...plot.querySelectorAll('.annotation-text')].map(t => t.textContent).find(t => t.startsWith('memory warning'));
    const axis = line && full['yaxis' + line.yref.slice(1)];
    return line && note ? {line: [line.y0, line.yref, line.line.dash], label: line.label.text, side: axis.side, note} : null;
}"""


def use_theme(page: Page, name: str) -> None:
    """Settings > Theme > ``name``, as a user picks it while the chart runs."""
    page.page.get_by_role("menuitem", name="Settings", exact=True).click()
    page.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).click()
    page.page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{name}$")).click()


def test_under_the_chart_nothing_of_the_record_shows_whatever_the_front_ends_classes(lab, browser):
    """The static table and the timeline picture under a live chart stay
    hidden with none of JupyterLab's classes on the outputs: the chart marks
    its record's output itself (VS Code's outputs have other classes)."""
    with running(browser, lab, "classes") as page:
        wait_for_chart(page)
        page.page.locator("img").last.wait_for(state="attached", timeout=30_000)
        seen = page.page.evaluate(WITHOUT_JP_CLASSES)
        assert seen["pictures"] >= 1 and seen["chart"] and seen["shown"] == [], seen
        page.page.wait_for_timeout(3000)   # the chart redrawn at its new width
        page.shot("dashboard-no-jp-classes-light.png")
        assert not page.errors, page.errors


# JS: the charts drawn outside a record (in a widget-view output of their own),
# with data, their painted lines laid over the plot (not after it).
OWN_CHARTS = """() => [...document.querySelectorAll('.js-plotly-plot')]
    .filter(p => !p.closest('.nbmon-live-record') && p.__nbmonDrawn?.traces
                 .filter(t => /^proc_/.test(t.meta)).every(t => t.x.length > 3))
    .filter(p => {
        const lines = p.querySelector(':scope > .nbmon-lines');
        return lines && getComputedStyle(lines).position === 'absolute';
    }).length"""


def test_the_chart_in_an_output_of_its_own_draws_and_leaves_no_widget_view_when_it_stops(lab, browser):
    """The chart as its own widget-view output (what Colab gets): drawn from
    the same model; once stopped the output is empty, and the saved
    notebook holds no widget view (no "model not found" when reopened)."""
    with running(browser, lab, "own") as page:
        wait_for_chart(page)
        wait_for(lambda: page.page.evaluate(OWN_CHARTS) == 1, 60, "the chart in its own output, with data")
        page.page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
            .find(p => !p.closest('.nbmon-live-record')).scrollIntoView()""")
        page.page.wait_for_timeout(2500)   # painted once in view
        page.shot("dashboard-own-output-light.png")
        (lab.root / "own-go").touch()
        record = page.page.locator(".nbmon-live-record").first
        wait_for(lambda: "stopped" in record.inner_text(), 90, "the final record")
        wait_for(lambda: page.page.evaluate(OWN_CHARTS) == 0, 30, "the chart's own output emptied")
        saved = save(page, lab, "own.ipynb")
        assert "application/vnd.jupyter.widget-view+json" not in json.dumps(saved["cells"]), saved["cells"]
        assert "model not found" not in page.page.locator("body").inner_text()
        assert not page.errors, page.errors


def test_the_memory_warning_shows_on_the_chart_in_light_and_dark(lab, browser):
    page = Page(browser, lab, "warning")
    try:
        page.open("/lab/tree/warning.ipynb")
        page.run_all()
        wait_for_chart(page)
        shown = wait_for(lambda: page.page.evaluate(WARNING), 60, "the memory warning on the chart")
        assert shown["line"][2] == "dot" and shown["line"][0] > 0, shown
        assert re.match(r"memory warning: the (machine's memory is over 0.5 % used|container is over 0.5 % of its)",
                        shown["note"]), shown
        # The line says whose memory, of what limit, and stands on that memory's axis
        # (the machine's on the right; the container's beside its limit on the kernel's, left).
        machine = shown["note"].startswith("memory warning: the machine's")
        assert re.fullmatch(r"(machine memory|container limit) 0\.5 %: [\d.]+ [KMG]iB", shown["label"]), shown
        assert shown["label"].startswith("machine memory" if machine else "container limit"), shown
        assert shown["side"] == ("right" if machine else "left"), shown
        page.shot("dashboard-warning-light.png")
        use_theme(page, "JupyterLab Dark")
        page.page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.page.wait_for_timeout(1500)   # the theme watcher redraws at the next frame
        assert page.page.evaluate(WARNING), "the warning left the chart with the theme"
        assert sum(map(int, re.findall(r"\d+", page.chart()["font"])[:3])) > 3 * 128, page.chart()["font"]
        page.shot("dashboard-warning-dark.png")
        (lab.root / "warning-go").touch()
        record = page.page.locator(".nbmon-live-record").first
        wait_for(lambda: "stopped" in record.inner_text(), 90, "the final record of the stopped dashboard")
        assert not page.errors, page.errors
    except BaseException:
        page.failed("dashboard-warning-failure.png")
        raise
    finally:
        use_theme(page, "JupyterLab Light")   # the setting outlives the page
        page.page.close()
        shut_down_kernels(lab)
