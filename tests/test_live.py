"""The live dashboard: a real Monitor on this process, a real FigureWidget."""

from __future__ import annotations

import math
import os
import re
import threading

import numpy as np
import pytest

from browser_util import legend, png_pixels, row, summary_rows
from helpers import RecordingComm, wait_until
from nbmon.format import fmt
from nbmon.engine import Monitor
from nbmon.views import charts
from nbmon.views.dashboard import MARGIN_PX, THREAD_NAME, Dashboard
from nbmon.views.frames import frame_bytes
from nbmon.sources.cgroup import Cgroup

POLL_S = 10.0  # upper bound of every wait below; they normally end in milliseconds
MEMORY = charts.ROWS[1].headline   # the kernel's memory column, as the catalog charts it


def live_threads():
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.fixture
def dashboards():
    """Dashboards made by a test; all frozen and closed afterwards."""
    made: list[Dashboard] = []
    yield made
    for d in made:
        d.close()
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


def test_rows_without_gpu_kernel_on_top_machine_beneath(stopped, dashboards):
    d = Dashboard(stopped, window_s=120.0, start=False)
    dashboards.append(d)
    assert d.widget is not None and type(d.widget).__name__ == "FigureWidget"
    assert [c for c in d.columns if not c.startswith("cgroup_")] == \
        ["sys_cpu_percent", "proc_cpu_percent", "sys_mem_used_mb", MEMORY]
    assert [tr.meta for tr in d.widget.data] == d.columns + ["cells"]
    traces = {tr.meta: tr for tr in d.widget.data}
    layout = d.widget.layout
    assert "xaxis3" not in layout.to_plotly_json() and layout.xaxis.matches == "x2"
    assert layout.xaxis.range is None           # fits the data; the front end keeps the last window
    assert d.widget._nbmon["window"] == 120.0
    # machine-wide figures: a light band on the row's right axis, drawn first (underneath)
    for machine, kernel in (("sys_cpu_percent", "proc_cpu_percent"), ("sys_mem_used_mb", MEMORY)):
        assert traces[machine].fill == "tozeroy" and traces[kernel].fill is None
        assert traces[machine].line.width < traces[kernel].line.width
        assert layout[traces[machine].yaxis.replace("y", "yaxis")].side == "right"
        assert layout[traces[kernel].yaxis.replace("y", "yaxis")].side == "left"
    assert tuple(layout[traces["sys_cpu_percent"].yaxis.replace("y", "yaxis")].range) == (0.0, 100.0)
    assert layout.height == MARGIN_PX + sum(r.px for r in charts.ROWS[:2])
    assert layout.width is None and layout.autosize   # as wide as the output area


def test_the_container_limit_is_a_line_beside_the_kernels_memory(stopped, dashboards):
    append(stopped.store, 5, cgroup_mem_limit_mb=4096.0)   # as the cgroup source gives it, when known
    d = Dashboard(stopped, start=False)
    dashboards.append(d)
    limit, rss = trace(d, "cgroup_mem_limit_mb"), trace(d, MEMORY)
    assert limit.name == "memory limit, container"
    assert limit.line.dash == "dash" and limit.line.color == charts.LIMIT_COLOR
    assert limit.yaxis == rss.yaxis != trace(d, "sys_mem_used_mb").yaxis
    assert 4096.0 in limit.y.tolist()


def dashboard_of_a_short_run(dashboards, *extra_sources) -> Dashboard:
    """A dashboard of a stopped two-sample run of this process's tree (no machine figures) and ``extra_sources``."""
    m = Monitor(interval=0.02, system=False, gpu=False, extra_sources=list(extra_sources)).start()
    try:
        wait_until(lambda: m.store.seq >= 2, timeout=POLL_S, what="two samples")
    finally:
        m.stop()
    d = Dashboard(m, start=False)
    dashboards.append(d)
    return d


@pytest.mark.parametrize("memory_max, drawn", [("max\n", False), (f"{512 << 20}\n", True)])
def test_a_container_limit_is_in_the_legend_only_when_there_is_one(tmp_path, dashboards, memory_max, drawn):
    # A v2 cgroup as the kernel shows it, "max" where it sets no limit.
    for name, text in {"cgroup.procs": "", "memory.current": f"{100 << 20}\n", "memory.max": memory_max}.items():
        (tmp_path / name).write_text(text)
    d = dashboard_of_a_short_run(dashboards, Cgroup(dirs={"memory": str(tmp_path), "memory_version": "2"}))
    assert ("memory limit, container" in [tr.name for tr in d.widget.data]) is drawn
    assert "cgroup_mem_used_mb" not in d.columns   # not a chart row's: never drawn


