"""The fake NVML library, driven through the real pynvml module."""

from __future__ import annotations

import ctypes
import threading
import time

import pynvml
import pytest

from fake_nvml import (
    CONFIG_ENV,
    DEVICE_ERROR_FIELDS,
    FakeNVML,
    build,
    init_refcount,
    load_into_pynvml,
    unload_from_pynvml,
)

GIB = 1 << 30
MIB = 1 << 20

DEV_A = dict(name="NVIDIA Fake A100 80GB", uuid="GPU-aaaaaaaa-0000", util_gpu=37,
             util_mem=12, mem_total=80 * GIB, mem_used=1 * GIB, temp=55,
             power_mw=123_000, power_limit_mw=700_000, sm_clock=1980,
             mem_clock=2619)
DEV_B = dict(name="FakeGPU-B", uuid="GPU-bbbbbbbb-0001", util_gpu=99,
             util_mem=64, mem_total=24 * GIB, mem_used=20 * GIB,
             mem_reserved=300 * MIB, temp=81, power_mw=250_000,
             power_limit_mw=300_000, power_mgmt_limit_mw=320_000,
             sm_clock=1410, mem_clock=1215, graphics_clock=1400)


@pytest.fixture(scope="session")
def fake_lib(fake_nvml_lib):
    return fake_nvml_lib


@pytest.fixture
def fake(fake_lib, tmp_path, monkeypatch):
    """A FakeNVML with two devices, loaded into pynvml but not initialised.

    Teardown shuts NVML down as often as the test left it initialised and
    unloads the library, so no test sees another's state.
    """
    fake = FakeNVML(tmp_path / "nvml.conf")
    monkeypatch.setenv(CONFIG_ENV, str(fake.path))
    fake.set(devices=[DEV_A, DEV_B])
    load_into_pynvml(fake_lib)
    yield fake
    if pynvml.nvmlLib is not None and hasattr(pynvml.nvmlLib,
                                              "fakeNvmlInitRefcount"):
        while init_refcount() > 0:
            pynvml.nvmlShutdown()
    unload_from_pynvml()


@pytest.fixture
def nvml(fake):
    """``fake``, with pynvml.nvmlInit() done; the test may shut down itself."""
    pynvml.nvmlInit()
    return fake


def handles(n):
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]


# -- values ---------------------------------------------------------------


def test_two_devices_report_their_configured_values(nvml):
    assert pynvml.nvmlSystemGetDriverVersion() == "999.99.fake"
    assert pynvml.nvmlDeviceGetCount() == 2
    a, b = handles(2)

    assert pynvml.nvmlDeviceGetName(a) == "NVIDIA Fake A100 80GB"
    assert pynvml.nvmlDeviceGetName(b) == "FakeGPU-B"
    assert pynvml.nvmlDeviceGetUUID(a) == "GPU-aaaaaaaa-0000"
    assert pynvml.nvmlDeviceGetUUID(b) == "GPU-bbbbbbbb-0001"

    ua, ub = (pynvml.nvmlDeviceGetUtilizationRates(h) for h in (a, b))
    assert (ua.gpu, ua.memory) == (37, 12)
    assert (ub.gpu, ub.memory) == (99, 64)

    ma = pynvml.nvmlDeviceGetMemoryInfo(a)
    assert (ma.total, ma.used, ma.free) == (80 * GIB, GIB, 79 * GIB)
    mb = pynvml.nvmlDeviceGetMemoryInfo(b)
    assert (mb.total, mb.used, mb.free) == (24 * GIB, 20 * GIB, 4 * GIB)
    mb2 = pynvml.nvmlDeviceGetMemoryInfo(b, version=pynvml.nvmlMemory_v2)
    assert (mb2.total, mb2.reserved, mb2.used, mb2.free) == (
        24 * GIB, 300 * MIB, 20 * GIB, 4 * GIB - 300 * MIB)

    T = pynvml.NVML_TEMPERATURE_GPU
    assert pynvml.nvmlDeviceGetTemperature(a, T) == 55
    assert pynvml.nvmlDeviceGetTemperature(b, T) == 81
    assert pynvml.nvmlDeviceGetPowerUsage(a) == 123_000
    assert pynvml.nvmlDeviceGetPowerUsage(b) == 250_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(a) == 700_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(b) == 300_000
    # The management limit defaults to the enforced one unless configured.
    assert pynvml.nvmlDeviceGetPowerManagementLimit(a) == 700_000
    assert pynvml.nvmlDeviceGetPowerManagementLimit(b) == 320_000

    clock = pynvml.nvmlDeviceGetClockInfo
    assert clock(a, pynvml.NVML_CLOCK_SM) == 1980
    assert clock(a, pynvml.NVML_CLOCK_MEM) == 2619
    assert clock(a, pynvml.NVML_CLOCK_GRAPHICS) == 1980  # defaults to SM
    assert clock(b, pynvml.NVML_CLOCK_SM) == 1410
    assert clock(b, pynvml.NVML_CLOCK_MEM) == 1215
    assert clock(b, pynvml.NVML_CLOCK_GRAPHICS) == 1400
    with pytest.raises(pynvml.NVMLError_NotSupported):
        clock(a, pynvml.NVML_CLOCK_VIDEO)


