"""Why did my kernel die, in JupyterLab and headless Chromium: a JupyterLab
whose kernels run in a real memory cgroup (as in a container); a cell grows
towards the limit, the warning shows in its output and on its meter, the
OOM killer kills the kernel ("Kernel Restarting"), and re-running
``%load_ext nbmon`` shows the post-mortem, in the light and the dark theme.
Screenshots go to tests/artifacts/postmortem-*.png."""
from __future__ import annotations

import json
import os
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from browser_util import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, JupyterLab, chromium_page, wait_for
from cgroups import MemoryCgroup
from test_postmortem import without_swap

LIMIT_MB = 900
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
NOTEBOOK = "train.ipynb"
# Grows to 93 % of the container's limit (read from the cgroup itself), waits
# there until the test has seen the warning, then grows until the kernel dies.
FILL = """%%resmon --label fill --memory-guard off
import pathlib, time
group = pathlib.Path({group!r})
def percent():
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    used = int((group / {usage!r}).read_text()) - int(stat[{inactive!r}])
    return 100 * used / {limit}
chunks = []
while not pathlib.Path("go").exists():
    if percent() < 93:
        chunks.append(b"x" * (4 << 20))
    time.sleep(0.05)
while True:
    chunks.append(b"x" * (4 << 20))
    time.sleep(0.02)"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium is not installed at {CHROMIUM}: the browser tests need a real browser")
    group = MemoryCgroup(limit_mb=LIMIT_MB)
    without_swap(group)
    base = tmp_path_factory.mktemp("postmortem-lab")
    runtime = base / "xdg"
    runtime.mkdir(mode=0o700)
    root = base / "root"
    root.mkdir()
    fill = FILL.format(group=group.path, limit=LIMIT_MB << 20,
                       usage="memory.usage_in_bytes" if group.version == 1 else "memory.current",
                       inactive="total_inactive_file" if group.version == 1 else "inactive_file")
    nb = new_notebook(metadata={"kernelspec": KERNELSPEC},
                      cells=[new_code_cell("%load_ext nbmon"), new_code_cell(fill)])
    nbformat.write(nb, root / NOTEBOOK)
    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)   # the server's kernels inherit it: their boxes go there
    server = JupyterLab(base, root)
    try:
        server.start()
        # The server's kernels, started from now on, are the container's processes.
        group.add(server.proc.pid)
        server.group = group
        yield server
    finally:
        server.stop()
        if saved is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved
        group.close()   # the server has left the group (it exited)


def brightness(color: str) -> int:
    return sum(map(int, re.findall(r"\d+", color)[:3]))


def test_warning_then_postmortem_in_jupyterlab(lab):
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium_page(CHROMIUM, CHROMIUM_ARGS, lab, ARTIFACTS / "postmortem-failure.png") as page:
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?reset&token={lab.token}", timeout=120_000)
        status = page.locator("#jp-main-statusbar")
        status.get_by_text(re.compile(r"\(ipykernel\) \| Idle")).wait_for(timeout=120_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        fill = page.locator(".jp-Cell").nth(1)
        # Before the kill: the line in the running cell's output, and the meter's mark.
        fill.get_by_text(re.compile(r"nbmon: this kernel's container is at \d")).wait_for(timeout=120_000)
        fill.locator('.nbmon-meter[data-alert="container"]').wait_for(timeout=30_000)
        assert re.fullmatch(r"\u26a0 9\d\.\d % of limit", fill.locator('[data-nbmon="alert"]').inner_text())
        page.wait_for_timeout(500)
        fill.screenshot(path=str(ARTIFACTS / "postmortem-warning.png"))
        kills = lab.group.oom_kills()
        (lab.root / "go").touch()
        # The OOM killer takes the kernel; JupyterLab says so and restarts it.
        dialog = page.locator(".jp-Dialog")
        dialog.get_by_text(re.compile("appears to have died")).wait_for(timeout=120_000)
        assert lab.group.oom_kills() > kills   # the truth, from the cgroup itself
        page.screenshot(path=str(ARTIFACTS / "postmortem-kernel-died.png"))
        dialog.get_by_role("button", name=re.compile("Ok", re.I)).click()
        status.get_by_text(re.compile(r"\(ipykernel\) \| Idle")).wait_for(timeout=120_000)
        # Re-running %load_ext nbmon in the new kernel shows the post-mortem.
        first = page.locator(".jp-Cell").nth(0)
        first.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        record = first.locator(".nbmon-summary")
        record.wait_for(timeout=120_000)
        text = record.inner_text()
        assert f"a kernel of {NOTEBOOK} died" in text
        assert re.search(rf"killed by the container's OOM killer at \d+ MiB of its {LIMIT_MB} MiB memory limit",
                         text), text
        assert re.search(r"\[\d+\] %%resmon --label fill", text), text
        page.wait_for_timeout(500)
        first.screenshot(path=str(ARTIFACTS / "postmortem-light.png"))
        # Saved, the notebook keeps the record; reopened in the dark theme, it shows from the file.
        page.keyboard.press("Control+s")
        wait_for(lambda: " died" in json.dumps(json.loads((lab.root / NOTEBOOK).read_text())["cells"][0]["outputs"]),
                 30, "the notebook saved with the post-mortem")
        theme = lab.base / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
        theme.parent.mkdir(parents=True, exist_ok=True)
        theme.write_text(json.dumps({"theme": "JupyterLab Dark"}))
        page.reload(timeout=120_000)
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=60_000)
        record = page.locator(".jp-Cell").nth(0).locator(".nbmon-summary")
        record.wait_for(timeout=60_000)
        assert "killed by the container's OOM killer" in record.inner_text()
        page.wait_for_timeout(800)
        # Dark: light text on the dark page.
        color = page.evaluate("() => getComputedStyle(document.querySelector('.nbmon-summary td')).color")
        assert brightness(color) > 3 * 128, color
        page.locator(".jp-Cell").nth(0).screenshot(path=str(ARTIFACTS / "postmortem-dark.png"))
        assert not errors, errors
