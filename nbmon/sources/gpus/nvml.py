"""NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py): one
vendor of :mod:`nbmon.sources.gpus` (``NAME``, ``VISIBLE``, ``IMPORTS``,
``discover``, ``uuid``, ``device``, ``status``); calibrax's NVMLProfiler
reads its devices (:mod:`nbmon.compat.calibrax`).

The only module of nbmon that imports pynvml. NVML is initialised lazily,
once per process id (a forked child initialises again), and :func:`status`
says why GPU metrics are off when they are. A query that answers
NotSupported gives NaN for that field only, and is not asked again; any
other failure gives NaN too and is said (``Device.drain_errors``), so a
failing GPU is a fault the user sees, not a silent gap.

``NBMON_NVML_LIBRARY`` names the NVML shared library when it is not where
pynvml looks (``libnvidia-ml.so.1`` on the loader path).
"""
from __future__ import annotations

import os
import threading
import time

from ... import catalog
from ...values import MIB, NAN


_lock = threading.Lock()
_init_pid: int | None = None
_state = "not initialised"
_device_count = 0
_nvml_up = False  # nvmlInit succeeded in this process and is not shut down yet
LIBRARY = "libnvidia-ml.so.1"   # where pynvml looks for NVML on Linux


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


def library():
    """pynvml with the NVML library loaded as pynvml loads it on Linux, or
    from ``NBMON_NVML_LIBRARY``: the library first, so that a machine without
    one never imports pynvml (1.9 MiB). OSError without the library,
    ImportError without pynvml."""
    import ctypes

    lib = ctypes.CDLL(os.environ.get("NBMON_NVML_LIBRARY") or LIBRARY)
    import pynvml

    if pynvml.nvmlLib is not lib:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


def init() -> bool:
    """Initialise NVML for this process if not done yet; True when devices are usable."""
    global _init_pid, _state, _device_count, _nvml_up
    with _lock:
        if _init_pid == os.getpid():
            return _state == "ok"
        _init_pid = os.getpid()
        _device_count = 0
        try:
            pynvml = library()
        except OSError as err:
            _state = f"cannot load the NVML library: {err}" if os.environ.get("NBMON_NVML_LIBRARY") \
                else "NVML library not found (no NVIDIA driver installed)"
            return False
        except ImportError:
            _state = "pynvml is not installed (pip install nvidia-ml-py)"
            return False
        try:
            pynvml.nvmlInit()
            _nvml_up = True  # shutdown() must balance it even if no device is usable
            _device_count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as err:
            _state = _reason(pynvml, err)
            return False
        _state = "ok" if _device_count else "no NVIDIA device found"
        return _device_count > 0


def device_count() -> int:
    """How many devices NVML reports (0 when it is unusable); initialises NVML."""
    init()
    return _device_count


def status() -> str:
    """Why GPU metrics are on or off: 'ok', or a reason in words."""
    return _state


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


def _utilization(nv, handle):
    u = nv.nvmlDeviceGetUtilizationRates(handle)
    return {"util_percent": u.gpu, "mem_util_percent": u.memory}


def _memory(nv, handle):
    m = nv.nvmlDeviceGetMemoryInfo(handle)
    return {"mem_used_mb": m.used / MIB, "mem_total_mb": m.total / MIB}


# NVML query -> the DEVICE metrics it answers. A query that answers
# NotSupported gives NaN for its metrics and is not asked again.
QUERIES = {
    "utilization": _utilization,
    "memory": _memory,
    "temperature": lambda nv, h: {"temp_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)},
    "fan": lambda nv, h: {"fan_percent": nv.nvmlDeviceGetFanSpeed(h)},
    "power": lambda nv, h: {"power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0},
    "power_limit": lambda nv, h: {"power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0},
    "sm_clock": lambda nv, h: {"sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)},
    "mem_clock": lambda nv, h: {"mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)},
}


class Device:
    """One GPU's queries; remembers which ones the device does not support,
    and says in words (:meth:`drain_errors`) which failed otherwise."""

    def __init__(self, pynvml, index: int):
        self.nv = pynvml
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.unsupported: set[str] = set()
        self.lost = False
        self._errors: list[str] = []
        self.metric_names = catalog.names(catalog.DEVICE)

    def read(self, pids) -> dict[str, float]:
        """Every DEVICE metric of the catalog: {metric name: value}, NaN where unknown."""
        out = dict.fromkeys(self.metric_names, NAN)
        for name, query in QUERIES.items():
            out.update(self.ask(name, query))
        out.update(self.ask("processes", lambda nv, h: {"proc_mem_mb": self._tree_memory_mb(pids)}))
        out.update(self.ask("process utilization", lambda nv, h: {"proc_util_percent": self._tree_util_percent(pids)}))
        return out

    def query(self, name: str) -> dict[str, float]:
        return self.ask(name, QUERIES[name])

    def ask(self, name, query) -> dict[str, float]:
        if self.lost or name in self.unsupported:
            return {}
        try:
            return {k: float(v) for k, v in query(self.nv, self.handle).items()}
        except self.nv.NVMLError as err:
            if err.value == self.nv.NVML_ERROR_NOT_SUPPORTED:
                self.unsupported.add(name)
            else:
                self.lost = self.lost or err.value == self.nv.NVML_ERROR_GPU_IS_LOST
                if len(self._errors) < MAX_ERRORS:  # drained every sample
                    self._errors.append(f"NVML {name} query failed: {err}")
            return {}

    def drain_errors(self) -> list[str]:
        errors, self._errors = self._errors, []
        return errors

    def _tree_util_percent(self, pids) -> float:
        """The SM utilisation of the tree's processes on this device (their
        sum: 100 = the whole GPU), each by its newest of NVML's samples of
        the last :data:`UTIL_WINDOW_S` seconds; 0 where none of them ran."""
        if not pids:
            return NAN
        since_us = int((time.time() - UTIL_WINDOW_S) * 1e6)
        try:
            samples = self.nv.nvmlDeviceGetProcessUtilization(self.handle, since_us)
        except self.nv.NVMLError as err:
            if err.value == self.nv.NVML_ERROR_NOT_FOUND:   # no process ran on it since
                return 0.0
            raise
        newest: dict[int, tuple[int, int]] = {}
        for sample in samples:
            if sample.pid in pids and sample.timeStamp >= newest.get(sample.pid, (-1, 0))[0]:
                newest[sample.pid] = (sample.timeStamp, sample.smUtil)
        return float(sum(util for _, util in newest.values()))

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


# -- the vendor interface of nbmon.sources.gpus -------------------------------

NAME = "NVIDIA"
VISIBLE = "CUDA_VISIBLE_DEVICES"
IMPORTS = ("pynvml",)
MAX_ERRORS = 64
UTIL_WINDOW_S = 1.0   # a process's utilisation: its newest sample of this long


def discover() -> tuple[int, str]:
    """Initialise NVML: (devices, why none)."""
    return (_device_count, "") if init() else (0, status())


def uuid(index: int) -> str:
    import pynvml

    try:
        value = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
    except pynvml.NVMLError:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def device(index: int) -> Device:
    """The device at NVML ``index``; OSError saying why when NVML refuses it."""
    import pynvml

    try:
        return Device(pynvml, index)
    except pynvml.NVMLError as err:
        raise OSError(_reason(pynvml, err)) from None
