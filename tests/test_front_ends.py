"""The live chart where a front end cannot run here (issue 33): what a real
kernel sends under Colab's detection. Colab renders each output in a frame
of its own, and its widget manager makes a model only for a widget-view
output (colabtools google/colab/output/_widgets.py), so the chart is an
output of its own there, empty again once it stops."""
from __future__ import annotations

import subprocess
import time

import pytest
from jupyter_client.manager import start_new_kernel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
COLAB = 'import sys, types\nsys.modules["google.colab"] = types.ModuleType("google.colab")'
WAIT_S = 3.0   # the helper builds the chart and sends a few frames
ASKS_PER_MODEL = 5
ANSWERS_WITHIN_S = 60.0


class Kernel:
    """A real kernel; every iopub message of its cells, whichever cell the
    kernel said it came from (the helper's updates arrive between cells)."""

    def __init__(self):
        self.km, self.kc = start_new_kernel(kernel_name="python3", stderr=subprocess.DEVNULL)
        self.messages: list[dict] = []

    def run(self, code: str) -> None:
        msg_id = self.kc.execute(code)
        while True:
            msg = self.kc.get_iopub_msg(timeout=120)
            self.messages.append(msg)
            if msg["msg_type"] == "error":
                raise AssertionError(msg["content"])
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"):
                return

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def displays(self) -> dict[str, list[dict]]:
        """Each display id's data, in the order sent (its display, then its updates)."""
        out: dict[str, list[dict]] = {}
        for msg in self.messages:
            if msg["msg_type"] in ("display_data", "update_display_data"):
                display_id = msg["content"].get("transient", {}).get("display_id")
                if display_id:
                    out.setdefault(display_id, []).append(msg["content"]["data"])
        return out

    def widget_models(self) -> set[str]:
        """The comms opened for the live chart's model (its state has _nbmon with streams)."""
        return {msg["content"]["comm_id"] for msg in self.messages if msg["msg_type"] == "comm_open"
                and "streams" in (msg["content"]["data"].get("state", {}).get("_nbmon") or {})}


@pytest.mark.parametrize("colab", [True, False], ids=["colab", "jupyterlab"])
def test_under_colab_the_chart_is_a_widget_view_output_until_it_stops(colab):
    kernel = Kernel()
    try:
        kernel.run(COLAB if colab else "pass")
        kernel.run("%load_ext nbmon")
        kernel.run("%resmon")
        kernel.run(f"import time; time.sleep({WAIT_S})")
        live = kernel.displays()
        kernel.run("%resmon stop")
        final = kernel.displays()
    finally:
        kernel.close()
    models = kernel.widget_models()
    assert len(models) == 1, models
    views = {i: [d for d in data if WIDGET_VIEW in d] for i, data in live.items()}
    shown = [i for i, v in views.items() if v]
    if not colab:   # the record alone: the page's widget manager makes the model from its comm
        assert shown == [], live
        return
    (chart,) = shown
    first, *_ = live[chart]
    assert first == {"text/plain": ""}, first   # empty until the model exists in the kernel
    assert [v[WIDGET_VIEW]["model_id"] for v in views[chart]] == list(models), views[chart]
    # The record's table and picture are there beside it, and stay after the stop; the chart's output empties.
    assert any("nbmon-live-record" in d.get("text/html", "") for data in final.values() for d in data)
    assert final[chart][-1] == {"text/plain": ""}, final[chart]


def test_each_state_the_page_asks_for_answers_its_own_request():
    """A page that joins after the cells ran (Voila) asks every model's state
    at once and waits for each answer by its request's id. The helper's
    widgets answer through the kernel: each answer's parent is the request
    it answers, not whichever message the kernel's shell handled last (with
    that, one model waited for good and Voila showed no chart)."""
    kernel = Kernel()
    try:
        kernel.run("%load_ext nbmon")
        kernel.run("%resmon")
        kernel.run(f"import time; time.sleep({WAIT_S})")
        closed = {m["content"]["comm_id"] for m in kernel.messages if m["msg_type"] == "comm_close"}
        models = [m["content"]["comm_id"] for m in kernel.messages if m["msg_type"] == "comm_open"
                  and m["content"].get("target_name") == "jupyter.widget" and m["content"]["comm_id"] not in closed]
        asked = {}
        for _ in range(ASKS_PER_MODEL):   # all sent before the first answer can come (Voila asks each once)
            for comm_id in models:
                msg = kernel.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "request_state"}})
                kernel.kc.shell_channel.send(msg)
                asked[msg["header"]["msg_id"]] = comm_id
        answers, deadline = [], time.monotonic() + ANSWERS_WITHIN_S
        while len(answers) < len(asked) and time.monotonic() < deadline:
            msg = kernel.kc.get_iopub_msg(timeout=60)
            if msg["msg_type"] == "comm_msg" and msg["content"]["data"].get("method") == "update" \
                    and "state" in msg["content"]["data"] and msg["content"]["comm_id"] in models:
                answers.append((msg["parent_header"].get("msg_id"), msg["content"]["comm_id"]))
        kernel.run("%resmon stop")
    finally:
        kernel.close()
    assert models, "no widget model"
    assert sorted(answers) == sorted(asked.items())
