"""The live dashboard: a real Monitor on this process, a real FigureWidget."""

from __future__ import annotations

import json
import math
import re
import threading

import numpy as np
import pytest

from helpers import RecordingComm, wait_until
from nbmon.monitor import Monitor
from nbmon.notebook.dashboard import THREAD_NAME, Dashboard, frame_bytes

POLL_S = 10.0  # upper bound of every wait below; they normally end in milliseconds


def live_threads():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.fixture
def dashboards():
    """Dashboards made by a test; all frozen and closed afterwards."""
    made: list[Dashboard] = []
    yield made
    for d in made:
        d.freeze()
        d.widget.close()
    assert not live_threads()


@pytest.fixture
def monitor():
    """A monitor of this process with at least three samples, still running."""
    m = Monitor(interval=0.02, gpu=False).start()
    wait_until(lambda: m.store.seq >= 3, timeout=POLL_S, what="three samples")
    yield m
    m.stop()


@pytest.fixture
def stopped(monitor):
    """The same monitor, stopped: its store only changes when the test appends."""
    monitor.stop()
    return monitor


def append(store, n: int, *, step: float = 0.02, **values) -> None:
    """Append n samples after the newest, copying it, with ``values`` overriding columns."""
    last = store.latest()
    row = np.array([values.get(c, last[c]) for c in store.columns], dtype=float)
    for k in range(1, n + 1):
        store.append(last["t"] + k * step, last["wall"] + k * step, row)


def trace(d: Dashboard, column: str):
    return d.widget.data[d.columns.index(column)]


# -- layout -------------------------------------------------------------------


def test_two_rows_without_gpu(stopped, dashboards):
    d = Dashboard(stopped, window_s=120.0, start=False)
    dashboards.append(d)
    assert d.widget is not None and type(d.widget).__name__ == "FigureWidget"
    assert d.columns == ["proc_cpu_percent", "sys_cpu_percent", "proc_rss_mb", "sys_mem_used_mb"]
    assert [tr.meta for tr in d.widget.data] == d.columns
    assert [tr.xaxis for tr in d.widget.data] == ["x", "x", "x2", "x2"]
    layout = d.widget.layout
    assert "xaxis3" not in layout.to_plotly_json()
    for axis in (layout.xaxis, layout.xaxis2):
        assert tuple(axis.range) == (-120.0, 0.0)
    assert layout.xaxis.matches == "x2"


def test_without_system_columns_only_the_tree_is_drawn(dashboards):
    m = Monitor(interval=0.02, system=False, gpu=False).start()
    try:
        wait_until(lambda: m.store.seq >= 2, timeout=POLL_S, what="two samples")
    finally:
        m.stop()
    d = Dashboard(m, start=False)
    dashboards.append(d)
    assert d.columns == ["proc_cpu_percent", "proc_rss_mb"]
    assert d.refresh()
    assert len(d.widget.data[0].x) >= 2


# -- refreshing ---------------------------------------------------------------


def test_traces_grow_as_samples_arrive(stopped, dashboards):
    d = Dashboard(stopped, start=False)
    dashboards.append(d)
    assert d.refresh()
    n0 = len(trace(d, "proc_rss_mb").x)
    assert n0 == stopped.store.seq
    sizes = []
    for _ in range(3):
        append(stopped.store, 10, proc_cpu_percent=42.0, proc_rss_mb=1536.0)
        assert d.refresh()
        sizes.append(len(trace(d, "proc_rss_mb").x))
    assert sizes == [n0 + 10, n0 + 20, n0 + 30]
    for tr in d.widget.data:
        assert isinstance(tr.x, np.ndarray) and tr.x.dtype == np.float32
        assert isinstance(tr.y, np.ndarray) and tr.y.dtype == np.float32
        assert tr.x[-1] == 0.0 and tr.x[0] < 0.0
    assert trace(d, "proc_rss_mb").y[-1] == 1536.0
    assert d.widget.layout.title.text == "CPU 42.0 % · RSS 1.5 GiB"
    assert d.refreshes == 4 and d.errors == 0