def test_without_system_columns_only_the_tree_is_drawn(dashboards):
    d = dashboard_of_a_short_run(dashboards)
    assert [c for c in d.columns if not c.startswith("cgroup_")] == ["proc_cpu_percent", MEMORY]
    assert len(trace(d, MEMORY).x) >= 2


# -- the wire -----------------------------------------------------------------


def test_a_frame_carries_only_the_new_samples(stopped, dashboards):
    d = Dashboard(stopped, start=False)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    comm.published.clear()                              # its own comm_open
    assert len(trace(d, MEMORY).x) == stopped.store.seq   # the first state: what the store held
    assert not d.refresh() and not d.refresh()          # nothing new: nothing sent
    assert comm.published == [] and d.skipped == 2
    sent = []
    for _ in range(3):
        append(stopped.store, 10, proc_cpu_percent=42.0, **{MEMORY: 1536.0})
        assert d.refresh()
        sent += comm.customs("nbmon:append")
        comm.published.clear()
    assert len(sent) == 3
    for content, (x, *ys) in sent:
        assert len(x) == 10 * 8 and len(ys) == len(d.columns) and all(len(y) == 10 * 4 for y in ys)
        assert content["title"] == "CPU 42.0 % · Memory 1.5 GiB"
    xs = np.concatenate([np.frombuffer(b[0], dtype=np.float64) for _, b in sent])
    assert np.all(np.diff(xs) > 0)                      # seconds since the run's start, never resent
    cpu = np.frombuffer(sent[0][1][1 + d.columns.index("proc_cpu_percent")], dtype=np.float32)
    assert cpu.tolist() == [42.0] * 10
    assert d.last_frame_bytes == 10 * 8 + len(d.columns) * 10 * 4
    assert d.refreshes == 3 and d.errors == 0


def test_the_first_state_is_decimated_and_holds_no_plotly_bundle(stopped, dashboards):
    append(stopped.store, 5000)                         # more than the budget: min/max decimated
    d = Dashboard(stopped, start=False, budget_per_trace=1000)
    dashboards.append(d)
    assert all(len(tr.y) == 1000 for tr in d.widget.data if tr.meta != "cells")
    assert trace(d, MEMORY).x.dtype == np.float64
    state = d.widget.get_state()
    assert len(state["_esm"]) < 100_000                 # nbmon's loader, not plotly's 5 MB bundle
    assert state["_nbmon"]["id"] == d.live_id
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    d.widget._handle_custom_msg({"type": "nbmon:bundle"}, [])   # what a page that missed the push asks
    ((_content, (bundle,)),) = comm.customs("nbmon:bundle")
    assert len(bundle) > 1_000_000 and b"as FigureView" in bundle


@pytest.fixture
def comms(monitor, monkeypatch):
    """Every widget comm opened from here on, recorded (the kernel's side of
    it), in a process that has not sent plotly's bundle yet."""
    import comm

    from nbmon.views import live

    opened: list[RecordingComm] = []

    def create(**kwargs):
        opened.append(RecordingComm(**kwargs))
        return opened[-1]

    monkeypatch.setattr(comm, "create_comm", create)
    monkeypatch.setattr(live, "_bundle_sent", False)
    return opened


def bundles(opened: list[RecordingComm]) -> list[bytes]:
    return [b for c in opened for _, (b,) in c.customs("nbmon:bundle")]


def test_plotly_bundle_goes_ahead_of_the_view_once_on_a_model_closed_at_once(comms, monitor, dashboards):
    from nbmon.views.live import push_bundle

    assert push_bundle() is True
    ((bundle,),) = [bundles(comms)]
    assert len(bundle) > 1_000_000 and b"as FigureView" in bundle
    # the carrier and its Layout: each opened, then closed; nothing of them left to save
    assert len(comms) == 2
    assert all(c.published[0][0] == "comm_open" and c.published[-1][0] == "comm_close" for c in comms)
    assert push_bundle() is False
    d = Dashboard(monitor, refresh_hz=50.0, build=False)   # built by its refresher, as %resmon does
    dashboards.append(d)
    wait_until(lambda: d.refreshes >= 2, timeout=POLL_S, what="two refreshes")
    assert len(bundles(comms)) == 1 and d.errors == 0, d.last_error


