"""A memory cgroup made by a test: the kernel's own account of what a group
of processes charged (usage, and its exact peak), for ground truth that
nbmon does not compute. cgroup v1 (this machine) or v2 (a host whose
cgroup2 mount has the memory controller); skips only where neither can be
made (not root)."""
from __future__ import annotations

import os
import uuid

import pytest

from helpers import wait_until

V1 = "/sys/fs/cgroup/memory"
V2 = "/sys/fs/cgroup"


def _v2_memory() -> bool:
    try:
        with open(os.path.join(V2, "cgroup.subtree_control")) as f:
            return "memory" in f.read().split()
    except OSError:
        return False


class MemoryCgroup:
    """``with MemoryCgroup(limit_mb=...) as group: group.add(pid)``; the
    group is removed at the end (once its processes are gone)."""

    def __init__(self, limit_mb: float | None = None):
        name = f"nbmon-test-{uuid.uuid4().hex[:8]}"
        if os.path.isdir(V1):
            self.path, self.version = os.path.join(V1, name), 1
        elif _v2_memory():
            self.path, self.version = os.path.join(V2, name), 2
        else:
            pytest.skip("no memory cgroup hierarchy to make a group in")
        try:
            os.mkdir(self.path)
        except OSError as err:
            pytest.skip(f"cannot make a memory cgroup here ({err.strerror}): needs root")
        if limit_mb is not None:
            self._write("memory.limit_in_bytes" if self.version == 1 else "memory.max", str(int(limit_mb * 2**20)))

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def _read_mb(self, name: str) -> float:
        with open(os.path.join(self.path, name)) as f:
            return int(f.read().split()[0]) / 2**20

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    def usage_mb(self) -> float:
        return self._read_mb("memory.usage_in_bytes" if self.version == 1 else "memory.current")

    def working_set_mb(self) -> float:
        """The usage less the inactive page cache (the kernel reclaims it
        before it OOM-kills): what kubelet calls the working set."""
        key = "total_inactive_file" if self.version == 1 else "inactive_file"
        with open(os.path.join(self.path, "memory.stat")) as f:
            inactive = next(int(line.split()[1]) for line in f if line.split()[0] == key)
        return self.usage_mb() - inactive / 2**20

    def peak_mb(self) -> float:
        """The group's exact peak since it was made (the kernel's own high-water mark of the group)."""
        return self._read_mb("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        with open(os.path.join(self.path, name)) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def close(self) -> None:
        procs = os.path.join(self.path, "cgroup.procs")
        wait_until(lambda: not open(procs).read().strip(), timeout=30, what=f"{self.path} to empty")
        os.rmdir(self.path)

    def __enter__(self) -> "MemoryCgroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
