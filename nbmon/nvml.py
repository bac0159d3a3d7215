"""NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py).

The only module of nbmon that imports pynvml. NVML is initialised lazily,
once per process id (a forked child initialises again), and :func:`status`
says why GPU metrics are off when they are. A query that answers
NotSupported gives NaN for that field only, and is not asked again.

``NBMON_NVML_LIBRARY`` names the NVML shared library when it is not where
pynvml looks (``libnvidia-ml.so.1`` on the loader path).
"""
from __future__ import annotations

import math
import numbers
import os
import threading

NAN = math.nan
MIB = 1024.0 * 1024.0

DEVICE_FIELDS = (
    "util_percent", "mem_util_percent", "mem_used_mb", "mem_total_mb", "temp_c",
    "power_w", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz", "proc_mem_mb",
)
# Across devices: means of rates, sums of amounts; proc = the monitored tree.
TOTAL_FIELDS = ("gpu_util_percent", "gpu_mem_used_mb", "gpu_proc_mem_mb",
                "gpu_power_w", "gpu_sm_clock_mhz")

_lock = threading.Lock()
_init_pid: int | None = None
_state = "not initialised"
_device_count = 0
_nvml_up = False  # nvmlInit succeeded in this process and is not shut down yet


def _reset_after_fork() -> None:
    global _lock, _init_pid, _nvml_up
    _lock = threading.Lock()  # a lock held by another thread at fork would never be released
    _init_pid = None
    _nvml_up = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _reason(pynvml, err) -> str:
    code = getattr(err, "value", None)
    return {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML library not found (no NVIDIA driver installed)",
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
        pynvml.NVML_ERROR_NO_PERMISSION: "no permission to use NVML",
        pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    }.get(code, f"NVML error: {err}")


def _load_library(pynvml, path: str) -> None:
    import ctypes

    pynvml.nvmlLib = ctypes.CDLL(path)
    pynvml._nvmlGetFunctionPointer_cache.clear()


def init() -> bool:
    """Initialise NVML for this process if not done yet; True when devices are usable."""
    global _init_pid, _state, _device_count, _nvml_up
    with _lock:
        if _init_pid == os.getpid():
            return _state == "ok"
        _init_pid = os.getpid()
        _device_count = 0
        try:
            import pynvml
        except ImportError:
            _state = "pynvml is not installed (pip install nvidia-ml-py)"
            return False
        try:
            library = os.environ.get("NBMON_NVML_LIBRARY")
            if library:
                _load_library(pynvml, library)
            pynvml.nvmlInit()
            _nvml_up = True  # shutdown() must balance it even if no device is usable
            _device_count = pynvml.nvmlDeviceGetCount()
        except OSError as err:
            _state = f"cannot load the NVML library: {err}"
            return False
        except pynvml.NVMLError as err:
            _state = _reason(pynvml, err)
            return False
        _state = "ok" if _device_count else "no NVIDIA device found"
        return _device_count > 0


def status() -> str:
    """Why GPU metrics are on or off: 'ok', or a reason in words."""
    return _state


def device_count() -> int:
    return _device_count if init() else 0


def shutdown() -> None:
    """Release NVML (tests, and processes that want the driver's memory back)."""
    global _init_pid, _state, _device_count, _nvml_up
    with _lock:
        if _init_pid == os.getpid() and _nvml_up:
            import pynvml

            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
        _init_pid, _state, _device_count, _nvml_up = None, "not initialised", 0, False


class _Device:
    """One GPU's queries; remembers which fields the device does not support."""

    def __init__(self, pynvml, index: int):
        self.nv = pynvml
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.unsupported: set[str] = set()
        self.lost = False
        self.errors = 0
        self.queries = (
            ("utilization", self._utilization),
            ("memory", self._memory),
            ("temperature", lambda: (self.nv.nvmlDeviceGetTemperature(self.handle, self.nv.NVML_TEMPERATURE_GPU),)),
            ("power", lambda: (self.nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,)),
            ("power_limit", lambda: (self.nv.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0,)),
            ("sm_clock", lambda: (self.nv.nvmlDeviceGetClockInfo(self.handle, self.nv.NVML_CLOCK_SM),)),
            ("mem_clock", lambda: (self.nv.nvmlDeviceGetClockInfo(self.handle, self.nv.NVML_CLOCK_MEM),)),
        )

    def _utilization(self):
        u = self.nv.nvmlDeviceGetUtilizationRates(self.handle)
        return u.gpu, u.memory

    def _memory(self):
        m = self.nv.nvmlDeviceGetMemoryInfo(self.handle)
        return m.used / MIB, m.total / MIB

    def read(self, pids) -> list[float]:
        """The device's fields in DEVICE_FIELDS order."""
        out: list[float] = []
        for name, query in self.queries:
            width = 2 if name in ("utilization", "memory") else 1
            out.extend(self.ask(name, query, width))
        out.extend(self.ask("processes", lambda: (self._tree_memory_mb(pids),), 1))
        return out

    def query(self, name: str) -> tuple[float, ...]:
        for known, query in self.queries:
            if known == name:
                return self.ask(name, query, 2 if name in ("utilization", "memory") else 1)
        raise KeyError(name)

    def ask(self, name, query, width) -> tuple[float, ...]:
        if self.lost or name in self.unsupported:
            return (NAN,) * width
        try:
            return tuple(float(v) for v in query())
        except self.nv.NVMLError as err:
            if err.value == self.nv.NVML_ERROR_NOT_SUPPORTED:
                self.unsupported.add(name)
            elif err.value == self.nv.NVML_ERROR_GPU_IS_LOST:
                self.lost = True
            else:
                self.errors += 1
            return (NAN,) * width

    def _tree_memory_mb(self, pids) -> float:
        if not pids:
            return NAN
        # A process with compute and graphics contexts is in both lists, each
        # time with its whole memory on the device: count it once.
        used: dict[int, int] = {}
        for fetch in (self.nv.nvmlDeviceGetComputeRunningProcesses,
                      self.nv.nvmlDeviceGetGraphicsRunningProcesses):
            for proc in fetch(self.handle):
                if proc.pid in pids and proc.usedGpuMemory is not None:
                    used[proc.pid] = max(used.get(proc.pid, 0), proc.usedGpuMemory)
        return sum(used.values()) / MIB


