"""Bad input, over every public entry point, as one table.

For each bad value: the exact error type (or exit code), a message that is
one sentence naming the value as the user gave it, and proof that nothing
happened: no new thread or child process, no descriptor or file left behind,
the notebook's history and monitor unchanged, and the command or cell that
would have left a mark file never ran.

Some cases are also in the per-module suites (test_cli, test_magics,
test_summary, test_seed_*, test_engine); this module is the single table
over the whole surface. Shared helpers come from helpers.py and conftest.py
(the IPython shell: the ``ip`` fixture); a few constants from those suites.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import psutil
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import nbmon
import nbmon.engine
import nbmon.kernel.magics
import nbmon.sources.gpus.nvml
from helpers import StubSource, gone_pid, wait_until
from nbmon import AbstractBackendSender, Monitor, ResourceMonitor, ResourceSummary, SystemMonitor, catalog
from nbmon.kernel.session import SESSION
from test_cli import NBMON
from test_nvml import DEV_A, DEV_B

PY = sys.executable
MARK = "ran"  # what the command, or the cell, would create if it ever ran
MARK_CODE = f"open({MARK!r}, 'w').close()"
CLI = [shutil.which("nbmon")] if shutil.which("nbmon") else NBMON  # the console script, as users run it


def assert_one_sentence(message: str, named: str | None) -> None:
    """One line, one sentence, and the bad value as the user gave it."""
    assert "\n" not in message and 0 < len(message) < 240, message
    assert not re.search(r"[.!?]\s+[A-Z]", message), f"more than one sentence: {message!r}"
    if named is not None:
        assert named in message, f"{message!r} does not name {named!r}"


def world() -> dict:
    """What a refused call must leave as it was: threads, child processes,
    open descriptors, files in the working directory, running monitors."""
    return {
        "threads": sorted((t.name, t.ident) for t in threading.enumerate() if t.is_alive()),
        "children": sorted(p.pid for p in psutil.Process().children(recursive=True)),
        "fds": sorted(os.listdir("/proc/self/fd")),
        "files": sorted(os.listdir(".")),
        "running monitors": len(nbmon.engine._running),
    }


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- %resmon / %%resmon ----------------------------------------------------------------

SUBS = "start, stop, status, summary, auto, kernels"
POSITIVE = "--interval must be a positive number of seconds, got '{}'"

# (magic, line, the value as typed or None when the mistake is a missing value, exact message)
MAGIC_CASES = [
    ("line", "frobnicate", "frobnicate", f"unknown %resmon subcommand 'frobnicate'; use one of: {SUBS}"),
    ("line", "--bogus", "--bogus", "unrecognized arguments: --bogus"),
    ("line", "status --bogus", "--bogus", "unrecognized arguments: --bogus"),
    ("line", "--interval 0", "'0'", POSITIVE.format("0")),
    ("line", "--interval -1", "'-1'", POSITIVE.format("-1")),
    ("line", "--interval nan", "'nan'", POSITIVE.format("nan")),
    ("line", "--interval inf", "'inf'", POSITIVE.format("inf")),
    ("line", "--interval abc", "'abc'", "--interval must be a number of seconds, got 'abc'"),
    ("line", "--interval 1e9", "'1e9'", "--interval must be at most a day (86400 s), got '1e9'"),
    ("line", "--interval", None, "argument --interval: expected one argument"),
    ("line", "--window 0.05 --interval 0.1", "0.05", "--window (0.05 s) must be at least --interval (0.1 s)"),
    ("line", "--window abc", "'abc'", "--window must be a number of seconds, got 'abc'"),
    ("line", "auto", None, "%resmon auto needs on or off"),
    ("line", "auto maybe", "'maybe'", "%resmon auto takes on or off, got 'maybe'"),
    ("line", "auto on --threshold abc", "'abc'", "--threshold must be a number of seconds, got 'abc'"),
    ("line", "auto on --threshold -1", "'-1'", "--threshold must be a positive number of seconds, got '-1'"),
    ("line", "stop now", "'now'", "%resmon stop takes no value, got 'now'"),
    ("cell", "stop", "'stop'", "%%resmon takes options only, not 'stop'"),
    ("cell", "auto on", "'auto'", "%%resmon takes options only, not 'auto'"),
    ("cell", "--bogus", "--bogus", "unrecognized arguments: --bogus"),
    ("cell", "--interval 0", "'0'", POSITIVE.format("0")),
    ("cell", "--interval nan", "'nan'", POSITIVE.format("nan")),
    ("cell", "--interval abc", "'abc'", "--interval must be a number of seconds, got 'abc'"),
    ("cell", "--interval 1e9", "'1e9'", "--interval must be at most a day (86400 s), got '1e9'"),
    ("line", "--memory-warning 150", "'150'",
     "--memory-warning must be a percentage between 0 and 100 (None: no warning), got '150'"),
    ("cell", "--memory-warning x", "'x'",
     "--memory-warning must be a percentage between 0 and 100 (None: no warning), got 'x'"),
    ("line", "--session gpu", "'gpu'", "--session must be one of 'helper', 'kernel', got 'gpu'"),
    # files: refused before anything starts (issue 19)
    ("line", "--csv /proc/nbmon.csv", "'/proc/nbmon.csv'", "cannot write '/proc/nbmon.csv': No such file or directory"),
    ("line", "--csv out --jsonl ./out", "'./out'", "each output needs its own file: 'out', './out'"),
    ("line", "--jsonl .", "'.'", "output path '.' is a directory"),
    ("line", "status --csv out.csv", "--csv", "--csv only applies to %resmon start"),
    ("line", "--dask client --jsonl out.jsonl", "--jsonl", "--jsonl only applies to the kernel's monitor, not to --dask"),
    ("cell", "--csv out.csv --jsonl out.jsonl", "--csv, --jsonl", "--csv, --jsonl only apply to %resmon start"),
]


def notebook(ip) -> dict:
    """world() plus the notebook's own state: history, monitor, hooks, namespace."""
    magics = nbmon.kernel.magics._loaded[id(ip)]
    host = SESSION.host.info()   # the session's host, in its helper process: its monitor, views and threads
    return world() | {
        "history": len(nbmon.history()),
        "last": nbmon.last_summary(),
        "monitor": {key: host.get(key) for key in ("running", "pid", "interval")},
        "auto": magics.auto_threshold_s,
        "dashboards": host["views"],
        "host threads": host["threads"],
        "hooks": [list(ip.events.callbacks[e]) for e in ("pre_run_cell", "post_run_cell")],
        "user_ns": sorted(ip.user_ns),
    }


