"""Compact one-line live meter for a cell: an anywidget over nbmon/views/js/meter.js.

Its readings are the catalog's metrics with ``meter=True``, one synced float
trait each, named as the catalog names them (units in the names:
``proc_pss_mb`` is MiB). ``fields`` tells the front end, once, each
metric's unit and label and where it goes, so every number is shown by
js/format.js's ``fmt`` in the metric's catalog unit, the same rules the
static summary uses (nbmon/format.py). Unknown readings are None (JSON has
no NaN); the front end shows them as "–". While the container's memory (or,
without a limit, the machine's) is above the warning threshold
(:mod:`nbmon.postmortem.memwarn`), ``memory_alert`` says which ("container" or
"machine") with its percentage and limit, and the meter marks it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anywidget
import traitlets as t

from .. import catalog
from ..postmortem import memwarn
from ..values import known
from . import frontend

STATUSES = ("running", "done", "failed", "interrupted")

# The catalog's meter metrics, in catalog order.
METRICS: tuple[catalog.Metric, ...] = tuple(m for m in catalog.METRICS if m.meter)


@dataclass(frozen=True, slots=True)
class Slot:
    """Where the meter shows a metric. ``group`` is its [data-nbmon-metric]
    (and its bar's [data-nbmon-bar]); ``hook`` the [data-nbmon] of its number
    (None: not shown as a number, e.g. a bar's maximum); ``key`` the group's
    short name; ``bar`` the full scale of the group's bar: a number, or the
    name of the metric whose value is the maximum (None: no bar)."""

    group: str
    hook: str | None = None
    key: str = ""
    bar: float | str | None = None


# The process tree's memory: the one the meter shows as "RAM" against the machine's.
TREE_MEMORY = next(m.name for m in METRICS if m.source == catalog.TREE and m.unit == "MiB")

SLOTS: dict[str, Slot] = {
    # 100 = one core; several cores show a full bar and the number
    "proc_cpu_percent": Slot("cpu", "cpu", "CPU", 100.0),
    TREE_MEMORY: Slot("ram", "ram", "RAM", "sys_mem_total_mb"),
    "sys_mem_total_mb": Slot("ram"),
    "gpu_util_percent": Slot("gpu", "gpu", "GPU", 100.0),
    "gpu_mem_used_mb": Slot("gpu", "gpu-mem"),
}


def _slot(metric: catalog.Metric) -> Slot:
    # A meter metric with no slot above gets a group of its own.
    return SLOTS.get(metric.name) or Slot(metric.name, metric.name, metric.label)


# Sent to the front end once, with the widget; never changes.
FIELDS: tuple[dict[str, Any], ...] = tuple(
    {"name": m.name, "unit": m.unit, "label": m.label, "group": _slot(m).group, "hook": _slot(m).hook,
     "key": _slot(m).key, "bar": _slot(m).bar, "gpu": m.source in (catalog.GPU, catalog.DEVICE)}
    for m in METRICS)

ALERTS = ("", memwarn.CONTAINER, memwarn.MACHINE)
ALERT_FLOATS = ("memory_alert_percent", "memory_alert_limit_mb")
FLOAT_TRAITS = ("elapsed_s", *(m.name for m in METRICS), *ALERT_FLOATS)


class Meter(anywidget.AnyWidget):
    """Live meter for one cell.

    Only scalars change, so each update is a few dozen bytes: ``elapsed_s``
    and one float per catalog meter metric (``proc_cpu_percent``,
    ``proc_pss_mb``, ...), in the catalog's units. ``fields`` (static) says
    how to show them. A finished status ("done", "failed", "interrupted")
    also clears ``running``, so a meter can't keep ticking after its cell ended.
    """

    # js/meter.js with format.js, joined at import (no node needed). A text,
    # not a Path: anywidget would connect every Meter (one per cell) to the
    # file's change signal with a strong reference, never dropped.
    _esm = frontend.module("meter.js")

    label = t.Unicode("").tag(sync=True)
    status = t.Unicode("running").tag(sync=True)
    running = t.Bool(True).tag(sync=True)
    elapsed_s = t.Float(0.0, allow_none=True).tag(sync=True)
    # 0 hides the GPU metrics.
    gpu_count = t.Int(0).tag(sync=True)
    # "" (no warning), "container" or "machine": that memory is above the warning threshold.
    memory_alert = t.Unicode("").tag(sync=True)
    memory_alert_percent = t.Float(None, allow_none=True).tag(sync=True)
    memory_alert_limit_mb = t.Float(None, allow_none=True).tag(sync=True)
    fields = t.List(t.Dict(), default_value=list(FIELDS), read_only=True).tag(sync=True)

    # One trait per catalog meter metric (a None or 0 bar maximum hides that bar).
    for _metric in METRICS:
        vars()[_metric.name] = t.Float(None, allow_none=True).tag(sync=True)
    del _metric

    @t.validate(*FLOAT_TRAITS)
    def _nan_to_none(self, proposal: t.Bunch) -> float | None:
        # NaN/inf would be serialised as invalid JSON and break the comm.
        return known(proposal["value"])

    @t.validate("memory_alert")
    def _known_alert(self, proposal: t.Bunch) -> str:
        if proposal["value"] not in ALERTS:
            raise t.TraitError(f"memory_alert must be one of {ALERTS}, got {proposal['value']!r}")
        return proposal["value"]

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
        Numpy scalars are accepted. Unknown keys (and ``fields``, which is
        fixed) raise KeyError before anything is set; an invalid value raises
        TraitError and leaves the meter as it was.
        """
        unknown = set(values) - set(self.class_trait_names(sync=True))
        unknown |= {k for k in values if k.startswith("_") or k == "fields"}
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
        """elapsed_s, the newest sample's value of each meter metric (None
        where the sample has none: no GPU, a failed source), and the memory
        warning if one lasts."""
        latest = self.monitor.latest()
        watch = memwarn.attached(self.monitor)
        warning = watch.warning if watch is not None else None
        return {"elapsed_s": self.monitor.clock() - self.t0,
                **{m.name: latest.get(m.name) for m in METRICS},
                "memory_alert": warning.kind if warning else "",
                "memory_alert_percent": warning.percent if warning else None,
                "memory_alert_limit_mb": warning.limit_mb if warning else None}

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
