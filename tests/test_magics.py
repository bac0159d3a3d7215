"""``%resmon`` / ``%%resmon`` through a real IPython shell (IPython's own test
shell, as anywidget's tests use): namespaces, return values, history, outputs,
the monitor's threads, auto mode, unloading, and misuse."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import traceback

import pandas as pd
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import nbmon
import nbmon.kernel.magics
from browser_util import legend, row, summary_rows
from helpers import StubSource, burn_cpu, wait_until
from nbmon.engine import Monitor
from nbmon.format import fmt
from nbmon.kernel.session import SESSION
from nbmon.report.summary import ResourceSummary

MIB = 2**20
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def thread_names(prefix: str = "nbmon-") -> list[str]:
    """nbmon's threads, in this process and in the session's helper process
    (the session's own link to it, nbmon-relay, left out: it lives as long
    as nbmon is loaded)."""
    names = [t.name for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]
    if SESSION.remote and not SESSION.host.gone:
        names += SESSION.host.info()["threads"]
    return sorted(name for name in names if name != "nbmon-relay")


def count(name: str) -> int:
    return thread_names().count(name)


def host_info() -> dict:
    """The session's monitor as its host says (it may run in the helper process)."""
    return SESSION.host.info()


def samplers() -> int:
    """Sampling engines running: a sampler thread, or the reader of a helper process."""
    return count("nbmon-sampler") + count("nbmon-reader")


def html_of(output) -> str:
    return output.data.get("text/html", "") if isinstance(output.data, dict) else ""


def rows() -> int:
    return len(nbmon.history())


# -- %%resmon ------------------------------------------------------------------


def test_cell_runs_in_user_namespace_and_returns_last_value(ip):
    with capture_output():
        assert ip.run_cell_magic("resmon", "", "rm_a = 21\nrm_b = rm_a * 2\nrm_b") == 42
        assert ip.run_cell_magic("resmon", "", "6 * 7") == 42
        # functions defined in the cell see the user namespace as their globals
        code = "def rm_f():\n    return rm_a + rm_b\nrm_c = rm_f()\nrm_f() + 1"
        assert ip.run_cell_magic("resmon", "", code) == 64
        assert ip.run_cell_magic("resmon", "", "rm_d = rm_c") is None
        # IPython syntax in the cell body works too
        assert ip.run_cell_magic("resmon", "", "rm_e = !echo hi\nrm_e[0]") == "hi"
    assert (ip.user_ns["rm_a"], ip.user_ns["rm_b"], ip.user_ns["rm_c"], ip.user_ns["rm_d"]) == (21, 42, 63, 63)
    assert callable(ip.user_ns["rm_f"])


def test_cell_adds_history_row_and_shows_summary_in_place_of_meter(ip):
    before = rows()
    with capture_output() as cap:   # long enough for its live meter to show (METER_AFTER_S)
        value = ip.run_cell_magic("resmon", "--label alloc",
                                  "import time\nrm_buf = b'\\x01' * (100 * 2**20)\ntime.sleep(1.0)\nlen(rm_buf)")
    assert value == 100 * MIB

    history = nbmon.history()
    assert len(history) == before + 1
    assert list(history.columns[:5]) == ["execution_count", "label", "start_time", "duration_sec", "status"]
    for column in ("peak_rss_mb", "memory_growth_mb", "num_samples", "mean_cpu_percent"):
        assert column in history.columns
    row = history.iloc[-1]
    assert row["label"] == "alloc"
    assert row["status"] == "ok"
    assert row["execution_count"] == ip.execution_count
    assert isinstance(row["start_time"], pd.Timestamp) and str(row["start_time"].tz) == "UTC"
    assert row["duration_sec"] > 0
    assert row["memory_growth_mb"] >= 90, row["memory_growth_mb"]
    assert row["peak_rss_mb"] >= 100

    last = nbmon.last_summary()
    assert isinstance(last, ResourceSummary)
    assert last.duration_sec == row["duration_sec"]
    assert last.peak_rss_mb == row["peak_rss_mb"]
    assert last.memory_growth_mb == row["memory_growth_mb"]
    assert last.num_samples == row["num_samples"]
    assert last.mean_cpu_percent == row["mean_cpu_percent"]

    # the live meter, then the static summary replacing it through the same display id
    meter, summary, *picture = cap.outputs   # a timeline picture, if two samples: an output of its own
    assert all("image/png" in p.data and not p.update for p in picture)
    assert WIDGET_MIME in meter.data and not meter.update
    display_id = meter.transient["display_id"]
    assert summary.update and summary.transient["display_id"] == display_id
    html = html_of(summary)
    assert 'class="nbmon-summary"' in html and 'data-status="ok"' in html
    assert "alloc" in html and "Peak memory" in html
    assert cap.stdout == ""
    del ip.user_ns["rm_buf"]


