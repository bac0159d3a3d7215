"""Compact one-line live meter for a cell: an anywidget over nbmon/notebook/static/meter.js.
Unknown readings are None (JSON has no NaN); the front end shows them as "–"."""

from __future__ import annotations

import math
import numbers
import pathlib
from collections.abc import Mapping
from typing import Any

import anywidget
import traitlets as t

from ..values import known

STATUSES = ("running", "done", "failed", "interrupted")

FLOAT_TRAITS = (
    "elapsed_s",
    "cpu_percent",
    "rss_mb",
    "ram_total_mb",
    "gpu_util_percent",
    "gpu_mem_mb",
)


class Meter(anywidget.AnyWidget):
    """Live meter for one cell.

    Only scalars are synced, so each update is a few dozen bytes. Memory is in
    MiB, CPU and GPU utilisation in percent (CPU may exceed 100 on several
    cores). A finished status ("done", "failed", "interrupted") also clears
    ``running``, so a meter can't keep ticking after its cell ended.
    """

    # Built by js/build.mjs; shipped in the wheel so users need no node. The
    # text, not the Path: anywidget would connect every Meter (one per cell)
    # to the file's change signal with a strong reference, never dropped.
    _esm = (pathlib.Path(__file__).parent / "static" / "meter.js").read_text(encoding="utf-8")

    label = t.Unicode("").tag(sync=True)
    status = t.Unicode("running").tag(sync=True)
    running = t.Bool(True).tag(sync=True)
    elapsed_s = t.Float(0.0, allow_none=True).tag(sync=True)
    cpu_percent = t.Float(None, allow_none=True).tag(sync=True)
    rss_mb = t.Float(None, allow_none=True).tag(sync=True)
    # 0 or None: total unknown, the RAM bar is hidden and only the number shown.
    ram_total_mb = t.Float(None, allow_none=True).tag(sync=True)
    gpu_util_percent = t.Float(None, allow_none=True).tag(sync=True)
    gpu_mem_mb = t.Float(None, allow_none=True).tag(sync=True)
    # 0 hides the GPU part of the meter.
    gpu_count = t.Int(0).tag(sync=True)

    @t.validate(*FLOAT_TRAITS)
    def _nan_to_none(self, proposal: t.Bunch) -> float | None:
        # NaN/inf would be serialised as invalid JSON and break the comm.
        return known(proposal["value"])

    @t.validate("status")
    def _known_status(self, proposal: t.Bunch) -> str:
        if proposal["value"] not in STATUSES:
            raise t.TraitError(f"status must be one of {STATUSES}, got {proposal['value']!r}")
        return proposal["value"]

    @t.observe("status")
    def _finished_stops_running(self, change: t.Bunch) -> None:
        if change["new"] != "running":
            self.running = False

    def update_from(self, values: Mapping[str, Any]) -> None:
        """Set several traits at once, sent to the front end as one message.

        Keys are trait names; NaN, inf and None become None (gpu_count: 0).
        Numpy scalars are accepted. Unknown keys raise KeyError before anything
        is set; an invalid value raises TraitError and leaves the meter as it was.
        """
        unknown = set(values) - set(self.class_trait_names(sync=True))
        unknown |= {k for k in values if k.startswith("_")}
        if unknown:
            raise KeyError(f"Meter has no trait(s) {sorted(unknown)}")
        coerced: dict[str, Any] = {}
        for name, value in values.items():
            # Anything not coerced here is left for the trait to reject.
            if name in FLOAT_TRAITS and isinstance(value, numbers.Real):
                value = known(value)
            elif name == "gpu_count":
                if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
                    value = 0
                elif isinstance(value, numbers.Real) and float(value).is_integer():
                    value = int(value)
            elif name == "running" and not isinstance(value, str):
                value = bool(value)
            coerced[name] = value
        # hold_trait_notifications rolls every trait back if one fails validation.
        with self.hold_sync(), self.hold_trait_notifications():
            for name, value in coerced.items():
                setattr(self, name, value)


class MeterFeed:
    """Feeds a Meter from a monitor's newest sample a few times a second, from
    a thread named ``nbmon-meter`` that only sets traits (widgets are made and
    displayed on the main thread by the caller)."""

    def __init__(self, meter: Meter, monitor, hz: float = 4.0):
        import threading

        self.meter = meter
        self.monitor = monitor
        self.period = 1.0 / hz
        self.t0 = monitor.clock()
        self.errors = 0
        self._stop = threading.Event()
        meter.gpu_count = monitor.gpu_count
        self._thread = threading.Thread(target=self._run, name="nbmon-meter", daemon=True)
        self._thread.start()

    def values(self) -> dict[str, Any]:
        latest = self.monitor.latest()
        return {
            "elapsed_s": self.monitor.clock() - self.t0,
            "cpu_percent": latest.get("proc_cpu_percent"),
            "rss_mb": latest.get("proc_rss_mb"),
            "ram_total_mb": latest.get("sys_mem_total_mb"),
            "gpu_util_percent": latest.get("gpu_util_percent"),
            "gpu_mem_mb": latest.get("gpu_mem_used_mb"),
        }

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.meter.update_from(self.values())
            except Exception:  # a closed comm must not end in a traceback on stderr
                self.errors += 1

    def finish(self, status: str) -> None:
        """Stop the thread (bounded) and show the final values with ``status``."""
        self._stop.set()
        self._thread.join(self.period + 0.1)
        self.meter.update_from({**self.values(), "status": status})
