"""A fake NVML shared library for GPU-less tests, loaded by the *real* pynvml.

``fake_nvml.c`` exports the NVML C functions nbmon uses.  What the fake GPUs
report comes from a small text file named by the environment variable
``FAKE_NVML_CONFIG``; the library re-reads it on every call, so rewriting it
mid-test (``FakeNVML.set`` / ``FakeNVML.update``) changes the very next
answer.  Typical use (the fixture belongs in a conftest.py)::

    lib = build(tmp_path_factory.mktemp("fake_nvml"))   # once per session
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "nvml.conf"))
    fake = FakeNVML(tmp_path / "nvml.conf")
    fake.set(devices=[{"name": "FakeGPU-A", "util_gpu": 37}],
             errors={(0, "power"): pynvml.NVML_ERROR_NOT_SUPPORTED},
             procs={0: [(1234, 512 << 20)]})
    load_into_pynvml(lib)
    ...                                   # code under test calls pynvml
    unload_from_pynvml()

Nothing here imports pynvml at module level, so importing this package is
free of side effects.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

__all__ = [
    "CONFIG_ENV",
    "DEVICE_KEYS",
    "DEVICE_ERROR_FIELDS",
    "GLOBAL_ERROR_FIELDS",
    "MAX_DEVICES",
    "MAX_PROCS",
    "NUMERIC_DEVICE_KEYS",
    "TEXT_DEVICE_KEYS",
    "BuildError",
    "FakeNVML",
    "build",
    "compiler",
    "init_refcount",
    "load_into_pynvml",
    "unload_from_pynvml",
]

CONFIG_ENV = "FAKE_NVML_CONFIG"
MAX_DEVICES = 32  # matches MAX_DEVICES in fake_nvml.c
MAX_PROCS = 256  # per kind (compute / graphics), across all devices
_TEXT_MAX = 95  # NVML_DEVICE_NAME_V2_BUFFER_SIZE - 1

#: Numeric per-device fields.  Missing ones read as 0, except that
#: ``mem_free`` defaults to total - used (- reserved for the v2 struct),
#: ``power_mgmt_limit_mw`` to ``power_limit_mw`` and ``graphics_clock`` to
#: ``sm_clock``.  Units are NVML's: percent, bytes, degrees C, milliwatts, MHz.
NUMERIC_DEVICE_KEYS = (
    "util_gpu", "util_mem",
    "mem_total", "mem_used", "mem_free", "mem_reserved",
    "temp", "fan",
    "power_mw", "power_limit_mw", "power_mgmt_limit_mw",
    "sm_clock", "mem_clock", "graphics_clock",
)
#: String per-device fields (default "FakeGPU-<i>" and a fixed fake UUID).
TEXT_DEVICE_KEYS = ("name", "uuid")
DEVICE_KEYS = NUMERIC_DEVICE_KEYS + TEXT_DEVICE_KEYS

#: Per-device error fields, used as ``errors={(index, field): code}``.  Each
#: makes the named query on that device return ``code``; "all" applies to
#: every per-device query (a field-specific code wins over it).
#:   handle         nvmlDeviceGetHandleByIndex(_v2)
#:   name, uuid     nvmlDeviceGetName / nvmlDeviceGetUUID
#:   util           nvmlDeviceGetUtilizationRates
#:   memory         nvmlDeviceGetMemoryInfo(_v2)
#:   temp           nvmlDeviceGetTemperature
#:   fan            nvmlDeviceGetFanSpeed
#:   power          nvmlDeviceGetPowerUsage
#:   power_limit    nvmlDeviceGetEnforcedPowerLimit and ...PowerManagementLimit
#:   clock_sm, clock_mem, clock_graphics   nvmlDeviceGetClockInfo per type
#:   procs          nvmlDeviceGetComputeRunningProcesses_v2/_v3
#:   graphics_procs nvmlDeviceGetGraphicsRunningProcesses_v2/_v3
#:   proc_util      nvmlDeviceGetProcessUtilization
DEVICE_ERROR_FIELDS = (
    "handle", "name", "uuid", "util", "memory", "temp", "fan", "power",
    "power_limit", "clock_sm", "clock_mem", "clock_graphics", "procs",
    "graphics_procs", "proc_util", "all",
)
#: Global error fields, used as ``errors={field: code}``:
#:   init            nvmlInit / nvmlInit_v2 / nvmlInitWithFlags
#:   count           nvmlDeviceGetCount(_v2)
#:   driver_version  nvmlSystemGetDriverVersion
GLOBAL_ERROR_FIELDS = ("init", "count", "driver_version")

_SOURCE = Path(__file__).with_name("fake_nvml.c")
_CFLAGS = ("-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-Wall", "-Wextra")
_built: dict[str, str] = {}  # source hash -> built .so, for this process


class BuildError(RuntimeError):
    """The fake library could not be compiled (no compiler, or gcc failed)."""


def compiler() -> str | None:
    """The C compiler ``build`` will use ($CC, else gcc, else cc), or None."""
    for cand in (os.environ.get("CC"), "gcc", "cc"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def build(tmpdir: str | os.PathLike) -> str:
    """Compile fake_nvml.c into ``tmpdir`` and return the .so's path.

    The file name carries a hash of the source and flags, and results are
    remembered per process, so calling this from every test costs one
    compile per session.  Raises BuildError when compiling is impossible.
    """
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler found (set $CC or install gcc)")
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(_CFLAGS).encode()).hexdigest()[:16]
    cached = _built.get(key)
    if cached and os.path.exists(cached):
        return cached

    out = Path(tmpdir) / f"libfake_nvml-{key}.so"
    if not out.exists():
        # Compile to a private name, then rename: parallel sessions sharing
        # tmpdir never dlopen a half-written file.
        partial = out.with_name(f"{out.name}.{os.getpid()}.partial")
        cmd = [cc, *_CFLAGS, "-o", str(partial), str(_SOURCE)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}"
            )
        os.replace(partial, out)
    _built[key] = str(out)
    return str(out)


def load_into_pynvml(path: str | os.PathLike) -> ctypes.CDLL:
    """Make the real pynvml module use the fake library at ``path``.

    Resets the fake's init refcount (dlopen of an already-loaded path hands
    back the same copy, with whatever state an earlier test left) and
    pynvml's function-pointer cache and refcount.  Returns the CDLL.
    """
    import pynvml

    lib = ctypes.CDLL(os.path.abspath(path))
    lib.fakeNvmlReset()
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    return lib


def unload_from_pynvml() -> None:
    """Put pynvml back to "library never loaded".

    The next pynvml.nvmlInit() then tries CDLL("libnvidia-ml.so.1"), which
    on a machine without the NVIDIA driver raises NVMLError_LibraryNotFound.
    If the fake was loaded, its init refcount is reset too, so a test that
    forgot nvmlShutdown() does not leak into the next.
    """
    import pynvml

    with pynvml.libLoadLock:
        lib = pynvml.nvmlLib
        if lib is not None and hasattr(lib, "fakeNvmlReset"):
            lib.fakeNvmlReset()
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def init_refcount() -> int:
    """How many nvmlInit calls the loaded fake has not yet seen shut down."""
    import pynvml

    lib = pynvml.nvmlLib
    if lib is None or not hasattr(lib, "fakeNvmlInitRefcount"):
        raise RuntimeError("the fake NVML library is not loaded into pynvml")
    return int(lib.fakeNvmlInitRefcount())


def _check_code(what: str, code) -> int:
    if isinstance(code, bool) or not isinstance(code, int):
        raise TypeError(f"{what}: NVML return code must be an int, got {code!r}")
    if not -(2**31) <= code < 2**31:
        raise ValueError(f"{what}: NVML return code {code} out of int range")
    return code


def _check_index(what: str, index) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{what}: device index must be an int, got {index!r}")
    if not 0 <= index < MAX_DEVICES:
        raise ValueError(f"{what}: device index {index} not in [0, {MAX_DEVICES})")
    return index


class FakeNVML:
    """Writes the fake library's config file; hides its line format.

    ``FakeNVML(config_path)`` writes an empty config (no GPUs, no errors)
    straight away, so the file always exists.  The library finds the file
    through ``os.environ[CONFIG_ENV]``: set that yourself (e.g. with
    ``monkeypatch.setenv(CONFIG_ENV, str(fake.path))``, or ``fake.env``).
    """

    def __init__(self, config_path: str | os.PathLike):
        self.path = Path(config_path)
        self._state: dict = {}
        self.set()

    @property
    def env(self) -> dict[str, str]:
        """``{CONFIG_ENV: path}``, for monkeypatch or subprocess env."""
        return {CONFIG_ENV: str(self.path)}

    @property
    def state(self) -> dict:
        """The keyword arguments of the configuration now written."""
        return dict(self._state)

    def set(
        self,
        devices: Iterable[Mapping] = (),
        *,
        init_error: int = 0,
        count_error: int = 0,
        driver_version: str = "999.99.fake",
        errors: Mapping | None = None,
        procs: Mapping[int, Iterable] | None = None,
        graphics_procs: Mapping[int, Iterable] | None = None,
    ) -> None:
        """Replace the whole configuration, atomically.

        devices: one mapping per GPU, index = position; keys from DEVICE_KEYS.
            The device count is len(devices).
        init_error, count_error: NVML return codes for nvmlInit* and
            nvmlDeviceGetCount* (0 = success); shorthand for
            errors={"init": ..., "count": ...}.
        driver_version: what nvmlSystemGetDriverVersion reports.
        errors: {(device_index, field): code} with field in
            DEVICE_ERROR_FIELDS, and/or {field: code} with field in
            GLOBAL_ERROR_FIELDS.  Code 0 means "no error".
        procs / graphics_procs: {device_index: [(pid, used_bytes), ...]};
            used_bytes None is reported as NVML_VALUE_NOT_AVAILABLE, which
            pynvml turns into usedGpuMemory None. A compute process may have
            a third item, its SM utilisation % (an int): the one sample
            nvmlDeviceGetProcessUtilization reports for it.
        """
        state = dict(
            devices=[dict(d) for d in devices],
            init_error=init_error,
            count_error=count_error,
            driver_version=driver_version,
            errors=dict(errors or {}),
            procs={k: list(v) for k, v in (procs or {}).items()},
            graphics_procs={k: list(v) for k, v in (graphics_procs or {}).items()},
        )
        text = self._render(**state)  # validates before anything is written
        self._write(text)
        self._state = state

    def update(self, **changes) -> None:
        """Like set(), but keeps every argument not given from the last call.

        Each given argument replaces its old value wholesale, e.g.
        ``update(errors={(1, "all"): NVML_ERROR_GPU_IS_LOST})`` keeps the
        devices and processes and swaps the error table.
        """
        unknown = set(changes) - set(self._state)
        if unknown:
            raise TypeError(f"unknown FakeNVML settings: {sorted(unknown)}")
        self.set(**{**self._state, **changes})

    def text(self) -> str:
        """The config file as written (for debugging failed tests)."""
        return self.path.read_text()

    # -- internals ---------------------------------------------------------

    @staticmethod
    def _text_value(what: str, value) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {value!r}")
        if "\n" in value or "\r" in value:
            raise ValueError(f"{what} must be one line: {value!r}")
        if value != value.strip():
            raise ValueError(f"{what} has leading/trailing blanks: {value!r}")
        if len(value.encode()) > _TEXT_MAX:
            raise ValueError(f"{what} longer than {_TEXT_MAX} bytes: {value!r}")
        return value

    @classmethod
    def _render(cls, devices, init_error, count_error, driver_version,
                errors, procs, graphics_procs) -> str:
        if len(devices) > MAX_DEVICES:
            raise ValueError(f"at most {MAX_DEVICES} devices, got {len(devices)}")
        global_errors = {"init": _check_code("init_error", init_error),
                         "count": _check_code("count_error", count_error),
                         "driver_version": 0}
        device_errors: dict[int, dict[str, int]] = {}
        for key, code in errors.items():
            if isinstance(key, str):
                if key not in GLOBAL_ERROR_FIELDS:
                    raise ValueError(
                        f"unknown global error field {key!r}; use one of "
                        f"{GLOBAL_ERROR_FIELDS} or (index, field)")
                global_errors[key] = _check_code(key, code)
                continue
            try:
                index, field = key
            except (TypeError, ValueError):
                raise TypeError(f"error key must be (index, field) or a "
                                f"global field name, got {key!r}") from None
            _check_index(f"errors[{key!r}]", index)
            if field not in DEVICE_ERROR_FIELDS:
                raise ValueError(f"unknown device error field {field!r}; use "
                                 f"one of {DEVICE_ERROR_FIELDS}")
            device_errors.setdefault(index, {})[field] = \
                _check_code(f"errors[{key!r}]", code)

        lines = [
            "# fake NVML config, written by tests/fake_nvml FakeNVML",
            f"init_error {global_errors['init']}",
            f"count_error {global_errors['count']}",
            f"driver_version_error {global_errors['driver_version']}",
            f"driver_version {cls._text_value('driver_version', driver_version)}",
        ]
        for i, dev in enumerate(devices):
            unknown = set(dev) - set(DEVICE_KEYS)
            if unknown:
                raise ValueError(f"device {i}: unknown keys {sorted(unknown)}; "
                                 f"valid keys are {DEVICE_KEYS}")
            nums = []
            for key in NUMERIC_DEVICE_KEYS:
                if key not in dev:
                    continue
                val = dev[key]
                if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                    raise ValueError(f"device {i}: {key} must be an int >= 0, "
                                     f"got {val!r}")
                if val >= 2**64 - 1:  # 2**64-1 is the "unset" sentinel in C
                    raise ValueError(f"device {i}: {key} too large: {val}")
                nums.append(f"{key}={val}")
            lines.append(" ".join([f"device {i}", *nums]))
            for key in TEXT_DEVICE_KEYS:
                if key in dev:
                    value = cls._text_value(f"device {i}: {key}", dev[key])
                    lines.append(f"{key} {i} {value}")
        for index, fields in sorted(device_errors.items()):
            lines.append(" ".join([f"error {index}",
                                   *(f"{f}={c}" for f, c in fields.items())]))
        for directive, table in (("proc", procs), ("gproc", graphics_procs)):
            total = 0
            for index, plist in sorted(table.items()):
                _check_index(f"{directive} table", index)
                for entry in plist:
                    pid, used, *sm = entry
                    if len(sm) > 1 or (sm and (directive != "proc" or isinstance(sm[0], bool)
                                               or not isinstance(sm[0], int) or not 0 <= sm[0] <= 100)):
                        raise ValueError(f"bad entry {entry!r}: (pid, used) or, computing, (pid, used, sm %)")
                    if isinstance(pid, bool) or not isinstance(pid, int) \
                            or not 0 <= pid < 2**32:
                        raise ValueError(f"bad pid {pid!r} on device {index}")
                    if used is None:
                        used_s = "na"
                    elif isinstance(used, int) and 0 <= used < 2**64 - 1:
                        used_s = str(used)
                    else:
                        raise ValueError(f"bad used bytes {used!r} for pid {pid}")
                    lines.append(f"{directive} {index} pid={pid} used={used_s}" + (f" sm={sm[0]}" if sm else ""))
                    total += 1
            if total > MAX_PROCS:
                raise ValueError(f"at most {MAX_PROCS} {directive} entries")
        return "\n".join(lines) + "\n"

    def _write(self, text: str) -> None:
        # Write-then-rename: the library, re-reading on every call, sees
        # either the old file or the new one, never a torn one.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.",
                                   dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
