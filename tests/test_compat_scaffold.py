"""scaffold's SystemMonitor as its users' code sees it: what is published,
when, under which keys and types, and what the attributes hold.

Every test runs over the stand-in NVML library (no GPU unless the test
configures one), so the real machine's GPUs change nothing here."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pynvml
import pytest

from helpers import nbmon_threads, wait_until
from nbmon import AbstractBackendSender, CSVSender, JSONLinesSender, SystemMonitor

MIB = 1 << 20
GIB = 1 << 30
# scaffold's keys without a GPU, in its order.
KEYS = ["cpu", "memory", "network", "disk", "proc.memory.availableMB", "proc.memory.rssMB",
        "proc.memory.percent", "proc.cpu.threads"]
UTIL_GROUP = ("gpu", "memory", "memoryAllocated", "temp")
POWER_GROUP = ("powerWatts", "powerPercent")
DEV_A = dict(util_gpu=37, util_mem=12, mem_total=80 * GIB, mem_used=1536 * MIB, temp=55,
             power_mw=123_456, power_limit_mw=700_000)
DEV_B = dict(util_gpu=99, util_mem=64, mem_total=24 * GIB, mem_used=12 * GIB, temp=81,
             power_mw=250_000, power_limit_mw=500_000)


@pytest.fixture(autouse=True)
def gpus(fake_gpu):
    """The stand-in NVML: no device until a test sets some."""
    return fake_gpu


class Collect(AbstractBackendSender):
    """A real backend sender: keeps what it is sent."""

    def __init__(self):
        self.events: list[dict] = []
        self.lock = threading.Lock()

    def publish(self, event, **kwargs) -> None:
        with self.lock:
            self.events.append(event)

    def count(self) -> int:
        with self.lock:
            return len(self.events)


@pytest.fixture
def sender():
    return Collect()


def publish_n(sm: SystemMonitor, sender: Collect, n: int) -> list[dict]:
    sm.start()
    try:
        wait_until(lambda: sender.count() >= n, timeout=30.0, what=f"{n} published dict(s)")
    finally:
        sm.shutdown()
    return list(sender.events)


# -- when things are set and published ---------------------------------------------


def test_gpu_count_and_network_init_are_set_on_construction(gpus, sender):
    gpus.set(devices=[DEV_A, DEV_B])
    before = psutil.net_io_counters()
    sm = SystemMonitor(os.getpid(), sender)
    after = psutil.net_io_counters()
    assert sm.gpu_count == 2
    assert set(sm.network_init) == {"sent", "recv"}
    assert all(type(v) is int for v in sm.network_init.values())
    # psutil's counters of every interface, loopback included, as scaffold reads them.
    assert before.bytes_sent <= sm.network_init["sent"] <= after.bytes_sent
    assert before.bytes_recv <= sm.network_init["recv"] <= after.bytes_recv
    assert sm.sampler == {} and sm._thread is None
    assert not nbmon_threads() and sender.events == []  # constructing starts and sends nothing


def test_the_first_dict_is_published_at_start_not_after_a_period(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=60)
    sm.start()
    try:
        # Well within the 60 s period: the one published as the monitor starts.
        wait_until(lambda: sender.count() >= 1, timeout=20.0, what="the dict published at start")
        assert list(sender.events[0]) == KEYS
        assert sm.sampler == sender.events[0]
        store = sm.monitor.store
        sm.start()  # a second start is a no-op: the same run goes on
        assert sm.monitor.store is store and sender.count() == 1
    finally:
        sm.shutdown()


def test_then_one_dict_per_period(sender):
    period = 0.3
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=period)
    t0 = time.monotonic()
    events = publish_n(sm, sender, 5)
    elapsed = time.monotonic() - t0
    # At start, one per period, one at shutdown: never more.
    assert 5 <= len(events) <= elapsed / period + 2
    assert all(list(e) == KEYS for e in events)
    assert sm.published == len(events)


def test_flush_publishes_the_latest_dict_again(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=60)
    sm.start()
    try:
        wait_until(lambda: sender.count() >= 1, timeout=20.0, what="the dict published at start")
        sm.flush()
        assert sender.count() == 2
        assert sender.events[1] == sender.events[0] == sm.sampler
        assert sender.events[1] is not sender.events[0]  # each publish gets its own dict
    finally:
        sm.shutdown()


def test_shutdown_publishes_once_more_and_stops(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=60)
    sm.start()
    wait_until(lambda: sender.count() >= 1, timeout=20.0, what="the dict published at start")
    sm.shutdown()
    assert sender.count() == 2
    assert list(sender.events[1]) == KEYS
    assert not sm.monitor.running and not nbmon_threads()
    sm.shutdown()  # already stopped: publishes the latest dict once more, as scaffold does
    assert sender.count() == 3 and sender.events[2] == sender.events[1]


def test_thread_is_a_read_only_view_while_running(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=60)
    assert sm._thread is None
    sm.start()
    try:
        thread = sm._thread
        assert thread.is_alive() and thread.daemon is True
        with pytest.raises(AttributeError):
            thread.daemon = False
    finally:
        sm.shutdown()
    assert not thread.is_alive()
    assert sm._thread is None


# -- keys, types and meanings ------------------------------------------------------------


def test_network_is_nested_bytes_since_construction(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.3)
    payload = 4 * MIB
    sm.start()
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            client = socket.create_connection(server.getsockname())
            peer, _ = server.accept()
            with client, peer:
                chunk = b"x" * (64 << 10)  # each read before the next send: no buffer fills up
                for _ in range(payload // len(chunk)):
                    client.sendall(chunk)
                    got = 0
                    while got < len(chunk):
                        got += len(peer.recv(len(chunk)))

        def moved():
            network = sender.events[-1]["network"] if sender.count() else {}
            return network.get("sent", 0) >= payload and network.get("recv", 0) >= payload

        wait_until(moved, timeout=20.0, what="the loopback transfer in a published dict")
    finally:
        sm.shutdown()
    for event in sender.events:
        assert set(event["network"]) == {"sent", "recv"}
        assert all(type(v) is int and v >= 0 for v in event["network"].values())


def test_rank_prefixes_the_top_level_keys(sender):
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.3, rank=1)
    event = publish_n(sm, sender, 1)[0]
    assert list(event) == [f"rank1.{k}" for k in KEYS]
    assert set(event["rank1.network"]) == {"sent", "recv"}


def test_types_are_scaffolds(gpus, sender):
    gpus.set(devices=[DEV_A])
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.3)
    event = publish_n(sm, sender, 1)[0]
    ints = {"proc.cpu.threads", "gpu.0.gpu", "gpu.0.memory", "gpu.0.temp"}
    for key, value in event.items():
        if key == "network":
            continue
        assert type(value) is (int if key in ints else float), (key, value)
    assert (event["gpu.0.gpu"], event["gpu.0.memory"], event["gpu.0.temp"]) == (37, 12, 55)
    assert event["gpu.0.memoryAllocated"] == pytest.approx(1536 / (80 * 1024) * 100)
    assert event["gpu.0.powerWatts"] == pytest.approx(123.456)
    assert event["gpu.0.powerPercent"] == pytest.approx(123.456 / 700 * 100)


def test_a_gpus_keys_come_in_scaffolds_two_groups_or_not_at_all(gpus, sender):
    gpus.set(devices=[DEV_A, DEV_B, DEV_A],
             errors={(1, "power"): pynvml.NVML_ERROR_NOT_SUPPORTED,  # no power group
                     (2, "temp"): pynvml.NVML_ERROR_UNKNOWN})         # no utilisation group
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.3)
    with pytest.warns(RuntimeWarning, match="GPU 2: NVML temperature query failed"):  # said, not silent
        event = publish_n(sm, sender, 1)[0]
    gpu_keys = ([f"gpu.0.{k}" for k in UTIL_GROUP + POWER_GROUP] + [f"gpu.1.{k}" for k in UTIL_GROUP]
                + [f"gpu.2.{k}" for k in POWER_GROUP])
    assert set(event) == set(gpu_keys + KEYS)
    assert list(event) == gpu_keys + KEYS  # in scaffold's order


def test_a_group_that_fails_later_keeps_its_last_values(gpus, sender):
    gpus.set(devices=[DEV_A])
    sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.3)
    sm.start()
    try:
        wait_until(lambda: sender.count() >= 1, timeout=20.0, what="the dict published at start")
        # The utilisation group's temperature read now fails while its figures move on.
        gpus.update(devices=[dict(DEV_A, util_gpu=90, power_mw=200_000)],
                    errors={(0, "temp"): pynvml.NVML_ERROR_UNKNOWN})
        wait_until(lambda: sender.count() >= 1 and sender.events[-1]["gpu.0.powerWatts"] == 200.0,
                   timeout=20.0, what="a period wholly after the change")
        published = sender.count()
        wait_until(lambda: sender.count() > published, timeout=20.0, what="one more period")
    finally:
        with pytest.warns(RuntimeWarning, match="GPU 0: NVML temperature query failed"):  # said, not silent
            sm.shutdown()
    last = sender.events[-1]
    # The group is never published with the new utilisation: its keys keep
    # the values of the last period that read all of them.
    assert last["gpu.0.temp"] == 55
    assert all(e["gpu.0.gpu"] < 90 for e in sender.events)
    assert last["gpu.0.gpu"] == sender.events[-2]["gpu.0.gpu"]


# -- proc.* is the pid alone; the whole tree only when asked --------------------------------

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "import sys; b = b'x' * (150 << 20); print('ready', flush=True); sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


@pytest.fixture
def parent_of_a_big_child():
    """A small process whose child holds 150 MiB: (parent, child) psutil processes."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    child_pid = int(proc.stdout.readline())
    yield psutil.Process(proc.pid), psutil.Process(child_pid)
    proc.stdin.close()
    proc.wait(30)


