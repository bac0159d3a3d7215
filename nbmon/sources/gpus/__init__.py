"""GPUs, whoever made them: one source over every vendor's devices.

What is the same for every vendor lives here: the catalog's totals over the
devices (``gpu_mem_used_mb`` is their sum, ``gpu_util_percent`` their
mean), one column per device and metric (``gpu<i>_<metric>``), which
devices a process may use (a visible-devices variable, the CUDA rule), and
query failures turned into faults the user sees. A vendor is a module
(NVIDIA: :mod:`.nvml`; a third party's: an entry point in ``nbmon.gpus``,
:data:`VENDORS`), with:

- ``NAME`` (for humans), ``VISIBLE`` (its visible-devices variable),
  ``IMPORTS`` (the modules it imports when asked, which nbmon's helper
  processes must find);
- ``discover() -> (count, why)``: initialise; how many devices, or why none;
- ``uuid(index) -> str`` and ``device(index)``: a device, with ``index``,
  ``lost``, ``read(pids) -> {DEVICE metric: float}`` (NaN where unknown),
  ``drain_errors() -> list[str]``;
- ``status() -> str``: 'ok', or why its devices are off.

Devices keep their vendor's numbering (nvidia-smi's for NVIDIA, the same
in every process of a host); a second vendor's devices are numbered after
the first's.
"""
from __future__ import annotations

import os

from ... import catalog
from . import nvml
from ...values import NAN

VENDORS = (nvml, *catalog.plugins(catalog.GPUS_GROUP))


def imports() -> tuple[str, ...]:
    """What every vendor imports (``IMPORTS``)."""
    return tuple(name for vendor in VENDORS for name in getattr(vendor, "IMPORTS", ()))


def visible_indices(count: int, uuid, spec: str | None) -> list[int]:
    """The indices of the devices a visible-devices variable (``spec``, e.g.
    ``CUDA_VISIBLE_DEVICES``) lets a process use: every device when unset;
    otherwise its entries in order, each an index or a (prefix of a) UUID
    (``uuid(index)``), and -- CUDA's rule -- the list ends at the first
    entry that names no device (so "" is none). MIG instances (``MIG-...``)
    are not resolved: every device is kept."""
    entries = None if spec is None else [e.strip() for e in spec.split(",")]
    if entries is None or any(e.startswith("MIG-") for e in entries):
        return list(range(count))
    uuids: list[str] | None = None
    out: list[int] = []
    for entry in entries:
        if entry.isdigit():
            index = int(entry) if int(entry) < count else None
        else:
            if uuids is None:
                uuids = [uuid(i) for i in range(count)]
            named = [i for i, u in enumerate(uuids)
                     if entry and (u.startswith(entry) or u.startswith("GPU-" + entry))]
            index = named[0] if len(named) == 1 else None
        if index is None or index in out:
            break
        out.append(index)
    return out


def device_count() -> int:
    """How many devices the vendors report (0 where none is usable)."""
    return sum(vendor.discover()[0] for vendor in VENDORS)


class GPUs:
    """Per-device and total figures of the GPUs this process may use, plus
    the GPU memory of the processes ``tree_pids()`` returns (pids as the
    driver sees them: inside a container with its own pid namespace they
    do not match, and the tree's GPU memory reads 0)."""

    name = "gpu"

    def __init__(self, tree_pids=lambda: ()):
        self.tree_pids = tree_pids
        self.devices: list = []
        self.columns: list[int] = []   # each device's column number
        self.count = 0                 # devices of the last start(), still known after close()
        self.fields: tuple[str, ...] = ()
        self.notes: list[str] = []
        self._totals = [m for m in catalog.METRICS if m.source == catalog.GPU]

    @property
    def state(self) -> str:
        """'ok' or why there are no GPU figures, including a device lost mid-run."""
        lost = [str(c) for d, c in zip(self.devices, self.columns) if d.lost]
        if lost:
            return f"GPU {', '.join(lost)} lost"
        if self.notes or self.devices:
            return "; ".join(self.notes) or "ok"
        return "; ".join(vendor.status() for vendor in VENDORS)

    def start(self, now: float) -> None:
        self.devices, self.columns, self.notes = [], [], []
        base = 0
        for vendor in VENDORS:
            count, why = vendor.discover()
            if not count:
                continue
            spec = os.environ.get(vendor.VISIBLE)
            indices = visible_indices(count, vendor.uuid, spec)
            if not indices:
                self.notes.append(f"no GPU visible to this process ({vendor.VISIBLE}={spec!r})")
            for index in indices:
                try:
                    self.devices.append(vendor.device(index))
                    self.columns.append(base + index)
                except OSError as err:
                    self.notes.append(f"GPU {base + index}: {err}")
            base += count
        self.count = len(self.devices)
        self.fields = () if not self.devices else tuple(m.name for m in self._totals) + tuple(
            catalog.device_column(column, name) for column in self.columns for name in catalog.names(catalog.DEVICE))

    def sample(self, now: float) -> dict[str, float]:
        if not self.devices:
            return {}
        pids = frozenset(self.tree_pids())
        unknown = dict.fromkeys(catalog.names(catalog.DEVICE), NAN)   # what a vendor does not read
        per_device = [{**unknown, **d.read(pids)} for d in self.devices]
        out = {}
        for total in self._totals:
            known = [v[total.of] for v in per_device if v[total.of] == v[total.of]]
            out[total.name] = (sum(known) / (len(known) if total.total == "mean" else 1)) if known else NAN
        for column, values in zip(self.columns, per_device):
            for name, value in values.items():
                out[catalog.device_column(column, name)] = value
        return out

    def drain_faults(self) -> list[str]:
        """Queries that failed since the last call (not NotSupported: that
        field is simply unknown), in words; the sampler counts them."""
        return [f"GPU {column}: {error}" for device, column in zip(self.devices, self.columns)
                for error in device.drain_errors()]

    def close(self) -> None:
        # Keep saying which GPU was lost once the run is over (state reads devices).
        lost = [str(c) for d, c in zip(self.devices, self.columns) if d.lost]
        if lost:
            self.notes = [f"GPU {', '.join(lost)} lost"]
        self.devices, self.columns = [], []