def test_a_bundle_that_could_not_go_ahead_comes_with_the_first_view(comms, monitor, dashboards, monkeypatch):
    from nbmon.views import live

    found = live.plotly_bundle
    monkeypatch.setattr(live, "plotly_bundle", lambda: ("0", live.pathlib.Path("/nonexistent/widgetbundle.js")))
    assert live.push_bundle() is False
    assert bundles(comms) == [] and all(c.published[-1][0] == "comm_close" for c in comms)
    monkeypatch.setattr(live, "plotly_bundle", found)
    d = Dashboard(monitor, refresh_hz=50.0, build=False)
    dashboards.append(d)
    wait_until(lambda: bundles(comms), timeout=POLL_S, what="the view to send the bundle")
    assert len(bundles(comms)) == 1 and d.errors == 0, d.last_error


def test_cells_are_sent_as_bands_once_and_again_when_they_end(stopped, dashboards):
    cells = []
    d = Dashboard(stopped, start=False, cells=cells)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    t = stopped.store.latest()["t"]
    cells.append({"id": "a", "n": 7, "label": "model.fit(X)", "t0": t, "t1": None})
    assert d.refresh()
    assert d.refresh() is False                         # unchanged: not sent again
    cells[0]["t1"] = t + 1.5
    assert d.refresh()
    bands = [c for content, _ in comm.customs("nbmon:append") for c in content["cells"]]
    assert [(b["n"], b["label"], b["t1"] is None) for b in bands] == [(7, "model.fit(X)", True),
                                                                       (7, "model.fit(X)", False)]
    assert bands[1]["t1"] - bands[1]["t0"] == pytest.approx(1.5)


def test_every_band_in_the_window_is_sent_again_now_and_then(stopped, dashboards, monkeypatch):
    # A page misses the frames that come before its model is ready: a band's end it missed comes again.
    import time
    import types

    from nbmon.views import dashboard, live

    cells = []
    d = Dashboard(stopped, start=False, cells=cells)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    t = stopped.store.latest()["t"]
    cells.append({"id": "a", "n": 3, "label": "import time", "t0": t, "t1": t + 1.0})
    assert d.refresh()                                  # the frame the page missed
    assert d.refresh() is False
    later = time.monotonic() + live.RECORD_EVERY_S
    monkeypatch.setattr(dashboard, "time", types.SimpleNamespace(monotonic=lambda: later))
    assert d.refresh()
    (band,) = comm.customs("nbmon:append")[-1][0]["cells"]
    assert (band["id"], band["n"], band["t1"] - band["t0"]) == ("a", 3, pytest.approx(1.0))
    assert d.refresh() is False                         # and not again until the next time


def test_cells_that_ended_before_the_window_are_neither_sent_nor_kept(stopped, dashboards):
    from nbmon.views.dashboard import MAX_CELLS, keep_cells

    t = stopped.store.latest()["t"]
    cells = [{"id": "old", "n": 1, "label": "", "t0": t - 100.0, "t1": t - 50.0},
             {"id": "new", "n": 2, "label": "", "t0": t - 5.0, "t1": t - 4.0},
             {"id": "running", "n": 3, "label": "", "t0": t - 200.0, "t1": None}]
    d = Dashboard(stopped, window_s=30.0, start=False, cells=cells)
    dashboards.append(d)
    assert [c["id"] for c in d.widget._nbmon["cells"]] == ["new", "running"]
    keep_cells(cells, t, 30.0)
    assert [c["id"] for c in cells] == ["new", "running"]
    many = [{"id": str(k), "n": k, "label": "", "t0": t + k, "t1": t + k + 0.5} for k in range(3 * MAX_CELLS)]
    keep_cells(many, t + 3 * MAX_CELLS, 1e9)
    assert len(many) == MAX_CELLS and many[-1]["id"] == str(3 * MAX_CELLS - 1)   # the newest kept


