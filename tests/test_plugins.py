"""A third party extends nbmon without editing it (issue 31): a small plugin
distribution -- a sink that pushes samples to a URL, a GPU vendor over a
stand-in library, a metric with its own reader -- installed with pip into a
temporary environment, and found by every front end: ``nbmon run``,
``%resmon`` in a real IPython, ``nbmon.monitor()`` and scaffold's
``SystemMonitor``. A plugin that cannot load costs one line, nothing more."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import venv_over_this_environment

PLUGIN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "nbmon-example-plugin"
        version = "0.1"

        [project.entry-points."nbmon.sinks"]
        http_push = "nbmon_example.sink:SINK"

        [project.entry-points."nbmon.gpus"]
        fakesmi = "nbmon_example.vendor"

        [project.entry-points."nbmon.metrics"]
        open_fds = "nbmon_example.fds"

        [tool.setuptools]
        packages = ["nbmon_example", "fakesmi"]
    """,
    # The stand-in vendor library: devices and figures from a JSON file.
    "fakesmi/__init__.py": """
        import json, os

        def devices():
            with open(os.environ["FAKESMI_STATE"]) as f:
                return json.load(f)
    """,
    "nbmon_example/__init__.py": "",
    "nbmon_example/sink.py": """
        import json
        import urllib.parse
        import urllib.request

        from nbmon.sinks.senders import Sink


        class Push:
            def __init__(self, url, overwrite=False):
                self.url = url

            def publish(self, event, **kwargs):
                self.publish_many([event])

            def publish_many(self, events):
                body = "".join(json.dumps(e) + "\\n" for e in events).encode()
                urllib.request.urlopen(urllib.request.Request(self.url, data=body), timeout=5).close()

            def close(self):
                pass


        def check(url, overwrite, hint):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"--http-push needs an http(s) URL, got {url!r}")


        SINK = Sink("http_push", "push every sample to this URL (JSON lines, POST)", open=Push,
                    target="URL", check=check)
    """,
    "nbmon_example/vendor.py": """
        NAME = "FakeSMI"
        VISIBLE = "FAKESMI_VISIBLE_DEVICES"
        IMPORTS = ("fakesmi",)
        NAN = float("nan")


        class Device:
            lost = False

            def __init__(self, index):
                self.index = index

            def read(self, pids):
                import fakesmi
                d = fakesmi.devices()[self.index]
                return {"util_percent": d["util"], "mem_util_percent": d["mem_util"], "mem_used_mb": d["mem_mb"],
                        "mem_total_mb": d["total_mb"], "temp_c": d["temp"]}

            def drain_errors(self):
                return []


        def discover():
            try:
                import fakesmi
                return len(fakesmi.devices()), ""
            except (ImportError, OSError, KeyError) as err:
                return 0, f"FakeSMI: {err}"


        def uuid(index):
            return f"FAKE-{index}"


        def device(index):
            return Device(index)


        def status():
            return "ok"
    """,
    "nbmon_example/fds.py": """
        import os

        from nbmon.catalog import GAUGE, PEAK, Metric, Shown

        METRICS = (Metric("proc_open_fds", "", "open file descriptors, watched process", GAUGE, PEAK,
                          "fds", record=(Shown("Open fds, most", 85),), wandb=("proc.fds", PEAK)),)


        class OpenFds:
            name = "fds"
            fields = ("proc_open_fds",)

            def __init__(self, pid):
                self.pid = pid

            def start(self, now):
                pass

            def sample(self, now):
                return {"proc_open_fds": float(len(os.listdir(f"/proc/{self.pid}/fd")))}

            def close(self):
                pass


        def source(pid, options):
            return OpenFds(pid)
    """,
}

FDS_HELD = 40   # what the watched command opens: the metric's ground truth is above it


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A virtual environment over this one's packages (nbmon among them)
    with the plugin installed by pip, and its python."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    for name, text in PLUGIN.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(textwrap.dedent(text).lstrip())
    venv = root / "venv"
    python = venv_over_this_environment(venv, pip=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    str(source)], check=True, timeout=300, capture_output=True)
    state = root / "fakesmi.json"
    state.write_text(json.dumps([{"util": 37.0, "mem_util": 12.0, "mem_mb": 1234.0, "total_mb": 8192.0, "temp": 55.0}]))
    environ = {**os.environ, "FAKESMI_STATE": str(state)}
    environ.pop("PYTHONPATH", None)   # the venv alone decides what is found
    return python, environ


class Collector:
    """A real HTTP endpoint the plugin's sink pushes to."""

    def __init__(self):
        self.events: list[dict] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.events += [json.loads(line) for line in body.decode().splitlines()]
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/push"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def most(events, key):
    """The largest known value of ``key`` (NaN and null are unknown)."""
    return max((e[key] for e in events if e.get(key) is not None and e[key] == e[key]), default=0)