def run_magic(ip, magic: str, line: str):
    if magic == "line":
        return ip.run_line_magic("resmon", line)
    return ip.run_cell_magic("resmon", line, MARK_CODE)


def assert_magic_refused(ip, magic, line, named, message) -> None:
    before = notebook(ip)
    with capture_output() as cap, pytest.raises(UsageError) as info:
        run_magic(ip, magic, line)
    assert type(info.value) is UsageError
    assert str(info.value) == message
    assert_one_sentence(str(info.value), named)
    assert cap.outputs == [] and cap.stdout == "" and cap.stderr == ""
    assert not os.path.exists(MARK), "the cell ran"
    assert notebook(ip) == before


@pytest.mark.parametrize("magic, line, named, message", MAGIC_CASES,
                         ids=[f"{m}:{line}" for m, line, _, _ in MAGIC_CASES])
def test_magic(in_tmp, ip, magic, line, named, message):
    assert_magic_refused(ip, magic, line, named, message)


def test_magics_while_a_monitor_runs(in_tmp, ip):
    """The same table against a running monitor: it keeps running, unchanged."""
    with capture_output():
        ip.run_line_magic("resmon", "--interval 0.05 --no-gpu")
    running = SESSION.host.info()
    assert running["running"]
    # The dashboard builds its chart on its own thread: the snapshots compare its steady state.
    wait_until(lambda: SESSION.host.info()["charts"] == 1, what="the chart to be built")
    for magic, line, named, message in MAGIC_CASES:
        assert_magic_refused(ip, magic, line, named, message)
    now = SESSION.host.info()
    assert now["running"] and (now["pid"], now["interval"]) == (running["pid"], 0.05)