def test_plotly_events_go_to_the_kernel_only_once_the_users_code_asks(stopped, dashboards, monkeypatch):
    from nbmon.views import live

    monkeypatch.setattr(live, "EVENTS_EVERY_S", 0.0)   # looked for at every refresh (else every 2 s)
    d = Dashboard(stopped, start=False)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    assert d.widget._nbmon["events"] == []
    d.refresh()
    assert comm.customs("nbmon:events") == []
    d.widget.data[0].on_hover(lambda *args: None)
    d.widget.layout.xaxis.on_change(lambda *args: None, "range")
    d.refresh()
    d.refresh()
    assert [content["events"] for content, _ in comm.customs("nbmon:events")] == [["hover", "relayout"]]


def test_a_record_is_resent_at_most_every_few_seconds_however_many_cells_end(monitor, dashboards):
    from nbmon.views import live

    class Handle:
        def __init__(self):
            self.updates = []

        def update(self, obj):
            self.updates.append(obj._repr_mimebundle_()[0])

    d = Dashboard(monitor, refresh_hz=50.0, start=False)
    dashboards.append(d)
    d.widget.comm = RecordingComm(target_name="jupyter.widget")
    d.handle, d.picture_handle = Handle(), Handle()
    d._recorded -= live.RECORD_MIN_S   # displayed a while ago
    d.start()
    for _ in range(100):          # 100 quick cells end
        d.cell_ended()
    assert len(d.handle.updates) == 1 and len(d.picture_handle.updates) == 1
    wait_until(lambda: len(d.handle.updates) == 2, timeout=live.RECORD_MIN_S + POLL_S, what="the deferred record")
    assert "nbmon-live-record" in d.handle.updates[-1]["text/html"] and "image/png" in d.picture_handle.updates[-1]


def test_frame_bytes_counts_every_trace():
    x = np.zeros(10, dtype=np.float32)
    assert frame_bytes({"a": (x, x), "b": (x, np.zeros(5, dtype=np.float32))}) == 40 + 40 + 40 + 20
    assert frame_bytes({}) == 0


# -- the refresher thread and freeze -----------------------------------------


def test_refresher_draws_while_running_and_freeze_stops_it(monitor, dashboards):
    d = Dashboard(monitor, refresh_hz=50.0, start=False)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    d.start()
    assert [t.daemon for t in live_threads()] == [True]
    wait_until(lambda: d.refreshes >= 3, timeout=POLL_S, what="three refreshes")
    record = d.freeze()
    assert not live_threads()
    assert not d.running
    assert record.timeline is not None and 'class="nbmon-summary"' in record.html
    assert "Resource summary" in record.html and "Peak memory" in record.html and "stopped" in record.html
    assert comm.customs("nbmon:append")[-1][0]["title"].endswith("· stopped")
    assert d.errors == 0, d.last_error


