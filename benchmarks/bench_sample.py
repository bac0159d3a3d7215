"""CPU cost of one sample: nbmon vs plain psutil vs the raw-read floor.

    python benchmarks/bench_sample.py [--quick]

Part 1 times the sample itself in a tight loop (no sleeping, so thread
wake-up is excluded): thread CPU time per sample, median (min-max) of
rounds, contenders alternated round by round so machine drift cancels.
Part 2 runs the real sampler thread at 10 Hz and 100 Hz and reads its
on-CPU time from /proc/self/task/<tid>/schedstat, beside an empty thread
woken at the same rate (the wake-up cost every sampler pays).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nbmon.monitor import Monitor  # noqa: E402
from nbmon.options import Options  # noqa: E402
from nbmon.sampler import Sampler  # noqa: E402
from nbmon.sources import Sources  # noqa: E402
from nbmon.store import Store  # noqa: E402

SLEEPER = "import time\nwhile True: time.sleep(1)"


def nbmon_sampler():
    sampler = Sampler(Sources(os.getpid(), Options(gpu=False)).all, None, 0.1)
    sampler.prime()
    store = Store(sampler.fields)
    sampler.sink = store.append
    clock = time.monotonic

    def sample():
        sampler.step(clock())
    return sample, sampler.close_sources


def psutil_sampler():
    proc = psutil.Process()
    proc.cpu_percent()
    psutil.cpu_percent()

    def sample():
        # What most monitors do each tick: a fresh children() scan of all /proc.
        procs = [proc] + proc.children(recursive=True)
        cpu = rss = 0.0
        for p in procs:
            try:
                cpu += p.cpu_percent()
                rss += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return cpu, rss, psutil.cpu_percent(), psutil.virtual_memory().used
    return sample, lambda: None


def floor_sampler():
    pids = [os.getpid()] + [c.pid for c in psutil.Process().children(recursive=True)]
    fds = [os.open(f"/proc/{pid}/{name}", os.O_RDONLY) for pid in pids for name in ("stat", "statm")]
    fds.append(os.open("/proc/stat", os.O_RDONLY))
    pread = os.pread

    def sample():
        for fd in fds:
            pread(fd, 4096, 0)

    def close():
        for fd in fds:
            os.close(fd)
    return sample, close


CONTENDERS = {"raw-read floor": floor_sampler, "nbmon": nbmon_sampler, "plain psutil": psutil_sampler}


def tight_loop(rounds: int, per_round: int) -> dict[str, list[float]]:
    made = {name: make() for name, make in CONTENDERS.items()}
    for sample, _ in made.values():  # warm up caches and baselines
        for _ in range(50):
            sample()
    results: dict[str, list[float]] = {name: [] for name in made}
    for _ in range(rounds):
        for name, (sample, _) in made.items():
            t0 = time.thread_time_ns()
            for _ in range(per_round):
                sample()
            results[name].append((time.thread_time_ns() - t0) / per_round / 1000)
    for _, close in made.values():
        close()
    return results


def on_cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


def thread_cost(interval: float, seconds: float) -> tuple[float, float]:
    """(sampler thread µs on-CPU per sample, empty thread µs per wake-up)."""
    monitor = Monitor(interval=interval, gpu=False).start()
    tid = next(t.native_id for t in threading.enumerate() if t.name == "nbmon-sampler")
    seq0, cpu0 = monitor.store.seq, on_cpu_ns(tid)
    time.sleep(seconds)
    seq1, cpu1 = monitor.store.seq, on_cpu_ns(tid)
    monitor.stop()
    sampler_us = (cpu1 - cpu0) / max(1, seq1 - seq0) / 1000

    stop = threading.Event()
    wakes = [0]

    def empty():
        next_t = time.monotonic()
        while True:
            next_t += interval
            if stop.wait(max(0.0, next_t - time.monotonic())):
                return
            wakes[0] += 1
    thread = threading.Thread(target=empty, name="bench-empty")
    thread.start()
    c0, w0 = on_cpu_ns(thread.native_id), wakes[0]
    time.sleep(seconds)
    c1, w1 = on_cpu_ns(thread.native_id), wakes[0]
    stop.set()
    thread.join()
    return sampler_us, (c1 - c0) / max(1, w1 - w0) / 1000


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, per_round, seconds = (5, 200, 1.0) if args.quick else (21, 1000, 5.0)

    print(f"# nbmon sample cost — {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"{rounds} rounds x {per_round} samples, median (min-max) µs of thread CPU per sample\n")
    table = {}
    children = []
    for label in ("no children", "4 children"):
        if label == "4 children":
            children = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(4)]
            time.sleep(0.5)
        table[label] = tight_loop(rounds, per_round)
    for child in children:
        child.kill()
        child.wait()

    print("| contender | no children | 4 children | ratio to floor (no / 4) |")
    print("|---|---|---|---|")
    floor = {k: statistics.median(v["raw-read floor"]) for k, v in table.items()}
    for name in CONTENDERS:
        cells = [fmt(table[k][name]) for k in table]
        ratios = " / ".join(f"{statistics.median(table[k][name]) / floor[k]:.2f}x" for k in table)
        print(f"| {name} | {cells[0]} | {cells[1]} | {ratios} |")
    for k in table:
        ps, nb = statistics.median(table[k]["plain psutil"]), statistics.median(table[k]["nbmon"])
        print(f"\nplain psutil / nbmon ({k}): {ps / nb:.1f}x")

    print("\n| sampler thread at | nbmon µs on-CPU per sample | empty thread µs per wake-up |")
    print("|---|---|---|")
    for hz in (10, 100):
        sampler_us, empty_us = thread_cost(1.0 / hz, seconds)
        print(f"| {hz} Hz | {sampler_us:.1f} | {empty_us:.1f} |")


if __name__ == "__main__":
    main()