# -- nbmon (the CLI, a real subprocess) ---------------------------------------------------

MISSING = "missing command: nbmon run [options] -- CMD [ARGS...]"
MARK_CMD = [PY, "-c", MARK_CODE]
SCRIPT = ("script.sh", "#!/bin/sh\ntouch ran\n", 0o644)  # exists, not executable (even for root)
PRECIOUS = ("out.csv", "precious\n", 0o644)
GARBAGE = ("garbage", "not a program\n", 0o755)  # executable, but exec() refuses it (ENOEXEC)

# (id, argv after `nbmon`, files made first, exit code, stderr (for {cwd}: the directory), value named)
CLI_CASES = [
    ("interval-0", ["run", "--interval", "0", "--", *MARK_CMD], [], 2, "error: " + POSITIVE.format("0"), "'0'"),
    ("interval-neg", ["run", "--interval", "-1", "--", *MARK_CMD], [], 2, "error: " + POSITIVE.format("-1"), "'-1'"),
    ("interval-nan", ["run", "--interval", "nan", "--", *MARK_CMD], [], 2, "error: " + POSITIVE.format("nan"), "'nan'"),
    ("interval-inf", ["run", "--interval", "inf", "--", *MARK_CMD], [], 2, "error: " + POSITIVE.format("inf"), "'inf'"),
    ("interval-abc", ["run", "--interval", "abc", "--", *MARK_CMD], [], 2,
     "error: --interval must be a number of seconds, got 'abc'", "'abc'"),
    ("interval-huge", ["run", "--interval", "1e9", "--", *MARK_CMD], [], 2,
     "error: --interval must be at most a day (86400 s), got '1e9'", "'1e9'"),
    ("interval-tiny", ["run", "--interval", "1e-400", "--", *MARK_CMD], [], 2,
     "error: " + POSITIVE.format("1e-400"), "'1e-400'"),
    ("demo-interval", ["demo", "--interval", "0"], [], 2, "error: " + POSITIVE.format("0"), "'0'"),
    ("no-subcommand", [], [], 2, "error: missing subcommand; use one of: run, demo, report, compare, postmortem, kernels, top", None),
    ("bad-subcommand", ["frobnicate"], [], 2,
     "error: unknown subcommand 'frobnicate'; use one of: run, demo, report, compare, postmortem, kernels, top", "'frobnicate'"),
    ("unknown-option", ["run", "--bogus", "--", *MARK_CMD], [], 2, "error: unrecognized arguments: --bogus",
     "--bogus"),
    ("no-command", ["run"], [], 2, "error: " + MISSING, None),
    ("no-command-after-dashes", ["run", "--csv", "out.csv", "--"], [], 2, "error: " + MISSING, None),
    ("not-found", ["run", "--csv", "out.csv", "--", "no-such-command-nbmon", "arg"], [], 127,
     "command not found: no-such-command-nbmon", "no-such-command-nbmon"),
    ("not-found-path", ["run", "--", "./no-such-file"], [], 127, "command not found: ./no-such-file",
     "./no-such-file"),
    ("not-executable", ["run", "--csv", "out.csv", "--jsonl", "out.jsonl", "--", "./script.sh"], [SCRIPT], 126,
     "cannot run ./script.sh: Permission denied", "./script.sh"),
    ("a-directory", ["run", "--csv", "out.csv", "--", "/"], [], 126, "cannot run /: Permission denied", "/"),
    ("missing-directory", ["run", "--csv", "nodir/out.csv", "--", *MARK_CMD], [], 2,
     "error: cannot write 'nodir/out.csv': directory '{cwd}/nodir' does not exist", "'nodir/out.csv'"),
    ("under-proc", ["run", "--summary-json", "/proc/nbmon.json", "--", *MARK_CMD], [], 2,
     "error: cannot write '/proc/nbmon.json': No such file or directory", "'/proc/nbmon.json'"),
    ("html-under-proc", ["run", "--html", "/proc/nbmon.html", "--", *MARK_CMD], [], 2,
     "error: cannot write '/proc/nbmon.html': No such file or directory", "'/proc/nbmon.html'"),
    ("exists-no-force", ["run", "--csv", "out.csv", "--", *MARK_CMD], [PRECIOUS], 2,
     "error: output file 'out.csv' already exists (add --force to replace it)", "'out.csv'"),
    # --force replaces outputs only once the command can run: out.csv stays precious.
    ("forced-output-kept", ["run", "--force", "--csv", "out.csv", "--jsonl", "new.jsonl", "--", "./script.sh"],
     [PRECIOUS, SCRIPT], 126, "cannot run ./script.sh: Permission denied", "./script.sh"),
    ("exec-format-error", ["run", "--csv", "out.csv", "--jsonl", "out.jsonl", "--", "./garbage"], [GARBAGE], 126,
     "cannot run ./garbage: Exec format error", "./garbage"),
    ("same-file-twice", ["run", "--csv", "out", "--jsonl", "./out", "--", *MARK_CMD], [], 2,
     "error: each output needs its own file: 'out', './out'", "'./out'"),
]