def test_a_quick_cell_shows_its_record_without_a_meter(ip):
    """A cell shorter than METER_AFTER_S pays for no live meter: its record is its first output."""
    with capture_output() as cap:
        assert ip.run_cell_magic("resmon", "--label quick", "6 * 7") == 42
    (record,) = cap.outputs
    assert not record.update and WIDGET_MIME not in record.data and "nbmon · quick" in html_of(record)
    assert "nbmon-meter" not in thread_names()


@pytest.mark.parametrize("option, label", [('--label "two words"', "two words"), ("--label 'cpu+memory'", "cpu+memory"),
                                           ("--label plain", "plain")])
def test_label_quotes_are_not_part_of_the_label(ip, option, label):
    with capture_output() as cap:
        ip.run_cell_magic("resmon", option, "rm_l = 1")
    assert nbmon.history().iloc[-1]["label"] == label
    assert f"nbmon · {label}: " in html_of(cap.outputs[-1])


def test_a_cell_starts_the_sessions_monitor_which_rests_between_cells(ip):
    """The first monitored cell starts the session's monitor (in the helper
    process, none of it in the kernel): it samples at its interval while a
    cell runs and once a second between cells, until %resmon stop."""
    wait_until(lambda: not thread_names(), what="the helper's warm-up to end")
    with capture_output():
        seen = ip.run_cell_magic("resmon", "--interval 0.05",
                                 "import threading, time\n"
                                 "from nbmon.kernel.session import SESSION as rm_s\n"
                                 "before = rm_s.host.info()['samples']\n"
                                 "time.sleep(1.0)\n"
                                 "(rm_s.host.info(), rm_s.host.info()['samples'] - before,\n"
                                 " sorted(t.name for t in threading.enumerate()))")
    during, taken, here = seen
    assert during["running"] and during["interval"] == 0.05
    assert "nbmon-sampler" in during["threads"] and "nbmon-meter" in during["threads"]
    assert "nbmon-sampler" not in here and "nbmon-meter" not in here   # the kernel holds none of it
    assert taken >= 12, taken   # 20 at 0.05 s: the cell's pace, with room for a loaded machine
    wait_until(lambda: "nbmon-meter" not in thread_names(), timeout=10.0, what="the cell's meter to end")
    rested = host_info()["samples"]
    import time
    time.sleep(2.0)
    assert host_info()["running"] and host_info()["samples"] - rested <= 4   # a sample a second between cells
    with capture_output():
        ip.run_line_magic("resmon", "stop")
    wait_until(lambda: not thread_names(), timeout=10.0, what="the monitor's threads to end")


def test_cell_inside_running_monitor_leaves_it_running(ip):
    with capture_output():
        ip.run_line_magic("resmon", "")
        pid = host_info()["pid"]
        ip.run_cell_magic("resmon", "--label inner", "rm_x = 1")
    assert host_info()["running"] and host_info()["pid"] == pid
    assert samplers() == 1
    wait_until(lambda: count("nbmon-meter") == 0, timeout=10.0, what="the meter thread to end")


def test_output_option_returns_the_summary(ip):
    with capture_output():
        result = ip.run_cell_magic("resmon", "-o", "rm_y = sum(range(1000))\nrm_y")
    assert isinstance(result, ResourceSummary)
    assert result == nbmon.last_summary()
    assert ip.user_ns["rm_y"] == 499500


def test_quiet_displays_nothing_but_records(ip):
    before = rows()
    with capture_output() as cap:
        assert ip.run_cell_magic("resmon", "--quiet --label q", "7") == 7
    assert cap.outputs == [] and cap.stdout == "" and cap.stderr == ""
    assert rows() == before + 1
    assert nbmon.history().iloc[-1]["label"] == "q"


def test_failing_cell_reraises_unchanged_and_records_failed(ip):
    before = rows()
    with capture_output() as cap, pytest.raises(ZeroDivisionError, match="division by zero") as info:
        ip.run_cell_magic("resmon", "--label boom", "rm_before = 1\nrm_zero = 0\nrm_before / rm_zero")
    assert type(info.value) is ZeroDivisionError
    # the traceback ends in the cell's own line, numbered as in the notebook cell (line 1: %%resmon)
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (last.lineno, last.line) == (4, "rm_before / rm_zero")
    assert ip.user_ns["rm_before"] == 1
    assert rows() == before + 1
    assert nbmon.history().iloc[-1]["status"] == "failed"
    assert 'data-status="failed"' in html_of(cap.outputs[-1])

    # the very exception object the cell raised, not a wrapper
    with capture_output(), pytest.raises(ValueError) as info:
        ip.run_cell_magic("resmon", "", "rm_err = ValueError('mine')\nraise rm_err")
    assert info.value is ip.user_ns["rm_err"]
    assert nbmon.history().iloc[-1]["status"] == "failed"