HOLD_FDS = f"import os, time; fds = [os.open(os.devnull, os.O_RDONLY) for _ in range({FDS_HELD})]; time.sleep(1.5)"


def test_nbmon_run_offers_and_feeds_all_three(env, collector, tmp_path):
    python, environ = env
    helped = subprocess.run([python, "-m", "nbmon.cli", "run", "--help"], env=environ, capture_output=True,
                            text=True, timeout=60)
    assert "--http-push URL" in helped.stdout
    out = tmp_path / "run.csv"
    done = subprocess.run([python, "-m", "nbmon.cli", "run", "--interval", "0.2", "--http-push", collector.url,
                           "--csv", str(out), "--", python, "-c", HOLD_FDS],
                          env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert collector.events, done.stderr
    assert most(collector.events, "proc_open_fds") >= FDS_HELD, collector.events[-3:]
    assert most(collector.events, "gpu0_util_percent") == 37.0
    rows = list(csv.DictReader(open(out)))
    assert float(rows[-1]["gpu0_mem_used_mb"]) == 1234.0
    assert max(float(r["proc_open_fds"] or 0) for r in rows) >= FDS_HELD
    assert "Open fds, most" in done.stderr and "GPU util mean" in done.stderr


def test_a_target_the_sink_refuses_is_one_sentence(env, tmp_path):
    python, environ = env
    done = subprocess.run([python, "-m", "nbmon.cli", "run", "--http-push", "ftp://example", "--csv",
                           str(tmp_path / "never.csv"), "--", "true"],
                          env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "needs an http(s) URL, got 'ftp://example'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "never.csv").exists()


def test_resmon_in_ipython_streams_to_the_plugin(env, collector):
    """%resmon runs its monitor in nbmon's helper process: the plugin is found there too."""
    python, environ = env
    code = (f"ip = get_ipython(); ip.run_line_magic('load_ext', 'nbmon'); "
            f"ip.run_line_magic('resmon', 'start --interval 0.2 --http-push {collector.url}'); "
            f"import time; fds = [open('/dev/null') for _ in range({FDS_HELD})]; time.sleep(1.5); "
            f"ip.run_line_magic('resmon', 'stop')")
    done = subprocess.run([python, "-m", "IPython", "--no-banner", "--quick", "-c", code], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert collector.events, done.stdout + done.stderr
    assert most(collector.events, "proc_open_fds") >= FDS_HELD
    assert most(collector.events, "gpu0_util_percent") == 37.0


def test_nbmon_monitor_and_system_monitor_take_the_plugin(env, collector):
    python, environ = env
    code = textwrap.dedent(f"""
        import os, time, nbmon
        m = nbmon.monitor(interval=0.2, http_push={collector.url!r})
        time.sleep(1.0)
        m.stop()
        sent = nbmon.open_sink("http_push", {collector.url!r})
        s = nbmon.SystemMonitor(os.getpid(), sent, sample_rate_seconds=0.2)
        s.start(); time.sleep(0.7); s.shutdown()
    """)
    done = subprocess.run([python, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    samples = [e for e in collector.events if "proc_open_fds" in e]
    published = [e for e in collector.events if "cpu" in e and "proc_open_fds" not in e]
    assert samples and most(samples, "proc_open_fds") > 0
    assert published and published[-1]["gpu.0.temp"] == 55   # scaffold's keys, the fake vendor's device
    assert list(published[-1])[-1] == "proc.fds" and published[-1]["proc.fds"] > 0   # the plugin's, after them


def test_a_broken_plugin_costs_one_line(env, tmp_path):
    python, environ = env
    broken = tmp_path / "broken"
    (broken / "nbmon_broken-0.1.dist-info").mkdir(parents=True)
    (broken / "nbmon_broken-0.1.dist-info" / "METADATA").write_text("Name: nbmon-broken\nVersion: 0.1\n")
    (broken / "nbmon_broken-0.1.dist-info" / "entry_points.txt").write_text(
        "[nbmon.sinks]\nbroken = nbmon_broken_missing:SINK\n")
    done = subprocess.run([python, "-m", "nbmon.cli", "run", "--", "true"], capture_output=True, text=True,
                          timeout=60, env={**environ, "PYTHONPATH": str(broken)})
    assert done.returncode == 0
    said = [line for line in done.stderr.splitlines() if "broken" in line]
    assert said == ["nbmon: plugin 'broken' of nbmon.sinks (nbmon_broken_missing:SINK) cannot be loaded "
                    "(ModuleNotFoundError: No module named 'nbmon_broken_missing'); nbmon goes on without it"]
