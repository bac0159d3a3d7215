"""nbmon.sources.gpus.nvml over the fake NVML library, through the real pynvml module."""
from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
import threading

import pynvml
import pytest

import nbmon
import nbmon.sources.gpus.nvml as nvml
from nbmon.sources.gpus import GPUs
from nbmon import catalog
from fake_nvml import init_refcount, unload_from_pynvml
from helpers import in_forked_child, wait_until
from nbmon.engine import Monitor

MIB = 1 << 20
GIB = 1 << 30
TOTALS = catalog.names(catalog.GPU)            # all GPUs together
PER_DEVICE = catalog.names(catalog.DEVICE)     # each GPU: column gpu<i>_<name>

DEV_A = dict(name="FakeGPU-A", util_gpu=37, util_mem=12, mem_total=80 * GIB,
             mem_used=1536 * MIB, temp=55, power_mw=123_456, power_limit_mw=700_000,
             sm_clock=1980, mem_clock=2619)
DEV_B = dict(name="FakeGPU-B", util_gpu=99, util_mem=64, mem_total=24 * GIB,
             mem_used=20 * GIB, temp=81, power_mw=250_000, power_limit_mw=300_000,
             sm_clock=1410, mem_clock=1215)


def started(tree_pids=lambda: ()) -> GPUs:
    gpus = GPUs(tree_pids=tree_pids)
    gpus.start(0.0)
    return gpus


def read(gpus: GPUs) -> dict[str, float]:
    row = gpus.sample(0.0)
    assert set(row) == set(gpus.fields)
    return row


def is_nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def no_real_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return True
    return False


# -- values -----------------------------------------------------------------