def test_keyboard_interrupt_reraises_and_records_interrupted(ip):
    before = rows()
    with capture_output() as cap, pytest.raises(KeyboardInterrupt):
        ip.run_cell_magic("resmon", "--label stopped", "raise KeyboardInterrupt")
    assert rows() == before + 1
    row = nbmon.history().iloc[-1]
    assert (row["label"], row["status"]) == ("stopped", "interrupted")
    assert 'data-status="interrupted"' in html_of(cap.outputs[-1])
    wait_until(lambda: count("nbmon-meter") == 0, timeout=10.0, what="the meter to end after an interrupted cell")


# -- %resmon -------------------------------------------------------------------


def test_line_magic_starts_one_monitor_and_stop_ends_every_thread(ip):
    with capture_output() as cap:
        ip.run_line_magic("resmon", "--interval 0.05")
    assert samplers() == 1 and count("nbmon-live") == 1
    # its record at once, which the widget mounts its chart into: never a widget view a saved notebook loses
    record, picture = cap.outputs   # the record's table, then its timeline picture
    assert "nbmon-live-record" in html_of(record) and WIDGET_MIME not in record.data
    assert "image/png" in picture.data

    with capture_output() as cap:
        ip.run_line_magic("resmon", "")  # a second dashboard, the same monitor
    assert samplers() == 1 and count("nbmon-live") == 2

    with capture_output() as cap:
        ip.run_line_magic("resmon", "status")
    assert cap.stdout.startswith("nbmon: running, every 0.05 s")
    assert "GPU:" in cap.stdout

    wait_until(lambda: host_info()["samples"] >= 3, timeout=10.0, what="three samples")
    with capture_output():
        summary = ip.run_line_magic("resmon", "summary")
    assert isinstance(summary, ResourceSummary)
    assert summary.num_samples >= 3 and summary.peak_rss_mb > 0

    with capture_output() as cap:
        ip.run_line_magic("resmon", "stop")
    wait_until(lambda: not thread_names(), timeout=5.0, what="every nbmon thread to end after stop")
    records = [o for o in cap.outputs if o.update and "nbmon-live-record" in html_of(o)]
    assert len(records) == 2 and len([o for o in cap.outputs if o.update and "image/png" in o.data]) == 2
    assert any("nbmon-summary" in html_of(o) for o in cap.outputs if not o.update)

    with capture_output() as cap:
        ip.run_line_magic("resmon", "status")
    assert cap.stdout.startswith("nbmon: stopped")


def test_nbmon_monitor_is_the_one_resmon_shows_and_feeds_a_sink_of_ones_own(ip):
    got: list[dict] = []
    monitor = nbmon.monitor(interval=0.05, gpu=False, consumers=[got.append])   # a sink of one's own: in the kernel
    assert monitor is SESSION.host.monitor and monitor.running and monitor.interval == 0.05
    assert nbmon.monitor(interval=1.0) is monitor and monitor.interval == 0.05  # running: the same one
    with capture_output() as cap:
        ip.run_line_magic("resmon", "")  # its dashboard shows the same monitor
    assert SESSION.host.monitor is monitor and samplers() == 1 and "nbmon-live-record" in html_of(cap.outputs[0])
    wait_until(lambda: len(got) >= 3, what="three samples at the sink")
    with capture_output():
        ip.run_line_magic("resmon", "stop")
    wait_until(lambda: not thread_names(), timeout=5.0, what="every nbmon thread to end after stop")
    assert [e["time"] for e in got] == monitor.store.rows_since(0)[1].tolist()  # every sample, once


