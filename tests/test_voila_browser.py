"""The live dashboard in a real Voila page, driven by headless Chromium:
plotly's bundle comes as soon as the page's widget model exists (Voila's
page connects to the kernel after the notebook ran, so it misses the
kernel's push), and a record whose chart cannot mount keeps its figures
current through the widget's model (Voila applies no update_display_data
once the page has rendered)."""

from __future__ import annotations


import pytest

from browser_util import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_page, need_chromium, voila_serving, wait_for
from dashboard_page import INIT_SCRIPT

SHOTS = ARTIFACTS
ASK_WITHIN_MS = 1000    # the model's creation to its ask for the bundle: the fallback waits 3,000
CELLS = ["%load_ext nbmon", "%resmon", "import time\nblock = bytearray(64 << 20)\ntime.sleep(3)"]
RECORD_WAIT_MS = 45_000   # the kernel re-sends its record every 30 s (live.RECORD_EVERY_S) while no cell runs
# A page where plotly's bundle never loads (so no chart mounts): every version's entry is done and pending.
NO_BUNDLE = """(() => {
  const never = { done: true, asked: true, promise: new Promise(() => {}) };
  globalThis.__nbmonPlotlyBundles = new (class extends Map { has() { return true; } get() { return never; } })();
})();"""
HEADLINE = ".nbmon-live-record[data-nbmon-live] .nbmon-live-headline"


@pytest.fixture(scope="module", params=["light", "dark"])
def voila(request, tmp_path_factory):
    need_chromium()
    with voila_serving(tmp_path_factory.mktemp("voila"), "monitor.ipynb", CELLS, request.param) as server:
        yield server


def open_page(page, voila, init: str = "") -> None:
    page.add_init_script(INIT_SCRIPT + init)
    page.goto(f"{voila.url}/?token={voila.token}", timeout=180_000)


def model_made_at(frames) -> float:
    """Page time of the dashboard's state reaching the page (Voila's page asks each model's state)."""
    return min(f["t"] for f in frames if f["dir"] == "recv" and "_nbmon" in (f.get("keys") or []))


def test_the_bundle_comes_at_once_and_the_chart_draws(voila, tmp_path):
    with chromium_page(CHROMIUM, CHROMIUM_ARGS, voila, tmp_path / "failure.png") as page:
        open_page(page, voila)
        wait_for(lambda: page.evaluate("window.__nbmonMarks.chart"), 60, "the chart with data")
        frames, marks = page.evaluate("window.__nbmonFrames"), page.evaluate("window.__nbmonMarks")
        made = model_made_at(frames)
        asks = [f["t"] - made for f in frames if f["dir"] == "send" and f["kind"] == "nbmon:bundle"]
        print(f"voila {voila.theme}: model made at {made:.0f} ms; bundle asked after {asks} ms; "
              f"chart with data after {marks['chart'] - made:.0f} ms")
        # One ask, at once: not the fallback's, ASK_AFTER_MS (3 s) after.
        assert len(asks) == 1 and 0 <= asks[0] < ASK_WITHIN_MS, asks
        page.wait_for_timeout(1500)   # a few frames drawn
        page.screenshot(path=str(SHOTS / f"voila-{voila.theme}.png"), full_page=True)


def test_a_record_whose_chart_cannot_mount_keeps_its_figures_current(voila, tmp_path):
    with chromium_page(CHROMIUM, CHROMIUM_ARGS, voila, tmp_path / "failure.png") as page:
        open_page(page, voila, NO_BUNDLE)
        wait_for(lambda: page.evaluate("window.__nbmonFrames.some(f => (f.keys || []).includes('_nbmon'))"), 60,
                 "the dashboard's model")
        first = page.locator(HEADLINE).inner_text()
        # The headline's figures and its "as of" time: a new record written into the page.
        page.wait_for_function("([sel, first]) => document.querySelector(sel).innerText !== first",
                               arg=[HEADLINE, first], timeout=RECORD_WAIT_MS)
        assert page.locator(".nbmon-live-view").count() == 0   # no chart: plotly never loaded
        # The timeline picture too (shown blank at first: the record came before its third sample).
        widths = page.evaluate("[...document.images].map((img) => img.naturalWidth)")
        assert max(widths) > 100, widths
        print(f"voila {voila.theme}: record {first!r} -> {page.locator(HEADLINE).inner_text()!r}")
        page.screenshot(path=str(SHOTS / f"voila-record-{voila.theme}.png"), full_page=True)
