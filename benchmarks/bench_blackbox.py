"""What the black box and the memory warning cost (issue 20): CPU per call of
each consumer, measured on the consumers thread's own CPU clock in a real
monitor run (default interval, this process watched), the record write
alone, the whole consumers thread's CPU from the kernel's schedstat, and the
bytes. Scenarios: no container limit (the machine's memory counts), a
container limit (a cgroup v1 group the benchmark moves itself into; root
only), and "hot" (above the threshold: the box rewrites its record at every
check). Writes benchmarks/RESULTS_BLACKBOX.md.

    python benchmarks/bench_blackbox.py [--seconds 20] [--out benchmarks/RESULTS_BLACKBOX.md]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid

from nbmon.postmortem import blackbox
from nbmon.postmortem.blackbox import BlackBox, CellNote
from nbmon.engine import Monitor
from nbmon.postmortem.memwarn import MemoryWatch

MIB = 1 << 20


class Timed:
    """A consumer wrapped so that each consume's CPU (thread clock, ns) is kept."""

    def __init__(self, inner):
        self.inner, self.at_start, self.name = inner, True, inner.name
        self.ns: list[int] = []

    @property
    def every_s(self) -> float:   # the consumer's own cadence, which follows the memory's level
        return self.inner.every_s

    def consume(self, store, final):
        t0 = time.thread_time_ns()
        self.inner.consume(store, final)
        self.ns.append(time.thread_time_ns() - t0)

    def close(self):
        self.inner.close()


def thread_cpu_ns(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[0])


def run(seconds: float, percent: float) -> dict:
    cell = CellNote()
    cell.started(1, "benchmark")
    watch = Timed(MemoryWatch(os.getpid(), percent, say=lambda _text: None, running_cell=cell.running))
    box = Timed(BlackBox(cell, watch.inner))
    monitor = Monitor(gpu=False, consumers=[watch, box])
    with monitor:
        time.sleep(1.0)  # the first calls (opening the box) are not the steady state
        consumers = next(t for t in threading.enumerate() if t.name == "nbmon-consumers")
        watch.ns.clear(), box.ns.clear()
        writes0, cpu0, t0 = box.inner.writes, thread_cpu_ns(consumers.native_id), time.monotonic()
        time.sleep(seconds)
        cpu, elapsed, writes = thread_cpu_ns(consumers.native_id) - cpu0, time.monotonic() - t0, box.inner.writes - writes0
        size = os.path.getsize(box.inner.path)
    return {"watch_us": statistics.median(watch.ns) / 1e3, "box_us": statistics.median(box.ns) / 1e3,
            "calls_per_s": (len(watch.ns) + len(box.ns)) / elapsed,
            "per_s_us": (sum(watch.ns) + sum(box.ns)) / elapsed / 1e3,
            "thread_percent": 100.0 * cpu / (elapsed * 1e9), "writes_per_s": writes / elapsed,
            "hot": watch.inner.warning is not None, "kind": watch.inner.level.kind if watch.inner.level else "-",
            "size": size}


def record_write_us(n: int = 20000) -> float:
    """encode + pwrite of one record, alone (median)."""
    layout = blackbox.record_struct(len(blackbox.FIELDS))
    values = [1.0] * len(blackbox.FIELDS)
    fd, path = tempfile.mkstemp()
    try:
        os.pwrite(fd, b"\0" * blackbox.box_size(len(blackbox.FIELDS)), 0)
        times = []
        for seq in range(n):
            t0 = time.perf_counter_ns()
            os.pwrite(fd, blackbox.encode_record(layout, seq, time.time(), values),
                      blackbox.HEADER_SIZE + blackbox.CELL_SIZE + (seq % blackbox.SLOTS) * layout.size)
            times.append(time.perf_counter_ns() - t0)
        return statistics.median(times) / 1e3
    finally:
        os.close(fd)
        os.unlink(path)


def in_a_limited_cgroup(limit_mb: int = 4096) -> str | None:
    """Move this process into a new cgroup v1 memory group with a limit; None if it cannot be made."""
    path = f"/sys/fs/cgroup/memory/nbmon-bench-{uuid.uuid4().hex[:8]}"
    try:
        os.mkdir(path)
        with open(f"{path}/memory.limit_in_bytes", "w") as f:
            f.write(str(limit_mb * MIB))
        with open(f"{path}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return None
    return path


def leave(path: str) -> None:
    with open("/sys/fs/cgroup/memory/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    os.rmdir(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "RESULTS_BLACKBOX.md"))
    args = parser.parse_args()
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp()   # a private directory of the benchmark's own
    os.chmod(os.environ["XDG_RUNTIME_DIR"], 0o700)
    load = open("/proc/loadavg").read().split()[:3]
    rows = [("no container limit (machine)", run(args.seconds, 90.0)),
            ("no container limit, above the threshold", run(args.seconds, 0.5))]
    group = in_a_limited_cgroup()
    if group is not None:
        try:
            rows.append(("in a container with a 4 GiB limit", run(args.seconds, 90.0)))
        finally:
            leave(group)
    write_us = record_write_us()
    lines = [
        "# The black box and the memory warning: what they cost",
        "",
        f"`python benchmarks/bench_blackbox.py --seconds {args.seconds:g}` at {time.strftime('%Y-%m-%d %H:%M')}, "
        f"load average {' '.join(load)} (2 shared cores), Python {sys.version.split()[0]}. The notebook's "
        "monitor at its default interval (0.1 s) on this process; each consumer's calls timed on the "
        "consumers thread's own CPU clock (median), the whole thread's CPU from /proc schedstat.",
        "",
        "| scenario | memory read | MemoryWatch per call | BlackBox per call | calls/s | consumers CPU per s "
        "| consumers thread, % of a core | box writes/s | box file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        lines.append(f"| {name} | {r['kind']}{' (hot)' if r['hot'] else ''} | {r['watch_us']:.0f} µs | "
                     f"{r['box_us']:.0f} µs | {r['calls_per_s']:.1f} | {r['per_s_us']:.0f} µs | "
                     f"{r['thread_percent']:.3f} % | {r['writes_per_s']:.2f} | {r['size']:,} B |")
    layout = blackbox.record_struct(len(blackbox.FIELDS))
    lines += [
        "",
        f"One record written (encode + `pwrite` of {layout.size} B to the page cache, alone): "
        f"{write_us:.1f} µs (median of 20,000). The file is {blackbox.box_size(len(blackbox.FIELDS)):,} B "
        f"(header 2,048, cell 256, {blackbox.SLOTS} records of {layout.size}), made once per monitor run; "
        f"each cell start and end rewrites the cell part (256 B).",
        "",
    ]
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