def test_proc_keys_are_the_pid_alone(parent_of_a_big_child, sender):
    parent, child = parent_of_a_big_child
    sm = SystemMonitor(parent.pid, sender, sample_rate_seconds=0.3)
    event = publish_n(sm, sender, 2)[1]
    parent_mb = parent.memory_info().rss / MIB
    assert event["proc.memory.rssMB"] == pytest.approx(parent_mb, abs=2.0)
    assert event["proc.memory.rssMB"] < 100  # the child's 150 MiB are not in it
    assert event["proc.cpu.threads"] == parent.num_threads()
    total_mb = psutil.virtual_memory().total / MIB
    assert event["proc.memory.percent"] == pytest.approx(event["proc.memory.rssMB"] / total_mb * 100, rel=1e-3)
    assert list(event) == KEYS  # no tree keys unless asked


def test_tree_true_adds_the_whole_tree_under_its_own_keys(parent_of_a_big_child, sender):
    parent, child = parent_of_a_big_child
    sm = SystemMonitor(parent.pid, sender, sample_rate_seconds=0.3, tree=True)
    event = publish_n(sm, sender, 2)[1]
    tree_keys = ["proc.tree.memory.rssMB", "proc.tree.memory.percent", "proc.tree.cpu.threads"]
    assert list(event) == KEYS + tree_keys
    assert event["proc.memory.rssMB"] < 100  # the seed keys keep their meaning
    both_mb = (parent.memory_info().rss + child.memory_info().rss) / MIB
    assert event["proc.tree.memory.rssMB"] == pytest.approx(both_mb, abs=4.0)
    assert event["proc.tree.cpu.threads"] == parent.num_threads() + child.num_threads()
    assert type(event["proc.tree.cpu.threads"]) is int


# -- nbmon's file senders take scaffold's dicts -------------------------------------------


def test_file_senders_write_the_nested_network(tmp_path):
    for path, sender in ((tmp_path / "m.csv", CSVSender(tmp_path / "m.csv")),
                         (tmp_path / "m.jsonl", JSONLinesSender(tmp_path / "m.jsonl"))):
        sm = SystemMonitor(os.getpid(), sender, sample_rate_seconds=60)
        sm.start()
        wait_until(lambda: sm.published >= 1, timeout=20.0, what="the dict published at start")
        sm.shutdown()
        sender.close()
        lines = path.read_text().splitlines()
        if path.suffix == ".csv":
            header = lines[0].split(",")
            assert "network.sent" in header and "network.recv" in header and len(lines) == 3
            row = dict(zip(header, lines[1].split(",")))
            assert float(row["network.sent"]) >= 0
        else:
            first = json.loads(lines[0])
            assert list(first) == KEYS and set(first["network"]) == {"sent", "recv"}
