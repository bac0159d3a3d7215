"""Only the GPUs a process may use (CUDA_VISIBLE_DEVICES), through the real
pynvml on the stand-in NVML library: three fake devices with known UUIDs."""
from __future__ import annotations

import pytest

from nbmon.sources.gpus import GPUs

UUIDS = ["GPU-aaaa0000-0000", "GPU-bbbb1111-1111", "GPU-cccc2222-2222"]


@pytest.fixture
def three(fake_gpu):
    fake_gpu.set(devices=[{"util_gpu": 10 * (i + 1), "mem_total": 8 << 30, "mem_used": (i + 1) << 30,
                           "uuid": uuid} for i, uuid in enumerate(UUIDS)])
    return fake_gpu


def devices_for(monkeypatch, spec):
    if spec is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    gpus = GPUs()
    gpus.start(0.0)
    try:
        values = gpus.sample(0.0)
        return [d.index for d in gpus.devices], gpus.fields, values, gpus.state
    finally:
        gpus.close()


@pytest.mark.parametrize("spec, expected", [
    (None, [0, 1, 2]),
    ("1", [1]),
    ("2,0", [2, 0]),                    # CUDA's order; each keeps its NVML index
    ("GPU-bbbb1111", [1]),              # a UUID prefix
    ("cccc2222-2222", [2]),             # without "GPU-"
    (" 0 , GPU-cccc2222-2222", [0, 2]),
    ("0,7,1", [0]),                     # CUDA ends the list at the first entry naming no device
    ("0,0", [0]),
    ("MIG-0aaa-1111", [0, 1, 2]),       # MIG instances are not resolved: every device
])
def test_visible_devices(three, monkeypatch, spec, expected):
    indices, fields, values, state = devices_for(monkeypatch, spec)
    assert indices == expected and state == "ok"
    assert {int(f[3]) for f in fields if f.startswith("gpu") and f[3].isdigit()} == set(expected)
    # the totals are over the visible devices only
    assert values["gpu_mem_used_mb"] == sum((i + 1) * 1024 for i in expected)


@pytest.mark.parametrize("spec", ["", "5", "GPU-ffff", "-1"])
def test_no_device_visible_says_why(three, monkeypatch, spec):
    indices, fields, values, state = devices_for(monkeypatch, spec)
    assert indices == [] and fields == () and values == {}
    assert state == f"no GPU visible to this process (CUDA_VISIBLE_DEVICES={spec!r})"
