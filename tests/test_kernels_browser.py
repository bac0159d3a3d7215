"""``%resmon kernels`` in JupyterLab, in headless Chromium (issue 44): the
live table mounts into its record, marks this notebook, follows the theme,
and its Shut down button (two clicks) ends another notebook's kernel
through the Jupyter server that runs it, which then does not restart it.
Screenshots go to tests/artifacts/kernels-*.png."""
from __future__ import annotations

import json
import re
import urllib.request

from browser_util import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_page, lab_serving, need_chromium, \
    run_all_cells, wait_for

NOTEBOOK = "kernels.ipynb"
OTHER = "other.ipynb"


def start_session(lab, path: str) -> dict:
    """A notebook's kernel as JupyterLab starts one: a session of the server (JPY_SESSION_NAME set)."""
    body = json.dumps({"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}).encode()
    request = urllib.request.Request(f"{lab.url}/api/sessions?token={lab.token}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def kernel_ids(lab) -> set[str]:
    return {k["id"] for k in lab.api("/api/kernels")}


def text_brightness(page, selector: str) -> int:
    color = page.evaluate(f"getComputedStyle(document.querySelector({selector!r})).color")
    return sum(map(int, re.findall(r"\d+", color)[:3]))


def test_the_kernels_table_in_jupyterlab_light_and_dark_and_a_shutdown_through_the_server(tmp_path):
    need_chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_serving(tmp_path, NOTEBOOK, ["%load_ext nbmon", "%resmon kernels"]) as lab, \
            chromium_page(CHROMIUM, CHROMIUM_ARGS, lab, ARTIFACTS / "kernels-failure.png") as page:
        other = start_session(lab, OTHER)["kernel"]["id"]
        run_all_cells(page, lab, NOTEBOOK)
        live = page.locator(".nbmon-kernels-record.nbmon-kernels-mounted .nbmon-kernels")
        row = live.locator("tbody tr", has_text=OTHER)
        wait_for(lambda: live.locator("tbody tr", has_text=NOTEBOOK).count() == 1 and row.count() == 1, 60,
                 "both notebooks' kernels in the live table")
        assert not page.locator(".nbmon-kernels-static").first.is_visible()   # the record's copy hides under it
        this = live.locator("tr.nbmon-this")
        assert this.count() == 1 and NOTEBOOK in this.inner_text() and "this notebook" in this.inner_text()
        assert this.get_by_role("button", name="Shut down").count() == 0   # its own kernel: Jupyter's buttons
        assert re.search(r"\d+(\.\d+)? MiB", row.inner_text()), row.inner_text()
        memory = live.locator("thead th").all_inner_texts().index("MEMORY")
        assert row.locator("td").nth(memory).locator(".nbmon-share").count() == 1   # its share of the limit, a bar
        assert text_brightness(page, ".nbmon-kernels td") < 3 * 128   # dark text on the light page
        page.wait_for_timeout(500)
        live.screenshot(path=str(ARTIFACTS / "kernels-light.png"))

        page.get_by_role("menuitem", name="Settings", exact=True).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^JupyterLab Dark$")).click()
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        page.wait_for_timeout(500)
        assert text_brightness(page, ".nbmon-kernels td") > 3 * 128   # light text on the dark page
        live.screenshot(path=str(ARTIFACTS / "kernels-dark.png"))

        # One click asks, the second shuts it down, through the server: it does not come back.
        row.get_by_role("button", name="Shut down").click()
        confirm = live.locator("tbody tr", has_text=OTHER).get_by_role("button", name="Confirm shut down")
        confirm.wait_for(timeout=5_000)
        assert other in kernel_ids(lab)
        confirm.click()
        wait_for(lambda: other not in kernel_ids(lab), 30, "the server to have shut the other kernel down")
        wait_for(lambda: "asked its Jupyter server to shut down" in live.locator(".nbmon-said").inner_text(), 10,
                 "the table's line saying what was done")
        wait_for(lambda: row.count() == 0, 30, "a table without the other kernel")
        page.wait_for_timeout(3000)
        assert len(kernel_ids(lab)) == 1 and other not in kernel_ids(lab)   # not restarted by its server
        live.screenshot(path=str(ARTIFACTS / "kernels-dark-after-shutdown.png"))

        # Saved, and opened again with no kernel that knows the table: its record shows it, no widget error.
        page.get_by_role("menuitem", name="File", exact=True).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Save Notebook$")).click()
        wait_for(lambda: "nbmon-kernels-record" in (lab.root / NOTEBOOK).read_text(), 30, "the saved notebook")
        for kernel in lab.api("/api/kernels"):
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?reset&token={lab.token}", timeout=120_000)
        record = page.locator(".nbmon-kernels-record .nbmon-kernels-static")
        record.wait_for(timeout=60_000)
        page.wait_for_timeout(3000)   # a widget error, were there one, shows by now
        assert record.is_visible() and NOTEBOOK in record.inner_text()
        assert "Error displaying widget" not in page.locator("body").inner_text()
        record.screenshot(path=str(ARTIFACTS / "kernels-saved.png"))
