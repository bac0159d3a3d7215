"""The container's limits: a real cgroup (v1 here: the test makes one with a
memory limit and a CPU quota, moves its processes in, and lets the kernel's
OOM killer act), and cgroup v2's files on a stand-in hierarchy (v2's memory
controller cannot exist on a host whose v1 hierarchy holds it)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid

import pytest

from helpers import wait_until
from nbmon.engine import Monitor
from nbmon.sources.cgroup import Cgroup, cgroup_dirs

MIB = 1 << 20
V1 = "/sys/fs/cgroup"


def make_v1(controller: str, settings: dict[str, str]) -> str:
    path = os.path.join(V1, controller, f"nbmon-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(path)
        for name, value in settings.items():
            with open(os.path.join(path, name), "w") as f:
                f.write(value)
    except OSError as err:
        pytest.skip(f"cannot make a cgroup v1 {controller} group here ({err.strerror}): needs root and cgroup v1")
    return path


def remove(path: str) -> None:
    wait_until(lambda: not open(os.path.join(path, "cgroup.procs")).read().strip(), timeout=30,
               what=f"{path} to empty")
    os.rmdir(path)


@pytest.fixture
def limited():
    """A process in a cgroup limited to 300 MiB and half a CPU; it runs what
    the test writes to its stdin, one line at a time."""
    memory = make_v1("memory", {"memory.limit_in_bytes": str(300 * MIB)})
    cpu = make_v1("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"})
    shell = subprocess.Popen([sys.executable, "-u", "-c",
                              "import sys\nfor line in sys.stdin: exec(line)"],
                             stdin=subprocess.PIPE, text=True)
    for group in (memory, cpu):
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(shell.pid))
    yield shell
    shell.stdin.close()
    shell.wait(30)
    remove(memory)
    remove(cpu)


def run_in(shell, line: str) -> None:
    shell.stdin.write(line + "\n")
    shell.stdin.flush()


def test_limits_and_usage_of_a_real_cgroup(limited):
    dirs = cgroup_dirs(limited.pid)
    assert dirs["memory_version"] == "1" and dirs["memory"].startswith(V1)
    source = Cgroup(limited.pid)
    source.start(0.0)
    # v1 leaves what a process had before it moved in charged to its old group:
    # usage is what it allocates from now on.
    run_in(limited, "block = bytearray(50 << 20)")
    row = wait_until(lambda: (r := source.sample(time.monotonic()))["cgroup_mem_used_mb"] >= 50 and r,
                     what="the 50 MiB to be charged to the group")
    assert row["cgroup_mem_limit_mb"] == 300
    assert row["cgroup_cpu_limit_cpus"] == 0.5
    assert row["cgroup_mem_used_mb"] < 300
    assert row["cgroup_oom_kills"] == 0
    # Read on the cadence: NaN in the samples in between, never an older value.
    assert all(math.isnan(v) for v in source.sample(time.monotonic()).values())


def test_an_oom_kill_in_the_container_is_in_the_span_that_saw_it(limited):
    with Monitor(limited.pid, interval=0.05, gpu=False) as mon:
        wait_until(lambda: mon.store.seq > 3, what="samples")
        calm = mon.window().close()
        assert calm.oom_kills == 0 and calm.memory_limit_mb == 300
        with mon.window() as span:
            # A child of the limited process asks for more than the limit: the kernel kills it.
            run_in(limited, "import subprocess; subprocess.run([sys.executable, '-c', "
                            "'b = bytearray(400 << 20)'])")
            kills = Cgroup(limited.pid)
            kills.start(0.0)
            wait_until(lambda: kills.sample(time.monotonic())["cgroup_oom_kills"] >= 1,
                       what="the OOM killer")
        summary = span.summary()
    assert summary.oom_kills == 1 and summary.memory_limit_mb == 300
    rows = dict(summary.rows())
    # The container's limit stands beside the container's own usage at its highest.
    assert rows["Container memory peak / limit"].endswith(" of 300 MiB") and rows["OOM kills (container)"] == "1"
    assert 0 < summary.peak_container_mem_mb <= 300
    assert limited.poll() is None  # the limited process itself lives on


def test_cpu_is_normalised_by_the_cgroups_quota(limited):
    with Monitor(limited.pid, interval=0.1, gpu=False) as mon:
        run_in(limited, "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass")
        time.sleep(0.05)
        wait_until(lambda: mon.latest().get("proc_cpu_percent", 0) > 20, what="the busy loop")
        time.sleep(1.5)
    _t, _w, v = mon.store.series(["proc_cpu_percent", "proc_cpu_norm_percent"])
    busy = v["proc_cpu_percent"] > 5
    # The quota allows half a CPU: using it all is 100 % of what it may use.
    assert busy.sum() >= 5
    assert v["proc_cpu_percent"][busy].max() <= 60
    assert (v["proc_cpu_norm_percent"][busy] == v["proc_cpu_percent"][busy] / 0.5).all()


def v2_group(root, nested: str, files: dict[str, str]) -> str:
    path = root
    for part in ["", *nested.split("/")]:
        path = os.path.join(path, part) if part else path
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "cgroup.procs"), "a").close()
    for name, text in files.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
    return path


def test_cgroup_v2_files(tmp_path):
    root = str(tmp_path)
    v2_group(root, "kubepods", {"memory.max": f"{512 * MIB}\n", "cpu.max": "200000 100000\n"})
    pod = v2_group(root, "kubepods/pod1", {
        "memory.current": f"{123 * MIB}\n", "memory.max": "max\n", "cpu.max": "max 100000\n",
        "memory.events": "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"})
    source = Cgroup(dirs={"memory": pod, "memory_version": "2", "cpu": pod, "cpu_version": "2"})
    source.start(0.0)
    row = source.sample(0.0)
    # The limit in effect is the parent's: the pod itself says "max".
    assert row == {"cgroup_mem_used_mb": 123.0, "cgroup_mem_limit_mb": 512.0,
                   "cgroup_oom_kills": 2.0, "cgroup_cpu_limit_cpus": 2.0}


def test_no_limit_reads_as_unknown(tmp_path):
    group = v2_group(str(tmp_path), "user", {"memory.current": "1048576\n", "memory.max": "max\n",
                                             "cpu.max": "max 100000\n", "memory.events": "oom_kill 0\n"})
    source = Cgroup(dirs={"memory": group, "memory_version": "2", "cpu": group, "cpu_version": "2"})
    source.start(0.0)
    row = source.sample(0.0)
    assert row["cgroup_mem_used_mb"] == 1.0
    assert math.isnan(row["cgroup_mem_limit_mb"]) and math.isnan(row["cgroup_cpu_limit_cpus"])
