"""Helpers for the notebook and browser tests: reading nbmon's rendered
summaries back into numbers, bounded polling, and a JupyterLab server run
as a subprocess."""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

_ROW = re.compile(r"<tr[^>]*>\s*<t[hd][^>]*>(.*?)</t[hd]>\s*<td[^>]*>(.*?)</td>\s*</tr>", re.S)
_UNITS_MIB = {"MiB": 1.0, "GiB": 1024.0, "TiB": 1024.0 * 1024.0}


def summary_rows(fragment: str) -> dict[str, str]:
    """{row title: value text} of the first ``nbmon-summary`` table in an HTML fragment."""
    start = fragment.index('class="nbmon-summary"')
    end = fragment.find("</table>", start)
    return {html.unescape(k).strip(): html.unescape(v).strip()
            for k, v in _ROW.findall(fragment[start:end])}


def row(rows: dict[str, str], prefix: str) -> str:
    """The value of the row whose title starts with ``prefix`` ("Peak RSS" matches
    "Peak RSS (exact)")."""
    found = [v for k, v in rows.items() if k.startswith(prefix)]
    assert found, f"no row starting with {prefix!r} in {rows}"
    return found[0]


def mib(text: str) -> float:
    """'428 MiB' -> 428.0, '1.5 GiB' -> 1536.0 (a leading + or - is kept)."""
    m = re.fullmatch(r"([+-]?\d+(?:\.\d+)?) (MiB|GiB|TiB)", text.strip())
    assert m, f"not an amount of memory: {text!r}"
    return float(m.group(1)) * _UNITS_MIB[m.group(2)]


def seconds(text: str) -> float:
    """'0.25 s', '12.3 s', '1:15' (m:ss), '1:02:05' (h:mm:ss) -> seconds
    (nbmon.format's durations)."""
    text = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?) s", text)
    if m:
        return float(m.group(1))
    m = re.fullmatch(r"(?:(\d+):)?(\d+):(\d\d)", text)
    if m:
        hours, minutes, secs = (int(g or 0) for g in m.groups())
        return hours * 3600.0 + minutes * 60.0 + secs
    raise AssertionError(f"not a duration: {text!r}")


def percent(text: str) -> float:
    """'97.8 %' -> 97.8; for 'mean / peak' pairs, the first."""
    m = re.match(r"\s*(\d+(?:\.\d+)?) %", text)
    assert m, f"not a percentage: {text!r}"
    return float(m.group(1))


def legend(rows: dict[str, str]) -> dict[str, str]:
    """{row name: top of its strip} from a record's timeline legend row
    ('top: CPU to 200 % · bottom: memory to 1.2 GiB · over 3.00 s')."""
    return dict(re.findall(r"(?:top|middle|bottom|2nd|3rd|strip): (.+?) to (.+?)(?= · )", row(rows, "Timeline")))


def png_pixels(data: bytes):
    """RGBA pixels (numpy, rows x columns x 4) of an 8-bit palette PNG with
    unfiltered rows, every chunk's CRC checked: enough to read nbmon's
    timeline independently of the code that wrote it."""
    import struct
    import zlib

    import numpy as np

    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, at = {}, 8
    while at < len(data):
        (length,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0] == zlib.crc32(kind + body), kind
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + length
    w, h, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 3), "an 8-bit palette PNG"
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8).reshape(h, w + 1)
    assert not rows[:, 0].any(), "unfiltered rows"
    palette = np.frombuffer(chunks[b"PLTE"], dtype=np.uint8).reshape(-1, 3)
    alpha = np.full(len(palette), 255, dtype=np.uint8)
    alpha[:len(chunks.get(b"tRNS", b""))] = np.frombuffer(chunks.get(b"tRNS", b""), dtype=np.uint8)
    return np.concatenate([palette, alpha[:, None]], axis=1)[rows[:, 1:]]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Bounded poll: the predicate's first truthy value; AssertionError naming
    ``what`` (and the last exception, if any) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - reported if the wait fails
            last_error = err
        if time.monotonic() > deadline:
            detail = f" (last error: {type(last_error).__name__}: {last_error})" if last_error else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)


def _notebook_root(base: Path, notebook: str, cells: list[str]) -> Path:
    """``base/root``, made, holding ``notebook``: one code cell per source in ``cells``, a python3 kernel."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    root = Path(base) / "root"
    root.mkdir()
    nb = new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        cells=[new_code_cell(source) for source in cells])
    nbformat.write(nb, root / notebook)
    return root


@contextmanager
def _serving(server: "JupyterLab"):
    try:
        server.start()
        yield server
    finally:
        server.stop()


def lab_serving(base: Path, notebook: str, cells: list[str]):
    """A started JupyterLab (stopped after) whose root, ``base/root``, holds
    ``notebook``: one code cell per source in ``cells``, a python3 kernel."""
    return _serving(JupyterLab(base, _notebook_root(base, notebook, cells)))


def voila_serving(base: Path, notebook: str, cells: list[str], theme: str = "light"):
    """A started Voila (stopped after) serving ``notebook`` (one code cell per
    source in ``cells``) from ``base/root``, in ``theme``."""
    return _serving(Voila(base, _notebook_root(base, notebook, cells), notebook, theme))


@contextmanager
def chromium_page(executable: str, args, lab: "JupyterLab", failure_png):
    """A page (1400 x 1100) of a headless Chromium. Should the body fail: a
    screenshot at ``failure_png``, the page's errors and ``lab``'s log printed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=args)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        try:
            yield page
        except BaseException:
            page.screenshot(path=str(failure_png))
            print("page errors:", errors, "\n--- server log ---\n", lab.log_text())
            raise
        finally:
            browser.close()