def test_two_devices_per_device_fields_and_totals(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    gpus = started()
    assert nvml.status() == "ok" and gpus.state == "ok"
    assert nvml._device_count == 2
    assert gpus.fields[:len(TOTALS)] == TOTALS
    assert set(gpus.fields) == set(TOTALS) | {catalog.device_column(i, f) for i in (0, 1) for f in PER_DEVICE}
    v = read(gpus)

    assert v["gpu0_util_percent"] == 37 and v["gpu1_util_percent"] == 99
    assert v["gpu0_mem_util_percent"] == 12 and v["gpu1_mem_util_percent"] == 64
    assert v["gpu0_mem_used_mb"] == 1536.0 and v["gpu1_mem_used_mb"] == 20 * 1024.0  # MiB
    assert v["gpu0_mem_total_mb"] == 80 * 1024.0 and v["gpu1_mem_total_mb"] == 24 * 1024.0
    assert v["gpu0_power_w"] == pytest.approx(123.456)  # W from mW
    assert v["gpu1_power_w"] == 250.0
    assert v["gpu0_power_limit_w"] == 700.0 and v["gpu1_power_limit_w"] == 300.0
    assert v["gpu0_sm_clock_mhz"] == 1980 and v["gpu1_sm_clock_mhz"] == 1410
    assert v["gpu0_mem_clock_mhz"] == 2619 and v["gpu1_mem_clock_mhz"] == 1215
    assert v["gpu0_temp_c"] == 55 and v["gpu1_temp_c"] == 81

    assert v["gpu_util_percent"] == (37 + 99) / 2          # mean of rates
    assert v["gpu_mem_used_mb"] == 1536.0 + 20 * 1024.0    # sum of amounts
    assert v["gpu_power_w"] == pytest.approx(123.456 + 250.0)
    assert v["gpu_sm_clock_mhz"] == (1980 + 1410) / 2
    # No tree pids given: the tree's GPU memory is unknown, not 0.
    assert is_nan(v["gpu_proc_mem_mb"]) and is_nan(v["gpu0_proc_mem_mb"])


def test_values_are_read_afresh_every_sample(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    gpus = started()
    assert read(gpus)["gpu1_util_percent"] == 99
    fake_gpu.update(devices=[DEV_A, dict(DEV_B, util_gpu=3, power_mw=1_500)])
    v = read(gpus)
    assert v["gpu1_util_percent"] == 3 and v["gpu1_power_w"] == 1.5
    assert v["gpu_util_percent"] == 20


def test_not_supported_power_is_nan_for_that_field_only_and_not_asked_again(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B],
                 errors={(1, "power"): pynvml.NVML_ERROR_NOT_SUPPORTED})
    gpus = started()
    v = read(gpus)
    assert is_nan(v["gpu1_power_w"])
    assert v["gpu0_power_w"] == pytest.approx(123.456)
    # Everything else of device 1 is fine, power limit included.
    for f in ("util_percent", "mem_used_mb", "temp_c", "power_limit_w", "sm_clock_mhz"):
        assert not is_nan(v[f"gpu1_{f}"]), f
    assert v["gpu1_temp_c"] == 81 and v["gpu1_power_limit_w"] == 300.0
    assert v["gpu_power_w"] == pytest.approx(123.456)  # the total skips the unknown
    assert gpus.state == "ok"

    # The driver would now answer, but a NotSupported query is never asked again.
    fake_gpu.update(errors={}, devices=[dict(DEV_A, power_mw=50_000), DEV_B])
    v = read(gpus)
    assert is_nan(v["gpu1_power_w"])
    assert v["gpu0_power_w"] == 50.0


def test_unknown_errors_give_nan_and_are_asked_again(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B],
                 errors={(0, "util"): pynvml.NVML_ERROR_UNKNOWN,
                         (1, "memory"): pynvml.NVML_ERROR_UNKNOWN,
                         (1, "clock_sm"): pynvml.NVML_ERROR_TIMEOUT})
    gpus = started(tree_pids=lambda: (os.getpid(),))
    v = read(gpus)
    assert is_nan(v["gpu0_util_percent"]) and is_nan(v["gpu0_mem_util_percent"])
    assert is_nan(v["gpu1_mem_used_mb"]) and is_nan(v["gpu1_mem_total_mb"])
    assert is_nan(v["gpu1_sm_clock_mhz"])
    assert v["gpu0_mem_used_mb"] == 1536.0 and v["gpu1_util_percent"] == 99
    assert v["gpu_util_percent"] == 99          # mean of what is known
    assert v["gpu_mem_used_mb"] == 1536.0
    assert gpus.state == "ok"
    # Said, for the run's faults: which query of which GPU failed, and how.
    assert gpus.drain_faults() == ["GPU 0: NVML utilization query failed: Unknown Error",
                                   "GPU 1: NVML memory query failed: Unknown Error",
                                   "GPU 1: NVML sm_clock query failed: Timeout"]
    assert gpus.drain_faults() == []
    # A transient error is asked again: the values come back.
    fake_gpu.update(errors={})
    v = read(gpus)
    assert v["gpu0_util_percent"] == 37 and v["gpu1_mem_used_mb"] == 20 * 1024.0
    assert v["gpu1_sm_clock_mhz"] == 1410


