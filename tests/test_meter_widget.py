"""The live meter widget: Python traits, sync behaviour, and the JS test suite."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import anywidget
import numpy as np
import pytest
import traitlets

from helpers import RecordingComm
from nbmon import catalog
from nbmon.views import frontend
from nbmon.views.meter import FIELDS, FLOAT_TRAITS, METRICS, SLOTS, STATUSES, Meter, MeterFeed

REPO = Path(__file__).resolve().parents[1]
JS = REPO / "nbmon" / "views" / "js"

METER_NAMES = ["proc_cpu_percent", "proc_pss_mb", "sys_mem_total_mb", "gpu_util_percent", "gpu_mem_used_mb"]
EXPECTED_TRAITS = {
    "label": traitlets.Unicode,
    "status": traitlets.Unicode,
    "running": traitlets.Bool,
    "elapsed_s": traitlets.Float,
    "gpu_count": traitlets.Int,
    **{name: traitlets.Float for name in METER_NAMES},
    "memory_alert": traitlets.Unicode,
    "memory_alert_percent": traitlets.Float,
    "memory_alert_limit_mb": traitlets.Float,
}
SCALARS = (traitlets.Float, traitlets.Int, traitlets.Unicode, traitlets.Bool)


@pytest.fixture
def recorded():
    meter = Meter(comm=RecordingComm(target_name="jupyter.widget"))
    yield meter, meter.comm
    meter.close()


def test_own_synced_traits_are_the_scalars_and_the_static_fields():
    inherited = set(anywidget.AnyWidget.class_trait_names(sync=True))
    own = set(Meter.class_trait_names(sync=True)) - inherited
    assert own == set(EXPECTED_TRAITS) | {"fields"}
    traits = Meter.class_traits(sync=True)
    for name, kind in EXPECTED_TRAITS.items():
        assert isinstance(traits[name], kind), name
        assert isinstance(traits[name], SCALARS), name
    for name in FLOAT_TRAITS:
        assert traits[name].allow_none, f"{name} must accept None for unknown"
    assert traits["fields"].read_only


def test_readings_are_the_catalogs_meter_metrics():
    assert [m.name for m in METRICS] == [m.name for m in catalog.METRICS if m.meter] == METER_NAMES
    assert FLOAT_TRAITS == ("elapsed_s", *METER_NAMES, "memory_alert_percent", "memory_alert_limit_mb")
    assert set(SLOTS) <= set(METER_NAMES), "a slot for a metric the catalog does not put on the meter"
    for field, metric in zip(FIELDS, METRICS):
        assert (field["name"], field["unit"], field["label"]) == (metric.name, metric.unit, metric.label)
        assert field["gpu"] == (metric.source in (catalog.GPU, catalog.DEVICE))
        bar = field["bar"]
        assert bar is None or isinstance(bar, float) or catalog.BY_NAME[bar].meter, field
    by_hook = {f["hook"]: f["name"] for f in FIELDS if f["hook"]}
    # the DOM hooks tests/test_browser.py and user CSS read
    assert by_hook == {"cpu": "proc_cpu_percent", "ram": "proc_pss_mb", "gpu": "gpu_util_percent",
                       "gpu-mem": "gpu_mem_used_mb"}
    assert {f["group"] for f in FIELDS} == {"cpu", "ram", "gpu"}


def test_js_fixture_is_the_fields_python_sends():
    # nbmon/views/js/test/meter.test.mjs renders the meter with this file as `fields`.
    fixture = json.loads((JS / "test" / "meter_fields.json").read_text(encoding="utf-8"))
    assert fixture == json.loads(json.dumps(list(FIELDS))), "regenerate nbmon/views/js/test/meter_fields.json from FIELDS"


def test_fields_are_sent_once_not_with_updates(recorded):
    meter, comm = recorded
    assert meter.fields == list(FIELDS)
    state = meter.get_state()
    assert state["fields"] == list(FIELDS)
    assert len(json.dumps(state["fields"])) < 1500
    meter.update_from({"proc_cpu_percent": 1.0, "elapsed_s": 0.5})
    assert all("fields" not in u for u in comm.updates())
    with pytest.raises(KeyError, match="fields"):
        meter.update_from({"fields": []})
    with pytest.raises(traitlets.TraitError):
        meter.fields = []


class FakeMonitor:
    gpu_count = 1

    def __init__(self, latest):
        self._latest, self.now = latest, 100.0

    def clock(self):
        return self.now

    def latest(self):
        return dict(self._latest)


def test_feed_values_come_from_the_catalog():
    sample = {"proc_cpu_percent": 12.5, "proc_pss_mb": 1536.0, "sys_mem_total_mb": 6144.0,
              "gpu_util_percent": math.nan, "sys_cpu_percent": 99.0}
    meter = Meter()
    feed = MeterFeed(meter, FakeMonitor(sample), hz=1000.0)
    try:
        feed.monitor.now = 102.5
        values = feed.values()
        assert values == {"elapsed_s": 2.5, "proc_cpu_percent": 12.5, "proc_pss_mb": 1536.0,
                          "sys_mem_total_mb": 6144.0, "gpu_util_percent": values["gpu_util_percent"],
                          "gpu_mem_used_mb": None, "memory_alert": "", "memory_alert_percent": None,
                          "memory_alert_limit_mb": None}
        assert math.isnan(values["gpu_util_percent"])
        assert meter.gpu_count == 1
    finally:
        feed.finish("done")
        meter.close()
    assert feed.errors == 0
    assert (meter.status, meter.running, meter.proc_pss_mb, meter.gpu_util_percent) == ("done", False, 1536.0, None)


def test_esm_is_the_joined_meter_module():
    assert Meter._esm == frontend.module("meter.js")
    meter = Meter()
    try:
        source = meter._esm
        assert source == frontend.module("meter.js")
        assert "export default" in source
        assert not any(line.lstrip().startswith("import ") for line in source.splitlines())
        # anywidget adds _esm/_anywidget_id per instance; they are plain strings too.
        assert isinstance(meter.traits()["_esm"], traitlets.Unicode)
    finally:
        meter.close()


def test_defaults_are_json_safe():
    meter = Meter()
    try:
        state = {k: getattr(meter, k) for k in EXPECTED_TRAITS}
        json.dumps(state, allow_nan=False)
        assert state["status"] == "running"
        assert state["proc_cpu_percent"] is None
        assert state["gpu_count"] == 0
    finally:
        meter.close()


def test_update_from_maps_nan_and_inf_to_none():
    meter = Meter()
    try:
        meter.update_from({"proc_cpu_percent": 12.5, "proc_pss_mb": 100.0, "gpu_mem_used_mb": 3.0})
        meter.update_from({"proc_cpu_percent": math.nan, "proc_pss_mb": np.float64("nan"), "gpu_mem_used_mb": math.inf})
        assert meter.proc_cpu_percent is None
        assert meter.proc_pss_mb is None
        assert meter.gpu_mem_used_mb is None
        meter.update_from({"gpu_util_percent": None, "gpu_count": math.nan})
        assert meter.gpu_util_percent is None
        assert meter.gpu_count == 0
    finally:
        meter.close()


def test_direct_assignment_of_nan_also_becomes_none():
    meter = Meter()
    try:
        meter.proc_cpu_percent = math.nan
        assert meter.proc_cpu_percent is None
        meter.elapsed_s = -math.inf
        assert meter.elapsed_s is None
    finally:
        meter.close()


def test_update_from_accepts_numpy_scalars():
    meter = Meter()
    try:
        meter.update_from(
            {
                "proc_cpu_percent": np.float32(3.5),
                "proc_pss_mb": np.int64(512),
                "gpu_count": np.int64(2),
                "running": np.bool_(False),
            }
        )
        assert meter.proc_cpu_percent == 3.5 and type(meter.proc_cpu_percent) is float
        assert meter.proc_pss_mb == 512.0
        assert meter.gpu_count == 2 and type(meter.gpu_count) is int
        assert meter.running is False
    finally:
        meter.close()


def test_update_from_sends_one_message(recorded):
    meter, comm = recorded
    before = len(comm.updates())
    meter.update_from(
        {
            "label": "cell 7",
            "elapsed_s": 1.5,
            "proc_cpu_percent": math.nan,
            "proc_pss_mb": 1536.0,
            "sys_mem_total_mb": 16384.0,
            "gpu_util_percent": 40.0,
            "gpu_mem_used_mb": 2048.0,
            "gpu_count": 1,
        }
    )
    updates = comm.updates()[before:]
    assert len(updates) == 1, updates
    # proc_cpu_percent was None before and after, so it isn't sent at all.
    assert updates[0] == {
        "label": "cell 7",
        "elapsed_s": 1.5,
        "proc_pss_mb": 1536.0,
        "sys_mem_total_mb": 16384.0,
        "gpu_util_percent": 40.0,
        "gpu_mem_used_mb": 2048.0,
        "gpu_count": 1,
    }
    meter.update_from({"proc_cpu_percent": 50.0, "proc_pss_mb": math.nan})
    assert comm.updates()[-1] == {"proc_cpu_percent": 50.0, "proc_pss_mb": None}
    assert len(comm.updates()) == before + 2


def test_updates_are_tens_of_bytes(recorded):
    meter, comm = recorded
    meter.update_from({"elapsed_s": 0.25, **{name: 1.0 for name in METER_NAMES}, "gpu_count": 1})
    meter.update_from({"elapsed_s": 0.5, "proc_cpu_percent": 97.8125, "proc_pss_mb": 1537.25})
    sizes = [len(json.dumps(u)) for u in comm.updates()]
    assert sizes[-1] < 100 and max(sizes) < 250, sizes


def test_separate_assignments_send_separate_messages(recorded):
    # Guards the test above: the recording comm does see every update.
    meter, comm = recorded
    before = len(comm.updates())
    meter.proc_cpu_percent = 1.0
    meter.proc_pss_mb = 2.0
    assert len(comm.updates()) == before + 2


def test_finished_status_stops_running_in_the_same_message(recorded):
    meter, comm = recorded
    assert meter.running is True
    before = len(comm.updates())
    meter.update_from({"status": "failed", "elapsed_s": 3.0})
    assert meter.running is False
    updates = comm.updates()[before:]
    assert updates == [{"status": "failed", "elapsed_s": 3.0, "running": False}]


@pytest.mark.parametrize("status", STATUSES)
def test_every_documented_status_is_accepted(status):
    meter = Meter()
    try:
        meter.update_from({"status": status})
        assert meter.status == status
        assert meter.running is (status == "running")
    finally:
        meter.close()


def test_invalid_update_raises_and_changes_nothing(recorded):
    meter, comm = recorded
    meter.update_from({"proc_cpu_percent": 10.0, "status": "running"})
    before = len(comm.updates())
    with pytest.raises(traitlets.TraitError):
        meter.update_from({"proc_cpu_percent": 20.0, "status": "exploded"})
    with pytest.raises(traitlets.TraitError):
        meter.update_from({"proc_cpu_percent": 30.0, "proc_pss_mb": "lots"})
    assert meter.proc_cpu_percent == 10.0
    assert meter.status == "running"
    assert len(comm.updates()) == before


def test_unknown_or_private_keys_are_rejected():
    meter = Meter()
    try:
        with pytest.raises(KeyError, match="cpu"):
            meter.update_from({"cpu": 1.0, "proc_pss_mb": 5.0})
        with pytest.raises(KeyError):
            meter.update_from({"_esm": "export default {}"})
        assert meter.proc_pss_mb is None
    finally:
        meter.close()


def test_import_stays_light():
    # Measured past whatever nbmon/__init__ imports: that is not this module's cost.
    code = (
        "import sys, nbmon\n"
        "before = set(sys.modules)\n"
        "import nbmon.views.meter\n"
        "heavy = [m for m in ('numpy', 'pandas', 'plotly', 'psutil', 'pynvml') if m in set(sys.modules) - before]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import nbmon.views.meter pulled in {out.stdout.strip()}"


def test_js_suite_passes():
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH; the front end's JS tests (nbmon/views/js/test/) need Node.js >= 20")
    # Files listed explicitly: Node 20 takes a directory, Node 21+ wants globs.
    tests = sorted(str(p.relative_to(JS)) for p in (JS / "test").glob("*.test.mjs"))
    assert tests, "no JS tests found"
    proc = subprocess.run([node, "--test", *tests], cwd=JS, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