def test_defaults_for_a_bare_device(nvml):
    nvml.set(devices=[{}])
    (h,) = handles(1)
    assert pynvml.nvmlDeviceGetName(h) == "FakeGPU-0"
    assert pynvml.nvmlDeviceGetUUID(h).startswith("GPU-")
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 0
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 0
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_unversioned_and_v1_entry_points(nvml):
    """The exports pynvml itself no longer calls still behave."""
    lib = pynvml.nvmlLib
    assert lib.nvmlInit() == pynvml.NVML_SUCCESS
    assert lib.nvmlInit_v2() == pynvml.NVML_SUCCESS
    count = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount(ctypes.byref(count)) == 0 and count.value == 2
    dev = pynvml.c_nvmlDevice_t()
    assert lib.nvmlDeviceGetHandleByIndex(1, ctypes.byref(dev)) == 0
    assert pynvml.nvmlDeviceGetName(dev) == "FakeGPU-B"
    assert init_refcount() == 3
    # A name buffer that is too small gets NVML's INSUFFICIENT_SIZE.
    small = ctypes.create_string_buffer(4)
    assert lib.nvmlDeviceGetName(dev, small, 4) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    # Garbage and NULL handles are rejected, not dereferenced.
    bogus = ctypes.cast(ctypes.c_void_p(16), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(bogus)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(pynvml.c_nvmlDevice_t())


# -- errors ---------------------------------------------------------------


def test_not_supported_power_on_one_device_only(nvml):
    nvml.update(errors={(1, "power"): pynvml.NVML_ERROR_NOT_SUPPORTED})
    a, b = handles(2)
    assert pynvml.nvmlDeviceGetPowerUsage(a) == 123_000
    with pytest.raises(pynvml.NVMLError_NotSupported) as exc:
        pynvml.nvmlDeviceGetPowerUsage(b)
    assert str(exc.value) == "Not Supported"
    # Other queries on the same device are unaffected.
    assert pynvml.nvmlDeviceGetTemperature(b, pynvml.NVML_TEMPERATURE_GPU) == 81


def _per_handle(fn):
    return lambda index, h: fn(h)


# field -> query(device index, handle), for every per-device error field.
QUERIES = {
    "handle": lambda index, h: pynvml.nvmlDeviceGetHandleByIndex(index),
    "name": _per_handle(pynvml.nvmlDeviceGetName),
    "uuid": _per_handle(pynvml.nvmlDeviceGetUUID),
    "util": _per_handle(pynvml.nvmlDeviceGetUtilizationRates),
    "memory": _per_handle(pynvml.nvmlDeviceGetMemoryInfo),
    "temp": _per_handle(lambda h: pynvml.nvmlDeviceGetTemperature(
        h, pynvml.NVML_TEMPERATURE_GPU)),
    "fan": _per_handle(pynvml.nvmlDeviceGetFanSpeed),
    "power": _per_handle(pynvml.nvmlDeviceGetPowerUsage),
    "power_limit": _per_handle(pynvml.nvmlDeviceGetEnforcedPowerLimit),
    "clock_sm": _per_handle(lambda h: pynvml.nvmlDeviceGetClockInfo(
        h, pynvml.NVML_CLOCK_SM)),
    "clock_mem": _per_handle(lambda h: pynvml.nvmlDeviceGetClockInfo(
        h, pynvml.NVML_CLOCK_MEM)),
    "clock_graphics": _per_handle(lambda h: pynvml.nvmlDeviceGetClockInfo(
        h, pynvml.NVML_CLOCK_GRAPHICS)),
    "procs": _per_handle(pynvml.nvmlDeviceGetComputeRunningProcesses),
    "graphics_procs": _per_handle(pynvml.nvmlDeviceGetGraphicsRunningProcesses),
    "proc_util": _per_handle(lambda h: process_utilization(h)),
}


def process_utilization(handle) -> list:
    """NVML's utilisation samples of the device's processes; none (NOT_FOUND, as NVML says it) is []."""
    try:
        return pynvml.nvmlDeviceGetProcessUtilization(handle, 0)
    except pynvml.NVMLError_NotFound:
        return []


def test_process_utilization_is_one_sample_per_computing_process_given_one(nvml):
    nvml.update(procs={0: [(10, 1 << 20, 35), (11, 1 << 20)], 1: [(12, 2 << 20, 80)]})
    a, b = handles(2)
    before = time.time()
    samples = pynvml.nvmlDeviceGetProcessUtilization(a, 0)
    assert [(s.pid, s.smUtil) for s in samples] == [(10, 35)]
    assert before - 1 <= samples[0].timeStamp / 1e6 <= time.time() + 1   # microseconds since the epoch
    assert [(s.pid, s.smUtil) for s in pynvml.nvmlDeviceGetProcessUtilization(b, 0)] == [(12, 80)]
    nvml.update(procs={0: [(11, 1 << 20)]})
    assert process_utilization(a) == []


def test_every_error_field_has_a_query():
    assert set(QUERIES) | {"all"} == set(DEVICE_ERROR_FIELDS)


@pytest.mark.parametrize("field", sorted(QUERIES))
def test_per_field_errors(nvml, field):
    a, b = handles(2)
    nvml.update(errors={(1, field): pynvml.NVML_ERROR_UNKNOWN})
    with pytest.raises(pynvml.NVMLError_Unknown):
        QUERIES[field](1, b)
    QUERIES[field](0, a)  # device 0 still answers
    # Every other query on device 1 still answers.
    for other, query in QUERIES.items():
        if other != field:
            query(1, b)


def test_power_management_limit_uses_power_limit_field(nvml):
    (_, b) = handles(2)
    nvml.update(errors={(1, "power_limit"): pynvml.NVML_ERROR_NO_PERMISSION})
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetPowerManagementLimit(b)


def test_init_driver_not_loaded(fake):
    fake.update(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert init_refcount() == 0
    # Nothing works without a successful init.
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_global_error_fields(nvml):
    nvml.update(errors={"count": pynvml.NVML_ERROR_GPU_IS_LOST,
                        "driver_version": pynvml.NVML_ERROR_NO_PERMISSION})
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlDeviceGetHandleByIndex(1)  # handles are a separate field
    nvml.update(errors={"init": pynvml.NVML_ERROR_DRIVER_NOT_LOADED})
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()


def test_library_not_found_after_unload(fake):
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("a real libnvidia-ml.so.1 is installed here")
    unload_from_pynvml()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    assert pynvml.nvmlLib is None
    # Without a library, calls fail as uninitialised, never crash.
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_calls_before_init_and_after_shutdown_are_uninitialized(fake):
    for call in (pynvml.nvmlDeviceGetCount, pynvml.nvmlSystemGetDriverVersion,
                 lambda: pynvml.nvmlDeviceGetHandleByIndex(0)):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            call()
    pynvml.nvmlInit()
    (a,) = handles(1)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetPowerUsage(a)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_init_is_reference_counted(fake):
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    assert init_refcount() == 2
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 2  # one init still outstanding
    pynvml.nvmlShutdown()
    assert init_refcount() == 0


def test_index_out_of_range_is_invalid_argument(nvml):
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)


def test_unreadable_config_is_loud(fake, monkeypatch, tmp_path):
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "missing.conf"))
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()