def test_no_new_sample_sends_nothing(stopped, dashboards):
    d = Dashboard(stopped, start=False)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    assert d.refresh()
    assert comm.updates()
    comm.published.clear()
    assert not d.refresh() and not d.refresh()
    assert comm.published == []
    assert d.skipped == 2
    append(stopped.store, 1)
    assert d.refresh()
    assert comm.updates()


def test_a_frame_is_one_message_with_binary_float32_buffers(stopped, dashboards):
    append(stopped.store, 5000)                   # more than the budget: decimated
    d = Dashboard(stopped, start=False, budget_per_trace=1000)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    assert d.refresh()
    frames = [(state, paths, buffers) for state, paths, buffers in comm.update_messages()
              if state.get("_py2js_update")]
    assert len(frames) == 1
    state, paths, buffers = frames[0]
    update = state["_py2js_update"]
    assert update["style_traces"] == list(range(len(d.columns)))
    assert update["layout_data"]["title.text"].startswith("CPU ")
    for prop in ("x", "y"):
        specs = update["style_data"][prop]
        assert len(specs) == len(d.columns)
        assert all(spec["dtype"] == "float32" and spec["shape"] == [1000] for spec in specs)
    assert len(paths) == len(buffers) == 2 * len(d.columns)
    assert sum(len(b) for b in buffers) == d.last_frame_bytes == 4 * 1000 * 2 * 4
    # the JSON part carries no sample values
    assert len(json.dumps(state)) < 2000


def test_frame_bytes_counts_every_trace():
    x = np.zeros(10, dtype=np.float32)
    assert frame_bytes({"a": (x, x), "b": (x, np.zeros(5, dtype=np.float32))}) == 40 + 40 + 40 + 20
    assert frame_bytes({}) == 0


# -- the refresher thread and freeze -----------------------------------------


def test_refresher_draws_while_running_and_freeze_stops_it(monitor, dashboards):
    d = Dashboard(monitor, refresh_hz=50.0)
    dashboards.append(d)
    assert [t.daemon for t in live_threads()] == [True]
    wait_until(lambda: d.refreshes >= 3, timeout=POLL_S, what="three refreshes")
    n = len(trace(d, "proc_cpu_percent").x)
    assert n >= 3
    record = d.freeze()
    assert not live_threads()
    assert not d.running
    assert '<svg' in record and 'class="nbmon-summary"' in record
    assert "Resource summary" in record and "CPU" in record and "RSS" in record
    assert d.widget.layout.title.text.endswith("· stopped")
    assert d.errors == 0, d.last_error


def test_refresher_ends_by_itself_when_the_monitor_stops(monitor, dashboards):
    d = Dashboard(monitor, refresh_hz=50.0)
    dashboards.append(d)
    wait_until(lambda: d.refreshes >= 1, timeout=POLL_S, what="a refresh")
    monitor.stop()
    wait_until(lambda: not live_threads(), timeout=POLL_S, what="the refresher to end")
    # its last refresh drew the last sample
    assert d._seq == monitor.store.seq
    assert len(trace(d, "proc_rss_mb").x) == monitor.store.seq


def test_refresher_counts_errors_and_keeps_going(monitor, dashboards):
    d = Dashboard(monitor, refresh_hz=100.0, start=False)
    dashboards.append(d)
    calls = []

    def broken(force=False):
        calls.append(force)
        raise RuntimeError("boom")

    d.refresh = broken
    d.start()
    wait_until(lambda: d.errors >= 3, timeout=POLL_S, what="three counted errors")
    assert d.running
    assert d.last_error == "RuntimeError: boom"
    record = d.freeze()
    assert not live_threads()
    assert 'class="nbmon-summary"' in record


def test_freeze_of_a_monitor_that_never_started(dashboards):
    m = Monitor(interval=0.02, gpu=False)
    d = Dashboard(m, refresh_hz=50.0)
    dashboards.append(d)
    assert d.columns == ["proc_cpu_percent", "sys_cpu_percent", "proc_rss_mb", "sys_mem_used_mb"]
    assert d.running                              # waits for the monitor to start
    assert not d.refresh()
    record = d.freeze()
    assert not live_threads()
    assert 'class="nbmon-summary"' in record and "<svg" not in record


