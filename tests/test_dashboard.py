"""The live dashboard and the cell records without a browser: what goes on
the wire (only new points, nothing when nothing changes, no plotly bundle in
widget state), the chart's rows, records whose figures agree, prompt numbers
and tracebacks of %%resmon cells, and headless nbconvert runs."""

from __future__ import annotations

import json
import re

import nbformat
import numpy as np
import pytest
from comm.base_comm import BaseComm
from IPython.utils.capture import capture_output
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

import nbmon
import nbmon.notebook.magics
from browser_util import row, summary_rows
from helpers import burn_cpu, wait_until
from nbmon.monitor import Monitor
from nbmon.notebook import charts
from nbmon.notebook.dashboard import Dashboard, record_html
from nbmon.notebook.session import SESSION

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class Wire(BaseComm):
    """A comm that keeps what the widget would send: (msg_type, data, buffers)."""

    def __init__(self, **kwargs):
        self.sent = []
        super().__init__(**kwargs)

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        self.sent.append((msg_type, json.loads(json.dumps(data)), [bytes(b) for b in buffers or ()]))

    def customs(self, kind: str):
        return [(d["content"], b) for t, d, b in self.sent
                if t == "comm_msg" and d.get("method") == "custom" and d["content"].get("type") == kind]


@pytest.fixture
def stopped():
    """A stopped monitor of this process with a few samples: its store only
    changes when the test appends."""
    monitor = Monitor(interval=0.02, gpu=False).start()
    wait_until(lambda: monitor.store.seq >= 3, timeout=10, what="three samples")
    monitor.stop()
    return monitor


def append(store, n: int, step: float = 0.02, **values) -> None:
    last = store.latest()
    row_ = np.array([values.get(c, last[c]) for c in store.columns], dtype=float)
    for k in range(1, n + 1):
        store.append(last["t"] + k * step, last["wall"] + k * step, row_)


@pytest.fixture
def dashboard(stopped):
    d = Dashboard(stopped, start=False)
    d.widget.comm = Wire(target_name="jupyter.widget")
    d.widget.comm.sent.clear()   # its own comm_open
    yield d
    d.close()


# -- the wire -------------------------------------------------------------------------


def test_a_frame_carries_only_the_new_samples(dashboard, stopped):
    wire = dashboard.widget.comm
    held = len(dashboard.widget.data[0].x)
    assert held == stopped.store.seq                     # the first state: what the store held
    assert not dashboard.refresh()                       # nothing new: nothing sent
    assert wire.sent == []
    append(stopped.store, 5, proc_cpu_percent=42.0, proc_rss_mb=1536.0)
    assert dashboard.refresh()
    (content, buffers), = wire.customs("nbmon:append")
    x, *ys = buffers
    assert len(x) == 5 * 8 and all(len(y) == 5 * 4 for y in ys)   # float64 x, float32 y: 5 points each
    assert len(ys) == len(dashboard.columns)
    cpu = np.frombuffer(ys[dashboard.columns.index("proc_cpu_percent")], dtype=np.float32)
    assert cpu.tolist() == [42.0] * 5
    assert np.all(np.diff(np.frombuffer(x, dtype=np.float64)) > 0)
    assert content["title"] == "CPU 42.0 % · RSS 1.5 GiB"
    # plotly's own traits are not resent: no state update, whole arrays or not
    assert [t for t, d, _ in wire.sent if d.get("method") == "update"] == []
    assert not dashboard.refresh() and dashboard.skipped == 2


def test_widget_state_holds_no_plotly_bundle_and_sends_it_on_request(dashboard):
    state = dashboard.widget.get_state()
    assert len(state["_esm"]) < 100_000                 # nbmon's loader, not plotly's 5 MB bundle
    assert len(json.dumps({k: v for k, v in state.items() if not isinstance(v, (bytes, memoryview))},
                          default=str)) < 200_000
    assert state["_nbmon"]["id"] == dashboard.live_id
    dashboard.widget._handle_custom_msg({"type": "nbmon:bundle"}, [])
    (_content, (bundle,)), = dashboard.widget.comm.customs("nbmon:bundle")
    assert len(bundle) > 1_000_000 and b"as FigureView" in bundle


def test_record_carries_the_live_id_and_no_widget(dashboard):
    data = dashboard._repr_mimebundle_()
    assert WIDGET_MIME not in data
    assert f'data-nbmon-live="{dashboard.live_id}"' in data["text/html"]
    assert "nbmon-live-static" in data["text/html"] and "<script" not in data["text/html"]


# -- the chart's rows --------------------------------------------------------------------


class Limit:
    """An extra source with the container's memory limit, as the cgroup source will give it."""

    fields = ("cgroup_mem_limit_mb",)

    def start(self, now):
        pass

    def sample(self, now):
        return {"cgroup_mem_limit_mb": 4096.0}

    def close(self):
        pass