def test_no_config_means_no_gpus(fake, monkeypatch):
    monkeypatch.delenv(CONFIG_ENV)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 0


def test_memory_v2_checks_struct_version(nvml):
    (a,) = handles(1)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(a, version=0x01000028)


# -- processes ------------------------------------------------------------


def test_process_lists(nvml):
    nvml.update(procs={0: [(1234, 500 * MIB), (4321, None)]},
                graphics_procs={1: [(777, 3 * MIB)]})
    a, b = handles(2)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(a)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(1234, 500 * MIB),
                                                         (4321, None)]
    # MIG off: NVML reports "no instance" ids.
    assert procs[0].gpuInstanceId == 0xFFFFFFFF
    assert procs[0].computeInstanceId == 0xFFFFFFFF
    v2 = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(a)
    assert [(p.pid, p.usedGpuMemory) for p in v2] == [(1234, 500 * MIB),
                                                      (4321, None)]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(b) == []
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(a) == []
    g = pynvml.nvmlDeviceGetGraphicsRunningProcesses(b)
    assert [(p.pid, p.usedGpuMemory) for p in g] == [(777, 3 * MIB)]


def test_process_two_call_protocol(nvml):
    nvml.update(procs={1: [(100 + i, i * MIB) for i in range(40)]})
    (_, b) = handles(2)
    fn = pynvml.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ctypes.c_uint(0)
    assert fn(b, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 40
    small = (pynvml.c_nvmlProcessInfo_v3_t * 10)()
    count.value = 10
    assert fn(b, ctypes.byref(count), small) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 40
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(b)
    assert [p.pid for p in procs] == list(range(100, 140))
    assert procs[-1].usedGpuMemory == 39 * MIB


# -- changes mid-run ------------------------------------------------------


def test_gpu_lost_mid_run(nvml):
    a, b = handles(2)
    assert pynvml.nvmlDeviceGetPowerUsage(b) == 250_000
    nvml.update(errors={(1, "all"): pynvml.NVML_ERROR_GPU_IS_LOST})
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(b)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUtilizationRates(b)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetPowerUsage(a) == 123_000
    # A field-specific code beats "all".
    nvml.update(errors={(1, "all"): pynvml.NVML_ERROR_GPU_IS_LOST,
                        (1, "temp"): pynvml.NVML_ERROR_NOT_SUPPORTED})
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperature(b, pynvml.NVML_TEMPERATURE_GPU)
    # And it comes back.
    nvml.update(errors={})
    assert pynvml.nvmlDeviceGetPowerUsage(b) == 250_000


def test_device_count_changes_mid_run(nvml):
    a, b = handles(2)
    nvml.update(devices=[DEV_A])
    assert pynvml.nvmlDeviceGetCount() == 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(1)
    # A handle to a device that vanished behaves like a lost GPU.
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(b)
    assert pynvml.nvmlDeviceGetName(a) == "NVIDIA Fake A100 80GB"

    nvml.update(devices=[DEV_A, DEV_B, dict(DEV_B, name="FakeGPU-C")])
    assert pynvml.nvmlDeviceGetCount() == 3
    assert pynvml.nvmlDeviceGetName(handles(3)[2]) == "FakeGPU-C"
    assert pynvml.nvmlDeviceGetName(b) == "FakeGPU-B"


def test_values_change_mid_run(nvml):
    (a,) = handles(1)
    assert pynvml.nvmlDeviceGetUtilizationRates(a).gpu == 37
    nvml.update(devices=[dict(DEV_A, util_gpu=88), DEV_B])
    assert pynvml.nvmlDeviceGetUtilizationRates(a).gpu == 88


def test_concurrent_queries_while_config_is_rewritten(nvml):
    """Readers on threads never see a torn file or a crash."""
    a, b = handles(2)
    failures = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                assert pynvml.nvmlDeviceGetUtilizationRates(a).gpu in (37, 50)
                pynvml.nvmlDeviceGetPowerUsage(b)
            except pynvml.NVMLError_NotSupported:
                pass
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(e)
                return

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(200):
        if i % 2:
            nvml.set(devices=[DEV_A, DEV_B])
        else:
            nvml.set(devices=[dict(DEV_A, util_gpu=50), DEV_B],
                     errors={(1, "power"): pynvml.NVML_ERROR_NOT_SUPPORTED})
    stop.set()
    for t in threads:
        t.join()
    assert failures == []


# -- the Python helper ----------------------------------------------------


def test_build_is_cached(fake_lib, tmp_path):
    assert build(tmp_path) == fake_lib


def test_fakenvml_validates(tmp_path):
    fake = FakeNVML(tmp_path / "c.conf")
    with pytest.raises(ValueError, match="unknown keys"):
        fake.set(devices=[{"util": 5}])
    with pytest.raises(ValueError, match="unknown device error field"):
        fake.set(devices=[{}], errors={(0, "pwr"): 3})
    with pytest.raises(ValueError, match="unknown global error field"):
        fake.set(errors={"power": 3})
    with pytest.raises(ValueError, match="one line"):
        fake.set(devices=[{"name": "a\nb"}])
    with pytest.raises(TypeError):
        fake.update(device=[])
    # A rejected configuration leaves the previous file in place.
    assert "device" not in fake.text()
    assert fake.env == {CONFIG_ENV: str(tmp_path / "c.conf")}