def test_gpu_lost_mid_run(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    gpus = started()
    assert read(gpus)["gpu1_util_percent"] == 99
    fake_gpu.update(errors={(1, "all"): pynvml.NVML_ERROR_GPU_IS_LOST})
    v = read(gpus)
    assert all(is_nan(v[f"gpu1_{f}"]) for f in PER_DEVICE)
    assert v["gpu0_util_percent"] == 37 and v["gpu0_mem_used_mb"] == 1536.0
    assert v["gpu_util_percent"] == 37 and v["gpu_mem_used_mb"] == 1536.0
    assert gpus.state == "GPU 1 lost"


def test_device_count_changing_mid_run_does_not_crash(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    gpus = started()
    fields = gpus.fields
    fake_gpu.update(devices=[DEV_A])           # device 1 fell off the bus
    v = read(gpus)
    assert gpus.fields == fields
    assert v["gpu0_util_percent"] == 37 and is_nan(v["gpu1_util_percent"])
    fake_gpu.update(devices=[DEV_A, DEV_B, dict(DEV_B, name="FakeGPU-C")])
    v = read(gpus)
    assert gpus.fields == fields               # the field set is fixed for the run
    assert v["gpu0_util_percent"] == 37


def test_device_count_changing_under_a_running_monitor(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    mon = Monitor(interval=0.02, system=False)
    mon.start()
    try:
        seq = wait_until(lambda: mon.store.seq >= 2 and mon.store.seq, timeout=20.0, what="samples")
        fake_gpu.update(devices=[])
        wait_until(lambda: mon.store.seq >= seq + 3, timeout=20.0, what="samples after the GPUs vanished")
        fake_gpu.update(devices=[DEV_A, DEV_B, DEV_A])
        seq = mon.store.seq
        wait_until(lambda: mon.store.seq >= seq + 3, timeout=20.0, what="samples after a GPU appeared")
        assert mon.running
        # The GPUs' loss is a fault the run reports, not a silent NaN.
        assert set(mon.faults) == {"gpu"} and "GPU is lost" in mon.faults["gpu"].first_error
    finally:
        with pytest.warns(RuntimeWarning, match="gpu failed"):
            mon.stop()
    assert mon.gpu_state == "GPU 0, 1 lost"


def test_handle_error_at_start_skips_that_device(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B],
                 errors={(1, "handle"): pynvml.NVML_ERROR_GPU_IS_LOST})
    gpus = started()
    assert [d.index for d in gpus.devices] == [0]
    assert "gpu1_util_percent" not in gpus.fields
    assert read(gpus)["gpu0_util_percent"] == 37
    assert gpus.state == "GPU 1: GPU is lost"


# -- why GPU metrics are off ------------------------------------------------


def test_library_missing(fake_gpu, monkeypatch):
    if not no_real_nvml():
        pytest.skip("a real libnvidia-ml.so.1 is installed here")
    monkeypatch.delenv("NBMON_NVML_LIBRARY")
    unload_from_pynvml()
    nvml.shutdown()
    gpus = started()
    assert gpus.devices == [] and gpus.fields == () and gpus.sample(0.0) == {}
    assert nvml.status() == "NVML library not found (no NVIDIA driver installed)"
    assert gpus.state == nvml.status()
    assert nvml.init() is False and nvml._device_count == 0


def test_a_machine_without_nvml_never_imports_pynvml():
    """No NVML library: no pynvml in the process (1.9 MiB of the helper's PSS), the reason said all the same."""
    if not no_real_nvml():
        pytest.skip("a real libnvidia-ml.so.1 is installed here")
    code = ("import sys\nfrom nbmon.sources.gpus import nvml\nfrom nbmon.engine import Monitor\n"
            "m = Monitor(interval=0.05).start()\nm.stop()\n"
            "print(nvml.init(), nvml.status(), 'pynvml' in sys.modules, sep='|')")
    env = {k: v for k, v in os.environ.items() if k != "NBMON_NVML_LIBRARY"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False|NVML library not found (no NVIDIA driver installed)|False"


def test_library_path_that_does_not_exist(fake_gpu, monkeypatch, tmp_path):
    missing = str(tmp_path / "libnope-nvml.so")
    monkeypatch.setenv("NBMON_NVML_LIBRARY", missing)
    assert nvml.init() is False
    assert nvml.status().startswith(f"cannot load the NVML library: {missing}: ")
    assert started().fields == ()


def test_driver_not_loaded(fake_gpu):
    fake_gpu.set(devices=[DEV_A], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    gpus = started()
    assert gpus.devices == [] and gpus.fields == ()
    assert nvml.status() == "NVIDIA driver not loaded"
    assert init_refcount() == 0


def test_no_devices(fake_gpu):
    fake_gpu.set(devices=[])
    gpus = started()
    assert gpus.fields == () and gpus.sample(0.0) == {}
    assert nvml.status() == "no NVIDIA device found"
    assert gpus.state == "no NVIDIA device found"


@pytest.mark.parametrize("config", [dict(devices=[]),
                                    dict(devices=[DEV_A], count_error=pynvml.NVML_ERROR_UNKNOWN)])
def test_shutdown_balances_init_even_without_usable_devices(fake_gpu, config):
    fake_gpu.set(**config)
    assert nvml.init() is False
    assert nvml.status() in ("no NVIDIA device found", "NVML error: Unknown Error")
    nvml.shutdown()
    assert init_refcount() == 0


def test_init_once_per_process_even_from_many_threads(fake_gpu):
    fake_gpu.set(devices=[DEV_A])
    results = []
    threads = [threading.Thread(target=lambda: results.append(nvml.init())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [True] * 8
    assert init_refcount() == 1
    nvml.shutdown()
    assert init_refcount() == 0 and nvml.status() == "not initialised"


# -- the monitored tree's GPU memory ------------------------------------------


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    yield proc
    proc.stdin.close()
    proc.wait(10)


def test_process_memory_counts_only_the_monitored_tree(fake_gpu, child):
    other = 1  # init: never part of this tree
    fake_gpu.set(devices=[DEV_A, DEV_B],
                 procs={0: [(os.getpid(), 100 * MIB), (other, 4000 * MIB), (child.pid, 50 * MIB)],
                        1: [(child.pid, 25 * MIB), (other, 7 * MIB)]},
                 graphics_procs={1: [(other, 9 * MIB)]})
    mon = Monitor(interval=0.02, system=False)
    mon.start()
    try:
        # The child is found at start (nbmon's tree is this process and its children).
        assert {os.getpid(), child.pid} <= set(mon.sources.tree.pids)
        # (The baseline at start leaves NVML out: it is read from the sampler's thread only.)
        latest = wait_until(lambda: mon.store.seq > 1 and mon.latest(), timeout=20.0, what="a sample")
    finally:
        mon.stop()
    assert latest["gpu0_proc_mem_mb"] == 150.0
    assert latest["gpu1_proc_mem_mb"] == 25.0
    assert latest["gpu_proc_mem_mb"] == 175.0
    assert mon.summary().peak_proc_gpu_mem_mb == 175.0


def test_process_in_both_compute_and_graphics_lists_is_counted_once(fake_gpu):
    # NVML lists a process with both contexts ("C+G") in both lists, each time
    # with the process's whole memory on the device.
    fake_gpu.set(devices=[DEV_A],
                 procs={0: [(os.getpid(), 300 * MIB)]},
                 graphics_procs={0: [(os.getpid(), 300 * MIB)]})
    v = read(started(tree_pids=lambda: (os.getpid(),)))
    assert v["gpu0_proc_mem_mb"] == 300.0


def test_tree_without_gpu_processes_reads_zero(fake_gpu):
    fake_gpu.set(devices=[DEV_A], procs={0: [(1, 10 * MIB)]})
    v = read(started(tree_pids=lambda: (os.getpid(),)))
    assert v["gpu0_proc_mem_mb"] == 0.0 and v["gpu_proc_mem_mb"] == 0.0


# -- fork -------------------------------------------------------------------


def test_forked_child_initialises_again(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    assert nvml.init() is True
    parent = os.getpid()
    assert nvml._init_pid == parent

    answer = in_forked_child(timeout=20, body=lambda: f"{nvml.init()} {nvml._init_pid} {os.getpid()} "
                                      f"{nvml._device_count} {nvml.status()}")
    ok, init_pid, child_pid, count, status = answer.split(" ", 4)
    assert ok == "True" and init_pid == child_pid != str(parent)
    assert count == "2" and status == "ok"
    assert nvml._init_pid == parent  # the parent is untouched


def test_fork_while_another_thread_holds_the_nvml_lock(fake_gpu):
    fake_gpu.set(devices=[DEV_A])
    held, release = threading.Event(), threading.Event()

    def hold():
        with nvml._lock:
            held.set()
            release.wait(20)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        answer = in_forked_child(timeout=20, body=lambda: f"{nvml.init()} {nvml._init_pid == os.getpid()}")
    finally:
        release.set()
        t.join(10)
    assert answer == "True True"


# -- calibrax's profiler protocol ---------------------------------------------


def test_nvml_profiler_satisfies_the_protocol_with_the_seed_keys(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    p0, p1 = nbmon.NVMLProfiler(), nbmon.NVMLProfiler(1)
    assert isinstance(p0, nbmon.GPUProfilerProtocol)
    assert p0.get_utilization() == 37.0 and p1.get_utilization() == 99.0
    assert p0.get_memory_usage() == {"gpu_memory_used_mb": 1536.0, "gpu_memory_total_mb": 81920.0}
    assert p1.get_clock_info() == {"gpu_clock_mhz": 1410.0, "mem_clock_mhz": 1215.0}
    power = p0.get_power_info()
    assert set(power) == {"power_draw_w", "power_limit_w"}
    assert power["power_draw_w"] == pytest.approx(123.456) and power["power_limit_w"] == 700.0


def test_nvml_profiler_not_supported_is_nan(fake_gpu):
    fake_gpu.set(devices=[DEV_A], errors={(0, "power"): pynvml.NVML_ERROR_NOT_SUPPORTED})
    power = nbmon.NVMLProfiler().get_power_info()
    assert is_nan(power["power_draw_w"]) and power["power_limit_w"] == 700.0


@pytest.mark.parametrize("index, message", [
    (2, "device_index 2 is out of range: NVML sees 2 device(s)"),
    (-1, "device_index -1 is out of range: NVML sees 2 device(s)"),
    ("0", "device_index must be a whole number, got '0'"),
    (True, "device_index must be a whole number, got True"),
])
def test_nvml_profiler_bad_index(fake_gpu, index, message):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    with pytest.raises(ValueError) as err:
        nbmon.NVMLProfiler(index)
    assert str(err.value) == message


def test_nvml_profiler_without_gpus(fake_gpu):
    fake_gpu.set(devices=[])
    with pytest.raises(RuntimeError) as err:
        nbmon.NVMLProfiler()
    assert str(err.value) == "no NVIDIA GPU is usable: no NVIDIA device found"


def test_nvml_profiler_drives_resource_monitor(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B])
    with nbmon.ResourceMonitor(sample_interval_sec=0.02, gpu_profiler=nbmon.NVMLProfiler(1)) as mon:
        wait_until(lambda: len(mon.samples) >= 3, timeout=20.0, what="3 samples")
    s = mon.summary
    assert s.mean_gpu_util == 99.0 and s.peak_gpu_mem_mb == 20 * 1024.0
    assert s.mean_gpu_clock_mhz == 1410.0 and s.mean_gpu_power_w == 250.0
    assert all(x.gpu_util == 99.0 for x in mon.samples)


# -- the whole engine over fake GPUs ------------------------------------------


def test_monitor_with_fake_gpus(fake_gpu):
    fake_gpu.set(devices=[DEV_A, DEV_B], procs={0: [(os.getpid(), 64 * MIB)]})
    mon = Monitor(interval=0.02, gpu=True)
    mon.start()
    try:
        wait_until(lambda: mon.store.seq >= 3, timeout=20.0, what="3 samples")
    finally:
        mon.stop()
    for col in ("gpu_util_percent", "gpu_mem_used_mb", "gpu_proc_mem_mb", "gpu0_util_percent",
                "gpu1_power_w", "gpu1_temp_c", "proc_rss_mb", "sys_cpu_percent"):
        assert col in mon.fields, col
    assert mon.gpu_state == "ok" and mon.faults == {}
    s = mon.summary()
    assert s.num_samples == mon.store.seq >= 3
    assert s.peak_gpu_mem_mb == 1536.0 + 20 * 1024.0
    assert s.mean_gpu_util == 68.0
    assert s.mean_gpu_power_w == pytest.approx(373.456)
    assert s.peak_proc_gpu_mem_mb == 64.0
    assert "GPU util mean" in str(s)