def test_kernel_traces_on_top_machine_bands_beneath_and_the_limit_line():
    monitor = Monitor(interval=0.02, gpu=False, extra_sources=[Limit()]).start()
    wait_until(lambda: monitor.store.seq >= 2, timeout=10, what="two samples")
    monitor.stop()
    d = Dashboard(monitor, start=False)
    try:
        traces = {t.meta: t for t in d.widget.data}
        layout = d.widget.layout
        limit = traces["cgroup_mem_limit_mb"]
        assert limit.line.dash == "dash" and limit.line.color == charts.LIMIT_COLOR
        assert limit.name == "memory limit, container"
        assert set(limit.y.tolist()) == {4096.0}
        # the limit shares the kernel's RSS axis; machine memory is a band on its own axis
        assert limit.yaxis == traces["proc_rss_mb"].yaxis != traces["sys_mem_used_mb"].yaxis
        assert traces["sys_mem_used_mb"].fill == "tozeroy" and traces["proc_rss_mb"].fill is None
        assert traces["sys_cpu_percent"].yaxis != traces["proc_cpu_percent"].yaxis
        # drawn order: bands first, the kernel's own last (on top); its axis on the left
        order = [t.meta for t in d.widget.data]
        assert order.index("sys_cpu_percent") < order.index("proc_cpu_percent")
        kernel_axis = layout[traces["proc_cpu_percent"].yaxis.replace("y", "yaxis")]
        machine_axis = layout[traces["sys_cpu_percent"].yaxis.replace("y", "yaxis")]
        assert kernel_axis.side == "left" and machine_axis.side == "right"
        assert tuple(machine_axis.range) == (0.0, 100.0)      # 100 = every CPU
        assert layout.height == 110 + sum(r.px for r in charts.ROWS[:2])
        assert layout.width is None and layout.autosize      # fills the output area
    finally:
        d.close()


# -- records: the same window gives the same figures -----------------------------------


def legend_peaks(html: str) -> dict[str, str]:
    return dict(re.findall(r"</tspan> (\w+(?: \w+)?) peak ([^<]+?)  ", html))


def test_cell_record_table_and_timeline_give_the_same_figures(ip):
    burn = "import time\nt0 = time.process_time()\nwhile time.process_time() - t0 < 0.4:\n    pass"
    with capture_output():
        ip.run_cell_magic("resmon", "--interval 0.02", "rm_x = 1")   # a busy cell before: its CPU is not this one's
    with capture_output() as cap:
        ip.run_cell_magic("resmon", "--interval 0.02 --label spin", burn)
    html = cap.outputs[-1].data["text/html"]
    table, legend = summary_rows(html), legend_peaks(html)
    assert legend["CPU"] == row(table, "CPU mean / peak").split(" / ")[1]
    assert legend["RSS"] == row(table, "Peak RSS")
    # the timeline has a time scale from 0 to the cell's duration
    assert re.search(r'class="nbmon-timeline-scale".*>0\.00 s<', html)


def test_live_record_table_and_timeline_give_the_same_figures(stopped):
    html = record_html(stopped)
    table, legend = summary_rows(html), legend_peaks(html)
    assert legend["CPU"] == row(table, "CPU mean / peak").split(" / ")[1]
    assert legend["RSS"] == row(table, "Peak RSS")


# -- %resmon ----------------------------------------------------------------------------


def test_resmon_shows_its_record_at_once_and_marks_cells(ip):
    with capture_output() as cap:
        ip.run_line_magic("resmon", "--interval 0.05")
    (first,) = cap.outputs
    assert WIDGET_MIME not in first.data and "nbmon-live-record" in first.data["text/html"]
    magics = nbmon.notebook.magics._loaded[id(ip)]
    (dashboard, _), = magics.dashboards
    wait_until(lambda: dashboard.widget is not None, timeout=60, what="the widget")
    number = ip.execution_count
    with capture_output():
        ip.run_cell("rm_y = sum(range(10**5))")
    (cell,) = dashboard.cells
    assert cell["n"] == number and cell["label"] == "rm_y = sum(range(10**5))" and cell["t1"] > cell["t0"]
    with capture_output() as cap:
        ip.run_line_magic("resmon", "stop")
    final = [o for o in cap.outputs if o.update]
    assert len(final) == 1 and "stopped" in final[0].data["text/html"]


# -- %%resmon: prompt numbers and tracebacks ---------------------------------------------


def test_history_and_traceback_use_the_prompt_number_and_the_users_code(ip):
    number = ip.execution_count
    with capture_output() as cap:
        result = ip.run_cell("%%resmon --label boom\nrm_a = 1\nrm_a / 0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert nbmon.history().iloc[-1]["execution_count"] == number
    text = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
    assert f"Cell In[{number}], line 3" in text and "----> 3 rm_a / 0" in text
    assert "run_cell_magic" not in text and "magics.py" not in text, text
    assert len(text.strip().splitlines()) < 12, text


# -- item 8 ---------------------------------------------------------------------------------


def test_history_has_no_gpu_columns_without_gpu_figures(ip):
    with capture_output():
        ip.run_cell_magic("resmon", "--no-gpu", "rm_b = 1")
    assert not [c for c in nbmon.history().columns if "gpu" in c]


def test_auto_mode_keeps_no_row_for_a_cell_below_the_threshold(ip):
    with capture_output():
        ip.run_line_magic("resmon", "auto on --threshold 5")
        before = len(nbmon.history())
        ip.run_cell("rm_c = 1")
        ip.run_line_magic("resmon", "auto off")
    assert len(nbmon.history()) == before
    assert SESSION.last is None or SESSION.last.duration_sec >= 5 or before == len(SESSION.records)


# -- headless runs -------------------------------------------------------------------------


def test_headless_nbconvert_keeps_small_widget_state(tmp_path):
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}},
                      cells=[new_code_cell(c) for c in ("%load_ext nbmon", "%resmon --interval 0.05",
                                                        "import time; time.sleep(3)", "%resmon stop")])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "run.ipynb"
    nbformat.write(nb, path)
    assert path.stat().st_size < 300_000, path.stat().st_size    # was 5.1 MB of plotly.js
    (record,) = [o["data"]["text/html"] for o in nb.cells[1].outputs if "text/html" in o.get("data", {})]
    assert "stopped" in record and "<polyline" in record
    assert not [o for c in nb.cells for o in c.outputs if WIDGET_MIME in o.get("data", {})]
