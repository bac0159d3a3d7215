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
from comm.base_comm import BaseComm

from nbmon.notebook.meter import FLOAT_TRAITS, STATUSES, Meter

REPO = Path(__file__).resolve().parents[1]

EXPECTED_TRAITS = {
    "label": traitlets.Unicode,
    "status": traitlets.Unicode,
    "running": traitlets.Bool,
    "elapsed_s": traitlets.Float,
    "cpu_percent": traitlets.Float,
    "rss_mb": traitlets.Float,
    "ram_total_mb": traitlets.Float,
    "gpu_util_percent": traitlets.Float,
    "gpu_mem_mb": traitlets.Float,
    "gpu_count": traitlets.Int,
}
SCALARS = (traitlets.Float, traitlets.Int, traitlets.Unicode, traitlets.Bool)


class RecordingComm(BaseComm):
    """A comm that keeps what it would publish, standing in for the kernel."""

    def __init__(self, **kwargs):
        self.published = []
        super().__init__(**kwargs)

    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        # Through JSON, as the kernel would send it: NaN must not survive.
        self.published.append((msg_type, json.loads(json.dumps(data, allow_nan=False))))

    def updates(self):
        return [data["state"] for kind, data in self.published if kind == "comm_msg" and data["method"] == "update"]


@pytest.fixture
def recorded():
    meter = Meter(comm=RecordingComm(target_name="jupyter.widget"))
    yield meter, meter.comm
    meter.close()


def test_own_synced_traits_are_exactly_the_scalars():
    inherited = set(anywidget.AnyWidget.class_trait_names(sync=True))
    own = set(Meter.class_trait_names(sync=True)) - inherited
    assert own == set(EXPECTED_TRAITS)
    traits = Meter.class_traits(sync=True)
    for name, kind in EXPECTED_TRAITS.items():
        assert isinstance(traits[name], kind), name
        assert isinstance(traits[name], SCALARS), name
    for name in FLOAT_TRAITS:
        assert traits[name].allow_none, f"{name} must accept None for unknown"


def test_esm_is_the_built_single_file_module():
    path = REPO / "nbmon" / "notebook" / "static" / "meter.js"
    assert path.is_file(), "run `node js/build.mjs`"
    # anywidget turns the Path into a FileContents whose str() is the file text.
    assert str(Meter._esm) == path.read_text(encoding="utf-8")
    meter = Meter()
    try:
        source = meter._esm
        assert source == path.read_text(encoding="utf-8")
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
        assert state["cpu_percent"] is None
        assert state["gpu_count"] == 0
    finally:
        meter.close()


def test_update_from_maps_nan_and_inf_to_none():
    meter = Meter()
    try:
        meter.update_from({"cpu_percent": 12.5, "rss_mb": 100.0, "gpu_mem_mb": 3.0})
        meter.update_from({"cpu_percent": math.nan, "rss_mb": np.float64("nan"), "gpu_mem_mb": math.inf})
        assert meter.cpu_percent is None
        assert meter.rss_mb is None
        assert meter.gpu_mem_mb is None
        meter.update_from({"gpu_util_percent": None, "gpu_count": math.nan})
        assert meter.gpu_util_percent is None
        assert meter.gpu_count == 0
    finally:
        meter.close()


def test_direct_assignment_of_nan_also_becomes_none():
    meter = Meter()
    try:
        meter.cpu_percent = math.nan
        assert meter.cpu_percent is None
        meter.elapsed_s = -math.inf
        assert meter.elapsed_s is None
    finally:
        meter.close()


def test_update_from_accepts_numpy_scalars():
    meter = Meter()
    try:
        meter.update_from(
            {
                "cpu_percent": np.float32(3.5),
                "rss_mb": np.int64(512),
                "gpu_count": np.int64(2),
                "running": np.bool_(False),
            }
        )
        assert meter.cpu_percent == 3.5 and type(meter.cpu_percent) is float
        assert meter.rss_mb == 512.0
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
            "cpu_percent": math.nan,
            "rss_mb": 1536.0,
            "ram_total_mb": 16384.0,
            "gpu_util_percent": 40.0,
            "gpu_mem_mb": 2048.0,
            "gpu_count": 1,
        }
    )
    updates = comm.updates()[before:]
    assert len(updates) == 1, updates
    # cpu_percent was None before and after, so it isn't sent at all.
    assert updates[0] == {
        "label": "cell 7",
        "elapsed_s": 1.5,
        "rss_mb": 1536.0,
        "ram_total_mb": 16384.0,
        "gpu_util_percent": 40.0,
        "gpu_mem_mb": 2048.0,
        "gpu_count": 1,
    }
    meter.update_from({"cpu_percent": 50.0, "rss_mb": math.nan})
    assert comm.updates()[-1] == {"cpu_percent": 50.0, "rss_mb": None}
    assert len(comm.updates()) == before + 2


def test_separate_assignments_send_separate_messages(recorded):
    # Guards the test above: the recording comm does see every update.
    meter, comm = recorded
    before = len(comm.updates())
    meter.cpu_percent = 1.0
    meter.rss_mb = 2.0
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
    meter.update_from({"cpu_percent": 10.0, "status": "running"})
    before = len(comm.updates())
    with pytest.raises(traitlets.TraitError):
        meter.update_from({"cpu_percent": 20.0, "status": "exploded"})
    with pytest.raises(traitlets.TraitError):
        meter.update_from({"cpu_percent": 30.0, "rss_mb": "lots"})
    assert meter.cpu_percent == 10.0
    assert meter.status == "running"
    assert len(comm.updates()) == before


def test_unknown_or_private_keys_are_rejected():
    meter = Meter()
    try:
        with pytest.raises(KeyError, match="cpu"):
            meter.update_from({"cpu": 1.0, "rss_mb": 5.0})
        with pytest.raises(KeyError):
            meter.update_from({"_esm": "export default {}"})
        assert meter.rss_mb is None
    finally:
        meter.close()


def test_import_stays_light():
    # Measured past whatever nbmon/__init__ imports: that is not this module's cost.
    code = (
        "import sys, nbmon\n"
        "before = set(sys.modules)\n"
        "import nbmon.notebook.meter\n"
        "heavy = [m for m in ('numpy', 'pandas', 'plotly', 'psutil', 'pynvml') if m in set(sys.modules) - before]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import nbmon.notebook.meter pulled in {out.stdout.strip()}"


def test_js_suite_passes():
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH; the meter's JS tests (node --test js/test/) need Node.js >= 20")
    # Files listed explicitly: Node 20 takes a directory, Node 21+ wants globs.
    tests = sorted(str(p.relative_to(REPO)) for p in (REPO / "js" / "test").glob("*.test.mjs"))
    assert tests, "no JS tests found"
    proc = subprocess.run([node, "--test", *tests], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