def test_samples_frame_round_trips_through_csv_and_parquet(ip, tmp_path):
    with capture_output():
        ip.run_line_magic("resmon", "--interval 0.05")
    wait_until(lambda: host_info()["samples"] >= 5, timeout=10.0, what="five samples")
    with capture_output():
        ip.run_line_magic("resmon", "stop")

    frame = nbmon.samples()
    assert isinstance(frame, pd.DataFrame) and len(frame) >= 5
    assert isinstance(frame.index, pd.DatetimeIndex)
    assert frame.index.name == "time" and str(frame.index.tz) == "UTC"
    assert frame.index.is_monotonic_increasing
    for column in ("elapsed_s", "proc_cpu_percent", "proc_rss_mb"):
        assert column in frame.columns

    frame.to_csv(tmp_path / "s.csv")
    back = pd.read_csv(tmp_path / "s.csv", index_col="time", parse_dates=["time"])
    pd.testing.assert_frame_equal(back, frame, check_freq=False)

    frame.to_parquet(tmp_path / "s.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "s.parquet"), frame, check_freq=False)


@pytest.mark.parametrize("order", ["meter first", "record first"])
def test_the_record_stays_whether_its_meter_shows_before_or_after_it(order):
    # The meter is shown from the host's thread, the record from the cell's: either may come first.
    outlet = nbmon.kernel.magics._Outlet()
    meter, record = ({"data": {"text/plain": name}, "metadata": {}} for name in ("meter", "record"))
    with capture_output() as cap:
        if order == "meter first":
            outlet.show("m1", meter)
            outlet.replace("m1", record)
        else:
            outlet.replace("m1", record)
            outlet.show("m1", meter)
    shown = [(o.data["text/plain"], o.update) for o in cap.outputs]
    assert shown == ([("meter", False), ("record", True)] if order == "meter first" else [("record", False)])


def test_dashboard_marks_each_cell_with_its_prompt_number(ip):
    with capture_output():
        ip.run_line_magic("resmon", "--interval 0.05 --session kernel")   # the session in this process: its bands
    (dashboard, *_), = SESSION.host.views
    number = ip.execution_count
    with capture_output():
        ip.run_cell("rm_y = sum(range(10**5))", store_history=True)   # numbered, as in a kernel
        ip.run_cell("%%resmon --label summed\nrm_y + 1", store_history=True)
    first, second = dashboard.cells
    assert (first["n"], first["label"]) == (number, "rm_y = sum(range(10**5))")
    assert (second["n"], second["label"]) == (number + 1, "summed")
    assert first["t0"] < first["t1"] <= second["t0"] < second["t1"]
    with capture_output() as cap:
        ip.run_line_magic("resmon", "stop")
    (final,) = [o for o in cap.outputs if o.update and "nbmon-live-record" in html_of(o)]
    assert "stopped" in html_of(final)


@pytest.mark.parametrize("cell", ["rm_n = 1", "%%resmon --quiet\nrm_n = 2"])
def test_every_hook_names_the_running_cell_by_its_own_prompt_number(ip, monkeypatch, cell):
    # IPython's result of the cell is the truth; IPython >= 9.8 advances its
    # count before pre_run_cell, older ones after it.
    told, notify = [], SESSION.notify

    def told_and_sent(method, *args):
        told.append((method, args[1] if method == "cell_open_note" else args[0]))
        notify(method, *args)

    monkeypatch.setattr(SESSION, "notify", told_and_sent)
    with capture_output():
        ip.run_line_magic("resmon", "auto on --threshold 0")
        result = ip.run_cell(cell, store_history=True)
        ip.run_line_magic("resmon", "auto off")
    n = result.execution_count
    auto = [] if cell.startswith("%%resmon") else [("cell_open_note", n)]   # auto mode's open of a plain cell
    assert told == [("cell_started", n), *auto, ("cell_finished", n)]
    assert nbmon.history().iloc[-1]["execution_count"] == n


def test_in_a_terminal_the_record_is_shown_at_start_and_replaced_at_stop_only(ip):
    # This shell has no kernel, as in a terminal, where an update is printed
    # again: the first figures, a cell's end, the periodic refresh would each print.
    with capture_output() as cap:
        ip.run_line_magic("resmon", "--interval 0.05")
        wait_until(lambda: host_info()["charts"] == 1, timeout=60.0, what="the chart (after the first figures)")
        ip.run_cell("rm_t = 1", store_history=True)
        ip.run_line_magic("resmon", "stop")
    assert [o.update for o in cap.outputs if "nbmon-live-record" in html_of(o)] == [False, True]


def test_failing_cell_shows_the_users_code_with_its_prompt_number(ip):
    number = ip.execution_count
    with capture_output() as cap:
        result = ip.run_cell("%%resmon --label boom\nrm_a = 1\nrm_a / 0", store_history=True)
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert nbmon.history().iloc[-1]["execution_count"] == number
    text = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
    assert f"Cell In[{number}], line 3" in text and "----> 3 rm_a / 0" in text
    assert "run_cell_magic" not in text and "magics.py" not in text, text
    assert len(text.strip().splitlines()) < 12, text


@pytest.mark.parametrize("body, shown", [("rm_v = 6\nrm_v * 7", True), ("rm_v = 6\nrm_v * 7;", False),
                                         ("rm_v = 6\nrm_v * 7;  # hidden", False), ("rm_v = 6\nrm_v * 7 # a;", True),
                                         ("rm_v = 6\n(rm_v *\n 7) ;\n\n# é", False), ("rm_é = 6\nrm_é * 7;", False)])
def test_a_cells_value_and_a_trailing_semicolon_are_as_without_resmon(ip, body, shown):
    outputs = {}
    for name, cell in (("plain", body), ("resmon", "%%resmon --quiet\n" + body)):
        with capture_output() as cap:
            result = ip.run_cell(cell, store_history=True)
        printed = re.sub(r"Out\[\d+\]", "Out[n]", cap.stdout)
        outputs[name] = (result.result, result.execution_count in ip.user_ns["Out"], printed)
    assert outputs["resmon"] == outputs["plain"]
    assert (outputs["plain"][0] == 42) is shown


def test_what_ipython_runs_after_the_cells_code_is_the_cells_too(ip):
    # matplotlib's inline backend draws a cell's figures in post_execute, after its code
    def draw():   # 0.6 s of CPU, however busy the machine (of wall time, at least that)
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.6:
            pass

    ip.events.register("post_execute", draw)
    try:
        with capture_output():
            ip.run_cell("%%resmon --label plot\nrm_p = 1", store_history=True)
    finally:
        ip.events.unregister("post_execute", draw)
    row = nbmon.history().iloc[-1]
    assert row["label"] == "plot" and row["duration_sec"] >= 0.6 and row["cpu_time_sec"] >= 0.5, row


def test_cell_record_table_and_timeline_give_the_same_figures(ip):
    nbmon.monitor(interval=0.02, gpu=False)   # one monitor across cells, as while %resmon runs
    try:
        burn_cpu(0.3)   # busy just before the cell: the sample its window opens with is not the cell's
        with capture_output() as cap:
            # a cell whose memory rose by much: its record opens, with its timeline
            # (kept: a peak freed in the cell may stay below this process's older high-water mark)
            ip.run_cell_magic("resmon", "--label idle", "import time\nrm_big = b'x' * (150 << 20)\n"
                                                        "time.sleep(0.3)")
    finally:
        SESSION.host.stop()
    html = [html_of(o) for o in cap.outputs if "nbmon-summary" in html_of(o)][-1]
    table = summary_rows(html)
    peaks = legend(table)   # the timeline picture's legend, a row of the table
    assert peaks["CPU"] == row(table, "CPU mean / peak").split(" / ")[1]
    assert peaks["memory"] == row(table, "Peak memory").split(" (")[0]
    assert re.search(r" · over \d+\.\d\d s$", row(table, "Timeline"))   # a time scale


def records_of(cap) -> list:
    return [o for o in cap.outputs if "nbmon-summary" in html_of(o)]


def pictures_of(cap) -> list:
    return [o for o in cap.outputs if "image/png" in o.data]


def test_a_short_cells_record_is_a_line_with_its_table_one_click_away(ip):
    with capture_output() as cap:
        ip.run_cell_magic("resmon", "", "rm_q = 1")
    [record] = records_of(cap)
    html, text = html_of(record), record.data["text/plain"]
    assert "<details><summary>" in html
    assert "Peak memory" in html   # the table, folded under the line
    assert len(text.splitlines()) == 1 and text.startswith("nbmon: ")
    assert re.search(r"CPU mean .* · Memory now .*, [+-].*, peak ", text), text
    assert pictures_of(cap) == []


# Each cell lasts past a sampling interval: a timeline needs two samples (one alone, the
# 60 ms allocation with no sleep had one sample 3 runs in 8: its record opens without one).
@pytest.mark.parametrize("code", ["import time\nrm_big = b'x' * (150 << 20)\ntime.sleep(0.2)",
                                  "import time\ntime.sleep(0.2)\n1/0"],
                         ids=["memory rose by much", "failed"])
def test_a_record_that_says_something_is_open_with_its_table_and_timeline(ip, code):
    with capture_output() as cap:
        ip.run_cell("%%resmon\n" + code)
    [record] = records_of(cap)
    assert "<details" not in html_of(record)
    assert "Peak memory" in record.data["text/plain"].splitlines()[2]
    assert len(pictures_of(cap)) == 1, record.data["text/plain"]


def test_history_has_no_gpu_columns_without_gpu_figures(ip):
    with capture_output():
        ip.run_cell_magic("resmon", "--no-gpu", "rm_b = 1")
    assert not [c for c in nbmon.history().columns if "gpu" in c]


# -- auto mode and unloading ---------------------------------------------------


def oneliners(cap) -> list[str]:
    return [html_of(o) for o in cap.outputs if "nbmon-oneline" in html_of(o)]


def test_auto_modes_short_cells_are_neither_shown_nor_kept_nor_waited_for(ip, monkeypatch):
    with capture_output():
        ip.run_line_magic("resmon", "auto on --threshold 0.3")
    before = rows()
    calls = []
    call = SESSION.host.call
    monkeypatch.setattr(SESSION.host, "call", lambda method, *a, **k: calls.append(method) or call(method, *a, **k))
    with capture_output() as cap:
        assert ip.run_cell("rm_a = 1").success
        assert ip.run_cell("rm_b = rm_a + 1").success
    assert calls == [] and oneliners(cap) == []   # the kernel waited for the helper at neither end
    with capture_output() as cap:
        assert ip.run_cell("import time\ntime.sleep(0.4)").success
    assert calls == ["cell_close"] and len(oneliners(cap)) == 1
    monkeypatch.undo()
    assert rows() == before + 1
    with capture_output():
        ip.run_line_magic("resmon", "auto off")


def test_quiet_cells_after_the_first_are_kept_and_never_waited_for(ip, monkeypatch):
    with capture_output():
        assert ip.run_cell("%%resmon --quiet\nrm_c = 0").success   # its answer: the monitor runs
    before = rows()
    calls = []
    call = SESSION.host.call
    monkeypatch.setattr(SESSION.host, "call", lambda method, *a, **k: calls.append(method) or call(method, *a, **k))
    with capture_output() as cap:
        for k in range(3):
            assert ip.run_cell(f"%%resmon --quiet --label q{k}\nrm_c += 1").success
    assert calls == [] and records_of(cap) == [] and ip.user_ns["rm_c"] == 3
    monkeypatch.undo()
    history = nbmon.history()
    assert len(history) == before + 3 and list(history["label"].iloc[-3:]) == ["q0", "q1", "q2"]
    assert list(history["status"].iloc[-3:]) == ["ok"] * 3


def test_a_quiet_cell_after_the_first_runs_as_the_cell_it_wraps(ip):
    # From the cell hooks, as auto mode's cells (at their cost): no frame of the magic's
    # around its code; a run_cell inside it (%%capture's) is part of it, not its end.
    with capture_output():
        assert ip.run_cell("%%resmon --quiet\nrm_w = 0").success   # its answer: the monitor runs
        result = ip.run_cell("%%resmon --quiet --label wrapped\n%%capture rm_cap\nimport inspect\n"
                             "rm_w = [f.filename for f in inspect.stack()]", store_history=True)
    assert result.success and nbmon.kernel.magics.__file__ not in ip.user_ns["rm_w"], ip.user_ns["rm_w"]
    row = nbmon.history().iloc[-1]
    assert (row["label"], row["execution_count"], row["status"]) == ("wrapped", result.execution_count, "ok")


def test_auto_mode_takes_a_run_cell_inside_a_cell_as_part_of_it(ip):
    # %%capture runs its body by run_cell, whose hooks fire too: one record, the outer cell's, closed
    with capture_output():
        ip.run_line_magic("resmon", "auto on --threshold 0")
        before = rows()
        result = ip.run_cell("%%capture rm_captured\nrm_k = 1", store_history=True)
        ip.run_line_magic("resmon", "auto off")
    assert rows() == before + 1 and nbmon.history().iloc[-1]["execution_count"] == result.execution_count
    assert host_info()["open_cells"] == 0


def test_auto_mode_records_every_cell_until_off(ip):
    with capture_output() as cap:
        ip.run_line_magic("resmon", "auto on --threshold 0")
    assert "auto on" in cap.stdout
    before = rows()
    with capture_output() as cap:
        assert ip.run_cell("rm_s = sum(range(10**5))").success
        assert ip.run_cell("rm_t = rm_s + 1").success
        assert not ip.run_cell("1/0").success
    assert ip.user_ns["rm_t"] == 4999950001
    history = nbmon.history()
    assert len(history) == before + 3
    assert list(history["status"].iloc[-3:]) == ["ok", "ok", "failed"]
    lines = oneliners(cap)
    assert len(lines) == 3
    for line, (_, cell) in zip(lines, history.iloc[-3:].iterrows()):   # the headline, every figure labelled
        assert f"CPU mean {fmt(cell['mean_cpu_percent'], '%')} · Memory now " in line, line
        assert f", {fmt(cell['mem_growth_mb'], 'MiB', signed=True)}, peak {fmt(cell['peak_mem_mb'], 'MiB')}" in line
    assert "failed" in lines[-1]

    # a %%resmon cell is summarised once, by the cell magic
    before = rows()
    with capture_output() as cap:
        ip.run_cell("%%resmon --label own\nrm_u = 1")
    assert rows() == before + 1 and nbmon.history().iloc[-1]["label"] == "own"
    assert oneliners(cap) == []

    with capture_output() as cap:
        ip.run_cell("%resmon auto off")
    assert "auto off" in cap.stdout
    after_off = rows()
    with capture_output() as cap:
        ip.run_cell("rm_v = 2")
        ip.run_cell("rm_w = 3")
    assert rows() == after_off
    assert oneliners(cap) == []
    # the cell that turned auto off closed its own span, and the monitor auto on
    # started is stopped with it: no cell stays open, no sampler runs
    assert host_info()["open_cells"] == 0 and not host_info()["running"]


def test_a_cells_memory_guard_off_is_said_not_to_apply_under_auto_modes_monitor(ip):
    # The cell joins auto mode's running monitor, whose guard stays on: said, the quiet cell's too.
    with capture_output() as cap:
        ip.run_line_magic("resmon", "auto on --threshold 0")
        assert ip.run_cell("%%resmon --memory-guard off\nrm_g = 1").success
        assert ip.run_cell("%%resmon --quiet --memory-guard off\nrm_g = 2").success
        ip.run_line_magic("resmon", "auto off")
        assert ip.run_cell("%%resmon --memory-guard off\nrm_g = 3").success   # its own monitor: it applies
    said = [line for line in (cap.stdout + cap.stderr).splitlines() if "--memory-guard" in line]
    assert said == ["nbmon: --memory-guard off does not apply: auto mode's monitor is already running with its "
                    "memory guard (%resmon auto off first)"] * 2, said


def test_auto_mode_keeps_no_row_for_a_cell_below_the_threshold(ip):
    with capture_output() as cap:
        ip.run_line_magic("resmon", "auto on --threshold 5")
        before = rows()
        ip.run_cell("rm_c = 1")
        ip.run_line_magic("resmon", "auto off")
    assert rows() == before and oneliners(cap) == []


def test_unload_removes_hooks_and_stops_every_thread(ip):
    with capture_output():
        ip.run_line_magic("resmon", "")
        ip.run_line_magic("resmon", "auto on --threshold 0")
        ip.run_cell("rm_z = 1")
    magics = nbmon.kernel.magics._loaded[id(ip)]
    assert thread_names()
    assert magics._cell_finished in ip.events.callbacks["post_run_cell"]

    with capture_output():
        ip.run_line_magic("unload_ext", "nbmon")
    hooks = ip.events.callbacks["post_run_cell"] + ip.events.callbacks["pre_run_cell"]
    assert not [cb for cb in hooks if isinstance(getattr(cb, "__self__", None), nbmon.kernel.magics.ResmonMagics)]
    assert ip.find_line_magic("resmon") is None and ip.find_cell_magic("resmon") is None
    wait_until(lambda: not thread_names(), timeout=5.0, what="every nbmon thread to end after unload")

    before = rows()
    with capture_output():
        ip.run_cell("rm_z = 2")
    assert rows() == before

    with capture_output():  # and it loads again
        ip.run_line_magic("load_ext", "nbmon")
        assert ip.run_cell_magic("resmon", "--quiet", "rm_z + 1") == 3


# -- misuse --------------------------------------------------------------------

MISUSE = [
    ("frobnicate", "frobnicate"),
    ("--bogus", "--bogus"),
    ("--interval 0", "0"),
    ("--interval -1", "-1"),
    ("--interval nan", "nan"),
    ("--interval inf", "inf"),
    ("--interval abc", "abc"),
    ("--interval 1e9", "1e9"),
    ("--window 0.05 --interval 0.1", "0.05"),
    ("auto maybe", "maybe"),
    ("auto on --threshold -1", "-1"),
    ("auto on --threshold abc", "abc"),
    ("stop now", "now"),
]


def assert_usage_error(message: str, value: str) -> None:
    assert value in message, f"{message!r} does not name {value!r}"
    assert "\n" not in message.strip() and len(message) < 200, message


def state(ip):
    now = host_info()
    return (thread_names(), rows(), now.get("pid"), now["running"], now.get("interval"),
            list(ip.events.callbacks["pre_run_cell"]), list(ip.events.callbacks["post_run_cell"]))


@pytest.mark.parametrize("line, value", MISUSE)
def test_misuse_is_a_usage_error_that_changes_nothing(ip, line, value):
    before = state(ip)
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_line_magic("resmon", line)
    assert_usage_error(str(info.value), value)
    assert cap.outputs == [] and cap.stdout == ""
    assert state(ip) == before


def test_misuse_while_running_leaves_the_monitor_alone(ip):
    with capture_output():
        ip.run_line_magic("resmon", "--interval 0.05")
    before = state(ip)
    for line, value in MISUSE:
        with capture_output(), pytest.raises(UsageError) as info:
            ip.run_line_magic("resmon", line)
        assert_usage_error(str(info.value), value)
    assert state(ip) == before
    assert host_info()["interval"] == 0.05


@pytest.mark.parametrize("line, value", [("--interval 0", "0"), ("--interval abc", "abc"),
                                         ("--bogus", "--bogus"), ("stop", "stop")])
def test_cell_misuse_does_not_run_the_cell(ip, line, value):
    before = state(ip)
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_cell_magic("resmon", line, "rm_ran = True")
    assert_usage_error(str(info.value), value)
    assert "rm_ran" not in ip.user_ns
    assert cap.outputs == []
    assert state(ip) == before


def test_help_documents_the_options(ip):
    assert "--interval" in ip.find_line_magic("resmon").__doc__
    with capture_output() as cap:
        ip.run_cell("%resmon?")
    for text in ("--interval", "--label", "--quiet", "%%resmon", "auto on"):
        assert text in cap.stdout, text


# -- faults in the user's terminal -----------------------------------------------------

HOSTILE = "\x1b]0;pwned\x07\x1b[2J"   # a terminal title and a screen clear, in an error's own words


def test_status_shows_a_faults_text_without_its_escapes(ip):
    def hostile(event):
        raise RuntimeError(HOSTILE)

    monitor = nbmon.monitor(interval=0.05, gpu=False, consumers=[hostile])
    try:
        wait_until(lambda: monitor.faults, what="the sink's fault")
        with capture_output() as cap:
            ip.run_line_magic("resmon", "status")
    finally:
        SESSION.host.stop()
    (line,) = [line for line in cap.stdout.splitlines() if line.startswith("fault:")]
    assert "\x1b" not in cap.stdout and "\x07" not in cap.stdout
    assert line.endswith("RuntimeError: \\x1b]0;pwned\\x07\\x1b[2J"), line


def test_a_failing_sources_warning_is_printable():
    source = StubSource("gpu\x1b[8m", behave=lambda call: (_ for _ in ()).throw(OSError(HOSTILE)))
    monitor = Monitor(interval=0.02, gpu=False, system=False, extra_sources=[source]).start()
    wait_until(lambda: source.calls >= 3, what="three failing calls")
    with pytest.warns(RuntimeWarning) as warned:
        monitor.stop()
    (message,) = [str(w.message) for w in warned]
    assert "\x1b" not in message and "\x07" not in message
    assert message.startswith("nbmon: gpu\\x1b[8m failed") and message.endswith("OSError: \\x1b]0;pwned\\x07\\x1b[2J")


# -- a kernel without what nbmon needs (JupyterLite) --------------------------------

LITE = """import sys, threading
def no_threads(*args, **kwargs):   # what Pyodide's threading does
    raise RuntimeError("can't start new thread")
sys.platform, sys.modules["psutil"], threading._start_new_thread = "emscripten", None, no_threads
%load_ext nbmon
%resmon
print("cell ran on")
get_ipython().run_cell_magic("resmon", "", "x = 6 * 7\\nprint(x)")
"""


def test_a_kernel_without_threads_or_proc_is_told_what_nbmon_needs_in_one_line():
    """JupyterLite's Pyodide (no threads, no /proc, no psutil), as far as a
    real IPython shell can be it: ``%load_ext nbmon`` says in one line what
    nbmon needs, no traceback; ``%resmon`` says it again and a ``%%resmon``
    cell still runs."""
    shell = subprocess.run([sys.executable, "-m", "IPython", "--quick", "--colors=NoColor", "--no-banner", "-c", LITE],
                           capture_output=True, text=True, timeout=120)
    lines = shell.stderr.splitlines()
    assert len(lines) == 3 and len(set(lines)) == 1, shell.stderr
    assert re.fullmatch(r"nbmon is not available in this kernel \(emscripten, no threads and /proc or psutil\): "
                        r"it needs threads and .*/proc or psutil.*", lines[0]), lines[0]
    assert "Traceback" not in shell.stdout and shell.stdout.split() == ["cell", "ran", "on", "42"], shell.stdout
