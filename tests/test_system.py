"""The Machine source on the real machine, through /proc and through psutil."""
from __future__ import annotations

import math
import time

import psutil
import pytest

from helpers import burn_cpu, fd_count
from nbmon import catalog
from nbmon.sources.machine import Machine

READERS = [pytest.param(True, id="proc"), pytest.param(False, id="psutil")]
MIB = 1024.0 * 1024.0
FIELDS = catalog.names(catalog.MACHINE)
RATES = ("sys_disk_read_bytes_per_s", "sys_disk_write_bytes_per_s", "sys_net_sent_bytes_per_s",
         "sys_net_recv_bytes_per_s")
COUNTERS = ("sys_disk_read_bytes", "sys_disk_write_bytes", "sys_net_sent_bytes", "sys_net_recv_bytes")


@pytest.fixture(params=READERS)
def system(request):
    s = Machine(use_proc=request.param)
    yield s
    s.close()


EVERY_SAMPLE = ("sys_cpu_percent", "sys_mem_used_mb", "sys_mem_available_mb", "sys_mem_total_mb",
                "sys_mem_percent", "sys_swap_used_mb")
ON_THE_CADENCE = ("sys_disk_used_percent", "sys_net_sent_bytes", "sys_net_recv_bytes", "sys_load1")


def test_fields_are_finite_where_expected(system):
    system.start(0.0)
    burn_cpu(0.2)
    row = system.sample(0.1)
    assert system.fields == FIELDS and set(row) == set(FIELDS)
    assert all(type(v) is float for v in row.values())
    for name in EVERY_SAMPLE:
        assert math.isfinite(row[name]), name
    system.boundary()  # a span's boundary reads the cadence figures too
    row = system.sample(0.2)
    for name in EVERY_SAMPLE + ON_THE_CADENCE:
        assert math.isfinite(row[name]), name
    for name in COUNTERS:  # a container may see no disk: NaN, never garbage
        assert math.isnan(row[name]) or row[name] >= 0, name


def test_memory_adds_up_and_matches_the_kernel(system):
    system.start(0.0)
    row = system.sample(0.1)
    total = row["sys_mem_total_mb"]
    assert row["sys_mem_used_mb"] + row["sys_mem_available_mb"] == pytest.approx(total, rel=1e-12)
    assert total == pytest.approx(psutil.virtual_memory().total / MIB, rel=1e-9)
    assert 0 < row["sys_mem_available_mb"] <= total
    assert row["sys_mem_percent"] == pytest.approx(row["sys_mem_used_mb"] / total * 100.0)
    assert 0 <= row["sys_mem_percent"] <= 100
    assert 0 <= row["sys_swap_used_mb"]
    assert 0 <= system.sample(1.5)["sys_disk_used_percent"] <= 100


def test_cpu_percent_is_meaningful_from_the_first_sample_and_bounded(system):
    system.start(0.0)
    burn_cpu(0.3)  # this process alone keeps one CPU busy
    first = system.sample(0.3)["sys_cpu_percent"]
    assert 0 < first <= 100
    for k in range(150):  # short intervals: some see no busy tick at all, never below 0
        cpu = system.sample(0.3 + 0.05 * (k + 1))["sys_cpu_percent"]
        assert math.isnan(cpu) or 0 <= cpu <= 100  # NaN only when no clock tick passed
        time.sleep(0.005)


def test_rates_are_per_second_over_the_slow_cadence(system):
    system.start(100.0)
    for name in RATES:  # not read yet
        assert math.isnan(system.sample(100.1)[name]), name
    first = system.sample(101.5)  # past slow_every_s=1.0
    later = system.sample(103.0)
    for rate, counter in zip(RATES, COUNTERS):
        if math.isnan(later[counter]):
            assert math.isnan(later[rate])
        else:
            assert math.isfinite(later[rate]) and later[rate] >= 0, rate
            # Over exactly the fake 1.5 s between the two slow refreshes.
            grown = later[counter] - first[counter]
            assert later[rate] == pytest.approx(grown / 1.5), rate
    assert math.isfinite(later["sys_net_sent_bytes_per_s"])


def test_memory_is_read_every_sample_and_cadence_figures_only_when_read(system):
    """No value is stamped with a time later than its reading: memory is read
    every sample; what is read on the cadence is NaN in the samples between."""
    system.start(0.0)
    blocks = []
    for t in (0.2, 0.4, 0.6):
        blocks.append(bytearray(200 << 20))  # touched: the machine's memory moves between samples
        before = psutil.virtual_memory().available / MIB
        row = system.sample(t)
        after = psutil.virtual_memory().available / MIB
        # The kernel's figure at the sample's time, not one held from an earlier read.
        assert min(before, after) - 20 <= row["sys_mem_available_mb"] <= max(before, after) + 20
        for name in ON_THE_CADENCE + RATES:
            assert math.isnan(row[name]), name
    del blocks


@pytest.mark.parametrize("use_proc", [True, False], ids=["proc", "psutil"])
def test_no_file_descriptor_leak(use_proc):
    before = fd_count()
    for k in range(5):
        s = Machine(use_proc=use_proc)
        s.start(float(k))
        s.sample(k + 2.0)
        s.close()
        s.close()  # twice is harmless
    assert fd_count() == before