@pytest.mark.parametrize("args, files, code, stderr, named",
                         [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli(in_tmp, args, files, code, stderr, named):
    for name, text, mode in files:
        (in_tmp / name).write_text(text)
        (in_tmp / name).chmod(mode)
    before = world()
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert done.stdout == ""
    expected = "nbmon: " + stderr.format(cwd=in_tmp) + "\n"
    assert done.stderr == expected  # exactly one line, for every refusal
    assert_one_sentence(done.stderr.rstrip("\n").removeprefix("nbmon: error: "), named)
    assert not (in_tmp / MARK).exists(), "the command ran"
    # No output file made, none changed: only what the test put there.
    assert {p.name: p.read_text() for p in in_tmp.iterdir()} == {name: text for name, text, _ in files}
    assert world() == before


# -- constructors -------------------------------------------------------------------------


class Sender(AbstractBackendSender):
    def publish(self, event, **kwargs) -> None:
        pass


class HalfProfiler:
    """Has two of the four GPUProfilerProtocol methods."""

    def get_utilization(self) -> float:
        return 1.0

    def get_clock_info(self) -> dict:
        return {"gpu_clock_mhz": 1.0}


def _sm(**kwargs):
    return lambda: SystemMonitor(**({"pid": os.getpid(), "backend_sender": Sender()} | kwargs))


def _cases():
    """(id, build) where build() gives (call, error type, exact message, value named)."""
    cases = []
    for value in (0, -1, math.nan, math.inf, "abc", True):
        reason = "a number" if isinstance(value, (str, bool)) else "a positive number"
        cases.append((f"ResourceMonitor-interval-{value!r}",
                      lambda v=value, r=reason: (lambda: ResourceMonitor(sample_interval_sec=v), ValueError,
                                                 f"sample_interval_sec must be {r} of seconds, got {v!r}", repr(v))))
    half = HalfProfiler()
    cases.append(("ResourceMonitor-half-profiler", lambda: (
        lambda: ResourceMonitor(gpu_profiler=half), TypeError,
        f"gpu_profiler {half!r} does not satisfy GPUProfilerProtocol: missing get_memory_usage, get_power_info",
        repr(half))))
    cases.append(("SystemMonitor-pid-neg", lambda: (_sm(pid=-1), ValueError,
                                                   "pid must be a positive process id, got -1", "-1")))

    def gone():
        pid = gone_pid()  # spawned and reaped: a pid with no process
        return _sm(pid=pid), ValueError, f"no process with pid {pid} exists", str(pid)

    cases.append(("SystemMonitor-pid-gone", gone))
    cases.append(("SystemMonitor-pid-2**40", lambda: (_sm(pid=2**40), ValueError,
                                                     f"no process with pid {2**40} exists", str(2**40))))
    cases.append(("SystemMonitor-pid-str", lambda: (_sm(pid="1"), ValueError,
                                                   "pid must be a whole number, got '1'", "'1'")))
    bad = object()
    cases.append(("SystemMonitor-no-publish", lambda: (_sm(backend_sender=bad), TypeError,
                                                      f"backend_sender {bad!r} has no publish(event) method",
                                                      repr(bad))))
    cases.append(("SystemMonitor-rate-0", lambda: (_sm(sample_rate_seconds=0), ValueError,
                                                  "sample_rate_seconds must be a positive number of seconds, got 0",
                                                  "0")))
    cases.append(("SystemMonitor-rank-neg", lambda: (_sm(rank=-1), ValueError,
                                                    "rank must be a non-negative whole number or None, got -1", "-1")))
    cases.append(("SystemMonitor-rank-bool", lambda: (_sm(rank=True), ValueError,
                                                     "rank must be a non-negative whole number or None, got True",
                                                     "True")))
    cases.append(("SystemMonitor-tree-str", lambda: (_sm(tree="yes"), ValueError,
                                                    "tree must be True or False, got 'yes'", "'yes'")))
    cases.append(("Monitor-interval-0", lambda: (lambda: Monitor(interval=0), ValueError,
                                                "interval must be a positive number of seconds, got 0", "0")))
    cases.append(("Monitor-interval-abc", lambda: (lambda: Monitor(interval="abc"), ValueError,
                                                  "interval must be a number of seconds, got 'abc'", "'abc'")))
    cases.append(("Monitor-backend-gpu", lambda: (lambda: Monitor(backend="gpu"), ValueError,
                                                 "backend must be one of 'thread', 'process', got 'gpu'", "'gpu'")))
    cases.append(("Monitor-max-bytes-0", lambda: (lambda: Monitor(max_bytes=0), ValueError,
                                                 "max_bytes must be a positive whole number of bytes, got 0", "0")))
    cases.append(("Monitor-gpu-str", lambda: (lambda: Monitor(gpu="no"), ValueError,
                                             "gpu must be True or False, got 'no'", "'no'")))
    cases.append(("Monitor-positional-interval", lambda: (lambda: Monitor(os.getpid(), 0.5), ValueError,
                                                         "options must be an Options or None, got 0.5", "0.5")))
    cases.append(("Monitor-unknown-setting", lambda: (lambda: Monitor(intervall=0.5), ValueError,
                                                     "unknown option(s) 'intervall'", "'intervall'")))
    cases.append(("Monitor-pid-2**40", lambda: (lambda: Monitor(pid=2**40), ValueError,
                                               f"no process with pid {2**40} exists", str(2**40))))
    # Refused by start(), after the sources were opened: they must be closed again.
    width = sum(len(catalog.names(source)) for source in (catalog.TREE, catalog.MACHINE, catalog.CGROUP)) + 2
    # (+ monotonic and wall time)
    cases.append(("Monitor-max-bytes-too-small", lambda: (
        lambda: Monitor(max_bytes=100, gpu=False).start(), ValueError,
        f"max_bytes must hold at least 128 samples ({128 * 8 * width} bytes for {width - 2} columns), got 100",
        "100")))
    cases.append(("Monitor-extra-source-reuses-a-field", lambda: (
        # An extra source whose field is one of nbmon's own.
        lambda: Monitor(gpu=False, extra_sources=[StubSource("rss-again", ("proc_rss_mb",))]).start(), ValueError,
        "duplicate column name(s) 'proc_rss_mb'", "'proc_rss_mb'")))
    # The type is checked before NVML is touched, so this holds with or without a GPU.
    cases.append(("NVMLProfiler-index-str", lambda: (lambda: nbmon.NVMLProfiler(device_index="0"), ValueError,
                                                    "device_index must be a whole number, got '0'", "'0'")))
    cases.append(("NVMLProfiler-index-float", lambda: (lambda: nbmon.NVMLProfiler(device_index=1.0), ValueError,
                                                      "device_index must be a whole number, got 1.0", "1.0")))
    return cases


CONSTRUCTOR_CASES = _cases()


@pytest.mark.parametrize("build", [b for _, b in CONSTRUCTOR_CASES], ids=[i for i, _ in CONSTRUCTOR_CASES])
def test_constructor(in_tmp, build):
    call, error, message, named = build()
    nvml_state = nbmon.sources.gpus.nvml.status()
    before = world()
    with pytest.raises(Exception) as info:
        call()
    assert type(info.value) is error, repr(info.value)
    assert str(info.value) == message
    assert_one_sentence(message, named)
    assert world() == before
    assert nbmon.sources.gpus.nvml.status() == nvml_state  # NVML not initialised on the way to the error


# -- ResourceSummary.from_dict ------------------------------------------------------------

GOOD = ResourceSummary(peak_rss_mb=512.0, mean_rss_mb=400.0, peak_gpu_mem_mb=None, mean_gpu_util=None,
                       memory_growth_mb=12.5, num_samples=10, duration_sec=1.0, peak_rss_exact=True).to_dict()
FD = "ResourceSummary.from_dict"


def without(*keys):
    return lambda: {k: v for k, v in GOOD.items() if k not in keys}


def changed(**kv):
    return lambda: GOOD | kv


def given(value):
    return lambda: value


# (id, what from_dict is given, exact message, value named)
FROM_DICT_CASES = [
    ("missing", without("num_samples"), f"{FD}: missing key(s) 'num_samples'", "'num_samples'"),
    ("missing-two", without("peak_rss_mb", "duration_sec"),
     f"{FD}: missing key(s) 'peak_rss_mb', 'duration_sec'", "'duration_sec'"),
    ("str-for-float", changed(peak_rss_mb="512"), f"{FD}: peak_rss_mb must be a number, got '512'", "'512'"),
    ("bool-for-float", changed(mean_rss_mb=True), f"{FD}: mean_rss_mb must be a number, got True", "True"),
    ("fraction-for-count", changed(num_samples=1.5), f"{FD}: num_samples must be a whole number, got 1.5", "1.5"),
    ("none-for-required", changed(duration_sec=None), f"{FD}: duration_sec must be a number, got None", "None"),
    ("str-for-bool", changed(peak_rss_exact="yes"), f"{FD}: peak_rss_exact must be true or false, got 'yes'",
     "'yes'"),
    ("list-for-optional", changed(start_time=[1.0]), f"{FD}: start_time must be a number, got [1.0]", "[1.0]"),
    ("a-list", given([("peak_rss_mb", 512.0)]), f"{FD} needs a dict, got [('peak_rss_mb', 512.0)] (list)",
     "[('peak_rss_mb', 512.0)]"),
    ("none", given(None), f"{FD} needs a dict, got None (NoneType)", "None"),
    ("json-text", given('{"peak_rss_mb": 1}'), f"""{FD} needs a dict, got '{{"peak_rss_mb": 1}}' (str)""",
     """'{"peak_rss_mb": 1}'"""),
]


@pytest.mark.parametrize("make, message, named", [c[1:] for c in FROM_DICT_CASES],
                         ids=[c[0] for c in FROM_DICT_CASES])
def test_from_dict(make, message, named):
    data = make()
    before = repr(data)
    with pytest.raises(ValueError) as info:
        ResourceSummary.from_dict(data)
    assert type(info.value) is ValueError
    assert str(info.value) == message
    assert_one_sentence(str(info.value), named)
    assert repr(data) == before  # the caller's value is left as it was


def test_a_numpy_integer_is_a_good_device_index(fake_gpu):
    """The other side of the NVMLProfiler rows: a whole number from numpy is not bad input."""
    fake_gpu.set(devices=[DEV_A, DEV_B])
    assert nbmon.NVMLProfiler(np.int64(1)).get_utilization() == DEV_B["util_gpu"]
    with pytest.raises(ValueError) as info:
        nbmon.NVMLProfiler(np.int64(2))
    assert str(info.value) == "device_index 2 is out of range: NVML sees 2 device(s)"