class GPUs:
    """Per-device and total GPU figures of the machine, plus the GPU memory of
    the processes ``tree_pids()`` returns (pids as NVML sees them: inside a
    container with its own pid namespace they do not match, and the tree's
    GPU memory reads 0)."""

    def __init__(self, tree_pids=lambda: ()):
        self.tree_pids = tree_pids
        self.devices: list[_Device] = []
        self.fields: tuple[str, ...] = ()
        self.note = ""

    @property
    def state(self) -> str:
        """'ok' or why there are no GPU figures, including a device lost mid-run."""
        if self.note:
            return self.note
        lost = [str(d.index) for d in self.devices if d.lost]
        if lost:
            return f"GPU {', '.join(lost)} lost"
        return status()

    def start(self, now: float) -> None:
        self.devices = []
        if init():
            import pynvml

            for index in range(_device_count):
                try:
                    self.devices.append(_Device(pynvml, index))
                except pynvml.NVMLError as err:
                    self.note = f"GPU {index}: {_reason(pynvml, err)}"
        self.fields = (TOTAL_FIELDS + tuple(f"gpu{d.index}_{f}" for d in self.devices
                                            for f in DEVICE_FIELDS)) if self.devices else ()

    def sample(self, now: float) -> tuple[float, ...]:
        if not self.devices:
            return ()
        pids = frozenset(self.tree_pids())
        per_device = [d.read(pids) for d in self.devices]
        util = [v[0] for v in per_device if v[0] == v[0]]
        totals = (
            sum(util) / len(util) if util else NAN,
            _nansum(v[2] for v in per_device),
            _nansum(v[9] for v in per_device),
            _nansum(v[5] for v in per_device),
            _nanmean(v[7] for v in per_device),
        )
        return totals + tuple(x for v in per_device for x in v)

    def close(self) -> None:
        # Keep saying which GPU was lost once the run is over (state reads devices).
        lost = [str(d.index) for d in self.devices if d.lost]
        if lost and not self.note:
            self.note = f"GPU {', '.join(lost)} lost"
        self.devices = []


def _nansum(values) -> float:
    vals = [v for v in values if v == v]
    return sum(vals) if vals else NAN


def _nanmean(values) -> float:
    vals = [v for v in values if v == v]
    return sum(vals) / len(vals) if vals else NAN


class NVMLProfiler:
    """calibrax's GPUProfilerProtocol over NVML for one device.

    Each method answers for ``device_index``; a field NVML cannot give is
    NaN. Raises RuntimeError at construction when NVML has no such device.
    """

    def __init__(self, device_index: int = 0):
        # A bool or str would pass (or break) the range check below with an unclear error.
        # numbers.Integral: a numpy integer (np.arange, an array element) is a whole number too.
        if isinstance(device_index, bool) or not isinstance(device_index, numbers.Integral):
            raise ValueError(f"device_index must be a whole number, got {device_index!r}")
        device_index = int(device_index)
        if not init():
            raise RuntimeError(f"no NVIDIA GPU is usable: {status()}")
        if not 0 <= device_index < _device_count:
            raise ValueError(f"device_index {device_index!r} is out of range: "
                             f"NVML sees {_device_count} device(s)")
        import pynvml

        self._device = _Device(pynvml, device_index)

    def get_utilization(self) -> float:
        return self._device.query("utilization")[0]

    def get_memory_usage(self) -> dict[str, float]:
        used, total = self._device.query("memory")
        return {"gpu_memory_used_mb": used, "gpu_memory_total_mb": total}

    def get_clock_info(self) -> dict[str, float]:
        return {"gpu_clock_mhz": self._device.query("sm_clock")[0],
                "mem_clock_mhz": self._device.query("mem_clock")[0]}

    def get_power_info(self) -> dict[str, float]:
        return {"power_draw_w": self._device.query("power")[0],
                "power_limit_w": self._device.query("power_limit")[0]}