def test_refresher_ends_by_itself_when_the_monitor_stops(monitor, dashboards):
    d = Dashboard(monitor, refresh_hz=50.0, start=False)
    dashboards.append(d)
    d.widget.comm = comm = RecordingComm(target_name="jupyter.widget")
    first = len(trace(d, MEMORY).x)
    d.start()
    wait_until(lambda: d.refreshes >= 1, timeout=POLL_S, what="a refresh")
    monitor.stop()
    wait_until(lambda: not live_threads(), timeout=POLL_S, what="the refresher to end")
    # its last refresh sent the last sample: the page holds every one, once
    assert d._seq == monitor.store.seq
    appended = sum(len(buffers[0]) // 8 for _, buffers in comm.customs("nbmon:append"))
    assert first + appended == monitor.store.seq


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
    assert 'class="nbmon-summary"' in record.html


def test_freeze_of_a_monitor_that_never_started(dashboards):
    m = Monitor(interval=0.02, gpu=False)
    d = Dashboard(m, refresh_hz=50.0)
    dashboards.append(d)
    assert [c for c in d.columns if not c.startswith("cgroup_")] == \
        ["sys_cpu_percent", "proc_cpu_percent", "sys_mem_used_mb", MEMORY]
    assert d.running                              # waits for the monitor to start
    assert not d.refresh()
    record = d.freeze()
    assert not live_threads()
    assert 'class="nbmon-summary"' in record.html and record.timeline is None


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
    gpu = [c for c in d.columns if c.startswith("gpu")]
    assert gpu == ["gpu0_util_percent", "gpu1_util_percent", "gpu0_mem_used_mb", "gpu1_mem_used_mb"]
    assert [trace(d, c).xaxis for c in gpu] == ["x3", "x3", "x4", "x4"]
    assert {v for v in trace(d, "gpu0_util_percent").y.tolist() if v == v} == {37.0}
    assert {v for v in trace(d, "gpu1_mem_used_mb").y.tolist() if v == v} == {20 * 1024.0}
    title = d.widget.layout.title.text
    assert "GPU 68.0 %" in title and "GPU mem 21.0 GiB" in title
    # a dashboard built after the stop (devices closed) still has the GPU rows
    later = Dashboard(m, start=False)
    dashboards.append(later)
    assert later.columns == d.columns
    assert "GPU" in later.freeze().html


# -- static pages -------------------------------------------------------------


# What every viewer keeps: nbconvert --sanitize-html escapes other elements
# (th, tbody, span, svg, img), GitHub's allowlist drops classes and styles.
KEPT_EVERYWHERE = {"div", "b", "table", "tr", "td"}


def test_record_html_is_plain_html_the_live_chart_mounts_into(stopped, dashboards):
    from nbmon.views.dashboard import record_html

    html = record_html(stopped)
    assert html.startswith('<div class="nbmon-live-record">')
    assert 'class="nbmon-summary"' in html
    assert set(re.findall(r"<([a-z0-9]+)", html)) <= KEPT_EVERYWHERE, set(re.findall(r"<([a-z0-9]+)", html))
    d = Dashboard(stopped, start=False)
    dashboards.append(d)
    data, _metadata = d._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" not in data   # a saved notebook never says "model not found"
    assert f'data-nbmon-live="{d.live_id}"' in data["text/html"] and "nbmon-live-static" in data["text/html"]
    assert "a live chart stood here; its figures as of " in data["text/html"]   # saved while live, it says so
    assert "Resource summary" in data["text/plain"] and "Duration" in data["text/plain"]
    picture, metadata = d.picture()._repr_mimebundle_()
    assert set(picture) == {"image/png", "text/plain"} and metadata["image/png"]["width"] == charts.TIMELINE_PX


def test_record_table_and_timeline_give_the_same_figures(stopped):
    from nbmon.views.dashboard import record

    shown = record(stopped)
    table = summary_rows(shown.html)
    peaks = legend(table)
    assert peaks["CPU"] == row(table, "CPU mean / peak").split(" / ")[1]
    assert peaks["memory"] == row(table, "Peak memory").split(" (")[0]
    assert re.search(r" · over \d+\.\d\d s$", row(table, "Timeline"))   # the time scale
    pixels = png_pixels(shown.timeline.png)
    assert pixels.shape[:2] == (2 * shown.timeline.height, 2 * shown.timeline.width)


def test_a_cells_timeline_ends_with_its_last_sample_not_the_monitors(stopped):
    # The monitor samples on after a cell ends, while its record is drawn.
    store = stopped.store
    window = store.open_window(store.latest()["t"])
    append(store, 40, proc_cpu_percent=10.0)
    stats = window.close()
    append(store, 5, proc_cpu_percent=400.0)
    shown = charts.record_timeline(store, stats, stats.t_open)
    assert legend(dict([shown.legend]))["CPU"] == "10.0 %"
    assert shown.legend[1].endswith(" · over 0.78 s")   # the 2nd to the 40th sample's time, 39 steps


def strip_columns(pixels, strip: int, color: str) -> np.ndarray:
    """Per pixel column of one strip of a record's timeline: the highest row
    (0 = the strip's top) drawn opaque in ``color``, or the strip's height."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    h = 48   # 24 CSS px at twice the resolution, then a 12-pixel gap
    part = pixels[strip * (h + 12):strip * (h + 12) + h]
    drawn = (part[..., :3] == rgb).all(axis=2) & (part[..., 3] == 255)
    return np.where(drawn.any(axis=0), drawn.argmax(axis=0), h)


def test_a_one_sample_spike_survives_in_the_timeline_picture(stopped):
    store = stopped.store
    window = store.open_window(store.latest()["t"])
    append(store, 30_000, proc_cpu_percent=10.0)
    append(store, 1, proc_cpu_percent=400.0)     # one sample in 30,001, at ~2/3 of the window
    append(store, 15_000, proc_cpu_percent=10.0)
    shown = charts.record_timeline(store, window.close(), window.closed.t_open)
    cpu_color = next(t.color for t in charts.traces_for(store.columns)[1] if t.column == "proc_cpu_percent")
    tops = strip_columns(png_pixels(shown.png), 0, cpu_color)
    spike = int(tops.argmin())
    assert tops[spike] <= 4                                    # the spike reaches the strip's top (its scale)
    assert 0.6 < spike / tops.size < 0.72                      # where it happened
    assert (tops[:spike - 4] > 40).all() and (tops[spike + 4:] > 40).all()   # and nowhere else (10 % of 400)
    assert legend(dict([shown.legend]))["CPU"] == "400 %"


def test_write_html_is_a_self_contained_page_of_the_whole_run(stopped, tmp_path):
    from nbmon.views.dashboard import write_html

    append(stopped.store, 20_000, proc_cpu_percent=10.0)
    append(stopped.store, 1, proc_cpu_percent=777.0)   # a one-sample spike at the end
    path = tmp_path / "run.html"
    assert write_html(stopped, path, title="python <train.py>") == path
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>nbmon: python &lt;train.py&gt;</title>" in page
    assert 'class="nbmon-summary"' in page and '<img class="nbmon-timeline"' in page
    assert "Plotly.newPlot" in page
    assert not re.search(r"<script[^>]*\bsrc=", page)          # plotly.js is embedded: offline
    assert len(page) > 1_000_000
    assert not live_threads()


def test_write_html_of_a_monitor_that_never_ran(tmp_path):
    from nbmon.views.dashboard import write_html

    path = write_html(Monitor(gpu=False), tmp_path / "empty.html")
    page = (tmp_path / "empty.html").read_text(encoding="utf-8")
    assert path == tmp_path / "empty.html"
    assert 'class="nbmon-summary"' in page and "Plotly.newPlot" in page


def meminfo_used_percent() -> float:
    """The machine's memory in use, from /proc/meminfo (not nbmon's reading)."""
    info = {line.split(":")[0]: float(line.split()[1]) for line in open("/proc/meminfo")}
    return 100.0 * (1.0 - info["MemAvailable"] / info["MemTotal"])


def container_used_percent() -> float:
    """This process's memory cgroup's usage of its limit (100 where it has
    none: the machine's share decides), read from the cgroup's files."""
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        for usage, limit, root in (("memory.current", "memory.max", "/sys/fs/cgroup"),
                                   ("memory.usage_in_bytes", "memory.limit_in_bytes", "/sys/fs/cgroup/memory")):
            if (controllers == "" and usage == "memory.current") or "memory" in controllers.split(","):
                try:
                    used, most = (open(f"{root}{path}/{name}").read().strip() for name in (usage, limit))
                except OSError:
                    continue
                if most != "max" and int(most) < os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"):
                    return 100.0 * int(used) / int(most)
    return 100.0


def test_the_memory_warning_is_a_line_at_its_threshold_and_a_note_while_it_holds(dashboards):
    """A threshold below the memory's use here: the chart's layout patch
    holds a dotted line at the threshold (on the machine's axis; on the
    kernel's, beside the limit, in a container with a memory limit) and a
    note on the memory row; once the threshold is above the use, the note
    goes and the line moves."""
    from nbmon.postmortem import memwarn
    from nbmon.views.dashboard import WARNING_LINE, WARNING_NOTE

    watch = memwarn.MemoryWatch(os.getpid(), max(0.5, min(meminfo_used_percent(), container_used_percent()) / 2))
    with Monitor(interval=0.05, gpu=False, consumers=[watch]) as m:
        d = Dashboard(m, start=False)
        dashboards.append(d)
        d.widget.comm = RecordingComm(target_name="jupyter.widget")
        wait_until(lambda: watch.warning is not None, timeout=POLL_S, what="the machine's warning")
        d.refresh(force=True)
        layout = d.widget._nbmon["layout"]
        (line,) = [s for s in layout["shapes"] if s["name"] == WARNING_LINE]
        limit = watch.level.limit_mb
        assert line["y0"] == line["y1"] == pytest.approx(limit * watch.percent / 100)
        container = watch.level.kind == memwarn.CONTAINER
        axis = next(t.yaxis for t in d.widget.data if t.meta == ("proc_pss_mb" if container else "sys_mem_used_mb"))
        assert line["yref"] == axis and line["line"]["dash"] == "dot"
        # Whose memory and of what limit, and where the line stands.
        assert line["label"]["text"] == (f"{'container limit' if container else 'machine memory'} "
                                         f"{fmt(watch.percent, '%')}: {fmt(limit * watch.percent / 100, 'MiB')}")
        (note,) = [a for a in layout["annotations"] if a["name"] == WARNING_NOTE]
        assert note["text"].startswith(f"memory warning: the container is over {watch.percent:.1f} % of its" if container
                                       else f"memory warning: the machine's memory is over {watch.percent:.1f} % used")
        watch.percent = 99.9   # above the machine's use: the crossing ends
        wait_until(lambda: watch.warning is None, timeout=POLL_S, what="the warning to end")
        d.refresh(force=True)
        layout = d.widget._nbmon["layout"]
        assert layout["annotations"] == []
        assert [s["y0"] for s in layout["shapes"]] == [pytest.approx(limit * 99.9 / 100)]


# -- the helper's widget: no plotly --------------------------------------------


def _wire_free(value):
    """A widget state's value with its arrays ({buffer, dtype, shape}) as lists (NaN as None: comparable)."""
    if isinstance(value, dict) and "buffer" in value and "dtype" in value:
        return [None if v != v else v for v in np.frombuffer(value["buffer"], dtype=value["dtype"]).tolist()]
    if isinstance(value, dict):
        return {k: _wire_free(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_wire_free(v) for v in value]
    return value


def test_the_plain_widget_sends_what_plotlys_figurewidget_sends_for_the_same_chart(stopped, dashboards):
    """The helper's chart is a plain widget (no plotly in its process): its
    state is what plotly's own FigureWidget sends the same front end, as
    plotly serialises it, save the trace ids plotly adds."""
    append(stopped.store, 50)
    plain, figure = Dashboard(stopped, start=False, plotly=False), Dashboard(stopped, start=False)
    dashboards += [plain, figure]
    assert type(plain.widget).__name__ == "ChartWidget" and type(figure.widget).__name__ == "FigureWidget"
    states = []
    for d in (plain, figure):
        state = d.widget.get_state()
        states.append({k: _wire_free(state[k]) for k in ("_widget_data", "_widget_layout", "_config")})
    for trace in states[1]["_widget_data"]:
        trace.pop("uid")
    states[1]["_config"].pop("plotlyServerURL", None)   # plotly 6.3's link to its Chart Studio, shown nowhere here
    assert states[0] == states[1]
    assert len(states[0]["_widget_data"][0]["x"]) > 50   # the window's points travel in the first state


def test_the_grid_is_plotlys_make_subplots():
    from plotly.subplots import make_subplots

    from nbmon.views import live

    for heights in ([1], [100, 150], [120, 80, 90, 60], [3, 1, 4, 1, 5, 9]):
        theirs = make_subplots(rows=len(heights), cols=1, shared_xaxes=True, vertical_spacing=0.05,
                               row_heights=heights, specs=[[{"secondary_y": True}]] * len(heights))
        layout = theirs.to_plotly_json()["layout"]
        layout.pop("template", None)
        ours = live.stacked_rows(heights, 0.05)
        assert ours.keys() == layout.keys()
        for key, axis in layout.items():
            assert ours[key] == {**axis, **({"domain": pytest.approx(axis["domain"], abs=1e-9)}
                                            if "domain" in axis else {})}, key


def test_a_plain_widget_chart_imports_no_plotly():
    import subprocess
    import sys

    code = ("import sys, time\nfrom nbmon.engine import Monitor\nfrom nbmon.views.dashboard import Dashboard\n"
            "m = Monitor(interval=0.02, gpu=False).start()\ntime.sleep(0.3)\n"
            "d = Dashboard(m, start=False, plotly=False)\nd.refresh(force=True)\nm.stop()\n"
            "assert type(d.widget).__name__ == 'ChartWidget' and d.refreshes == 1\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('plotly', '_plotly_utils', 'narwhals', 'PIL')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