def test_start_again_after_freeze(monitor, dashboards):
    d = Dashboard(monitor, refresh_hz=50.0)
    dashboards.append(d)
    d.freeze()
    assert not live_threads()
    d.start()
    assert len(live_threads()) == 1 and not d.frozen
    before = d.refreshes
    wait_until(lambda: d.refreshes > before, timeout=POLL_S, what="a refresh after restart")


@pytest.mark.parametrize("kwargs", [dict(window_s=0), dict(window_s=math.inf), dict(refresh_hz=-1),
                                    dict(refresh_hz="4"), dict(budget_per_trace=1)])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        Dashboard(Monitor(gpu=False), start=False, **kwargs)


# -- GPUs (the fake NVML library, through the real pynvml) -------------------


@pytest.fixture
def fake_gpus(fake_gpu):
    fake_gpu.set(devices=[dict(util_gpu=37, mem_total=80 << 30, mem_used=1 << 30),
                          dict(util_gpu=99, mem_total=24 << 30, mem_used=20 << 30)])
    return fake_gpu


def test_gpu_rows_per_device(fake_gpus, dashboards):
    m = Monitor(interval=0.02).start()
    try:
        wait_until(lambda: m.store.seq >= 2, timeout=POLL_S, what="two samples")
        assert len(m.sources.gpus.devices) == 2
        d = Dashboard(m, start=False)
    finally:
        m.stop()
    dashboards.append(d)
    assert d.columns[4:] == ["gpu0_util_percent", "gpu1_util_percent", "gpu0_mem_used_mb", "gpu1_mem_used_mb"]
    assert [tr.xaxis for tr in d.widget.data][4:] == ["x3", "x3", "x4", "x4"]
    assert tuple(d.widget.layout.xaxis4.range) == (-600.0, 0.0)
    assert d.refresh()
    assert set(trace(d, "gpu0_util_percent").y.tolist()) == {37.0}
    assert set(trace(d, "gpu1_mem_used_mb").y.tolist()) == {20 * 1024.0}
    title = d.widget.layout.title.text
    assert "GPU 68.0 %" in title and "GPU mem 21.0 GiB" in title
    # a dashboard built after the stop (devices closed) still has the GPU rows
    later = Dashboard(m, start=False)
    dashboards.append(later)
    assert later.columns == d.columns
    assert "GPU" in later.freeze()


# -- static pages -------------------------------------------------------------


def test_record_html_is_plain_html(stopped):
    from nbmon.notebook.dashboard import record_html

    record = record_html(stopped)
    assert record.startswith('<div class="nbmon-live-record">')
    assert 'class="nbmon-summary"' in record and "<svg" in record
    assert "<script" not in record


def test_write_html_is_a_self_contained_page_of_the_whole_run(stopped, tmp_path):
    from nbmon.notebook.dashboard import write_html

    append(stopped.store, 20_000, proc_cpu_percent=10.0)
    append(stopped.store, 1, proc_cpu_percent=777.0)   # a one-sample spike at the end
    path = tmp_path / "run.html"
    assert write_html(stopped, path, title="python <train.py>") == path
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>nbmon: python &lt;train.py&gt;</title>" in page
    assert 'class="nbmon-summary"' in page and "<svg" in page
    assert "Plotly.newPlot" in page
    assert not re.search(r"<script[^>]*\bsrc=", page)          # plotly.js is embedded: offline
    assert len(page) > 1_000_000
    assert not live_threads()


def test_write_html_of_a_monitor_that_never_ran(tmp_path):
    from nbmon.notebook.dashboard import write_html

    path = write_html(Monitor(gpu=False), tmp_path / "empty.html")
    page = (tmp_path / "empty.html").read_text(encoding="utf-8")
    assert path == tmp_path / "empty.html"
    assert 'class="nbmon-summary"' in page and "Plotly.newPlot" in page