def run_all_cells(page, lab: "JupyterLab", notebook: str, before: str | None = None) -> None:
    """Open ``notebook`` of ``lab`` in ``page``, wait for its kernel to be idle,
    evaluate ``before`` (JavaScript: a recorder, say), then Run All Cells."""
    page.goto(f"{lab.url}/lab/tree/{notebook}?token={lab.token}", timeout=120_000)
    page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\(ipykernel\) \| Idle")).wait_for(timeout=120_000)
    if before is not None:
        page.evaluate(before)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


CHROMIUM = os.environ.get("NBMON_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"   # screenshots, not committed


def need_chromium() -> None:
    """Fail (never skip) where there is no Chromium: the browser tests need a real browser."""
    import pytest

    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (set NBMON_CHROMIUM to another path, or install "
                    "the distribution's chromium package): the browser tests need a real browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# JupyterLab 4.6 options (from `jupyter lab --help-all`) that keep a sandboxed
# server from reaching the network: no news feed, no update check, no PyPI.
LAB_QUIET_FLAGS = [
    "--no-browser",
    "--LabApp.news_url=None",
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.extension_manager=readonly",  # the "pypi" one would query PyPI
]
# ... and the front end's side of it: never ask about news (no toast over the page).
NOTIFICATION_SETTINGS = ("@jupyterlab/apputils-extension", "notification.jupyterlab-settings",
                         {"fetchNews": "false", "checkForUpdates": False})


def _die_with_parent() -> None:
    """In the server's child before exec: SIGTERM when the test process dies,
    so a killed test run leaves no server (and no kernels) behind."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class JupyterLab:
    """A real ``jupyter lab`` server in a subprocess, with its own config,
    runtime and (when safe) data directories under ``base``."""

    status_path = "/api/status"   # answered once it serves

    def __init__(self, base: Path, root: Path):
        self.base, self.root = Path(base), Path(root)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("config", "runtime", "data"):
            (self.base / name).mkdir(parents=True, exist_ok=True)
        env["JUPYTER_CONFIG_DIR"] = str(self.base / "config")
        env["JUPYTER_RUNTIME_DIR"] = str(self.base / "runtime")
        # Lab extensions are looked up in the data dir *and* in sys.prefix's
        # share/jupyter; check_lab_extensions verifies they are still found.
        env["JUPYTER_DATA_DIR"] = str(self.base / "data")
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        env.pop("JUPYTER_PATH", None)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "jupyter", "lab",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}",
               f"--LabApp.user_settings_dir={self.base / 'settings'}",
               f"--LabApp.workspaces_dir={self.base / 'workspaces'}",
               *LAB_QUIET_FLAGS]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        return cmd

    def api(self, path: str, method: str = "GET", timeout: float = 5.0):
        sep = "&" if "?" in path else "?"
        req = urllib.request.Request(f"{self.url}{path}{sep}token={self.token}", method=method,
                                     data=b"" if method in ("POST", "DELETE") else None)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
            return json.loads(body) if body else None

    def start(self, timeout: float = 120.0) -> "JupyterLab":
        plugin, name, settings = NOTIFICATION_SETTINGS
        (self.base / "settings" / plugin).mkdir(parents=True, exist_ok=True)
        (self.base / "settings" / plugin / name).write_text(json.dumps(settings))
        (self.base / "workspaces").mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), cwd=self.root, env=self.env(),
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent)

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(f"{self.url}{self.status_path}?token={self.token}", timeout=2.0):
                    return True
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                return None

        try:
            wait_for(up, timeout, f"the server to answer {self.status_path}")
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- server log ---\n{self.log_text()}") from None
        return self

    def shut_down(self) -> None:
        try:
            self.api("/api/shutdown", method="POST")
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass

    def log_text(self, tail: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """POST /api/shutdown, then wait (bounded) for the process; SIGKILL its
        process group if it is still there."""
        if self.proc is None:
            return
        # Kernels first (the server would too), each bounded, so none outlives a stuck server.
        try:
            for kernel in self.api("/api/kernels") or []:
                self.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        try:
            if self.proc.poll() is None:
                self.shut_down()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
        finally:
            self.log.close()


class Voila(JupyterLab):
    """A real ``voila`` server rendering one notebook (its page at ``url``),
    with the same directories, start and stop as :class:`JupyterLab`."""

    def __init__(self, base: Path, root: Path, notebook: str, theme: str = "light"):
        super().__init__(base, root)
        self.notebook, self.theme = notebook, theme
        self.log_path = self.base / "voila.log"

    status_path = "/voila/static/voila.js"

    def shut_down(self) -> None:
        self.proc.terminate()   # Voila has no shutdown endpoint; on SIGTERM it shuts its kernels down

    def command(self) -> list[str]:
        return [sys.executable, "-m", "voila", "--no-browser", f"--port={self.port}", "--Voila.ip=127.0.0.1",
                "--Voila.port_retries=0", f"--token={self.token}", f"--theme={self.theme}",
                str(self.root / self.notebook)]
