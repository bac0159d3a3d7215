"""Live-chart frame cost: build time and payload, binary float32 vs JSON lists.

    python benchmarks/bench_frame.py [--builds N]

Stores hold ~30 columns, like a real run with the system source on. Each
row builds the frame the dashboard draws (4 traces, or 8 with two GPUs)
``--builds`` times after a warm-up and reports median/min/max build time,
the part of it spent in ``Store.series`` (copying out of the store), the
float32 payload that goes to the browser as binary buffers, and the same
arrays as JSON lists (``len(json.dumps(arr.tolist()))``, what a list-based
update would send). The frame is the live chart's first state; afterwards
a last table times a whole ``Dashboard.refresh`` (the samples new since the
last frame, sent as one custom message of binary buffers) and measures what
goes over the comm.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nbmon.views.frames import build_frame, frame_bytes  # noqa: E402
from nbmon.options import DEFAULT_MAX_BYTES  # noqa: E402
from nbmon.sampling.store import Store  # noqa: E402

TRACES = ["proc_cpu_percent", "sys_cpu_percent", "proc_rss_mb", "sys_mem_used_mb"]
GPU_TRACES = ["gpu0_util_percent", "gpu1_util_percent", "gpu0_mem_used_mb", "gpu1_mem_used_mb"]
COLUMNS = TRACES + ["proc_rss_peak_mb", "sys_mem_total_mb", "gpu_util_percent", "gpu_mem_used_mb",
                    "gpu_proc_mem_mb"] + GPU_TRACES + [f"other{i}" for i in range(17)]
INTERVAL = 0.1   # the Monitor's default sampling interval


def fill(store: Store, n: int, dt: float) -> None:
    rng = np.random.default_rng(0)
    block = rng.random((4096, len(store.columns))) * 100.0
    t0, wall0 = 1000.0, time.time() - n * dt
    for i in range(n):
        store.append(t0 + i * dt, wall0 + i * dt, block[i & 4095])


def timed(fn, builds: int):
    for _ in range(3):
        fn()
    out = []
    for _ in range(builds):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out), min(out), max(out)


def json_bytes(frame) -> int:
    return sum(len(json.dumps(x.tolist())) + len(json.dumps(y.tolist())) for x, y in frame.values())


def bench_frames(builds: int) -> None:
    header = (f"{'samples':>9} {'store':<13} {'held':>9} {'window':<15} {'traces':>6} {'pts/trace':>9} "
              f"{'median ms':>9} {'min ms':>7} {'max ms':>7} {'series ms':>9} "
              f"{'float32 B':>10} {'JSON B':>10} {'JSON/f32':>8}")
    print("Frame build (build_frame), %d builds per row" % builds)
    print(header)
    print("-" * len(header))
    for n in (10_000, 1_000_000):
        for kind in ("default 32MiB", "all raw"):
            max_bytes = DEFAULT_MAX_BYTES if kind.startswith("default") else (len(COLUMNS) + 2) * 8 * (n * 4 // 3 + 4096)
            store = Store(COLUMNS, max_bytes=max_bytes)
            fill(store, n, INTERVAL)
            span = n * INTERVAL
            cases = [("600 s @ 10 Hz", 600.0, TRACES),
                     ("whole run", math.inf, TRACES),
                     ("whole run", math.inf, TRACES + GPU_TRACES)]
            for label, window, traces in cases:
                if window == math.inf and span <= 600.0:
                    continue
                # F821: timed() calls these lambdas now, before the loop's `del store` (pyflakes sees the del)
                med, lo, hi = timed(lambda: build_frame(store, traces, window), builds)  # noqa: F821
                t_from = store.latest()["t"] - window
                s_med, _, _ = timed(lambda: store.series(traces, t_from=t_from), builds)  # noqa: F821
                frame = build_frame(store, traces, window)
                fb, jb = frame_bytes(frame), json_bytes(frame)
                pts = max(len(x) for x, _ in frame.values())
                print(f"{n:>9,} {kind:<13} {len(store):>9,} {label:<15} {len(traces):>6} {pts:>9} "
                      f"{med:>9.2f} {lo:>7.2f} {hi:>7.2f} {s_med:>9.2f} "
                      f"{fb:>10,} {jb:>10,} {jb / fb:>8.2f}")
            del store


def bench_refresh(builds: int) -> None:
    from comm.base_comm import BaseComm

    from nbmon.engine import Monitor
    from nbmon.views.dashboard import Dashboard

    class CountingComm(BaseComm):
        def __init__(self, **kwargs):
            self.json_bytes = self.buffer_bytes = self.messages = 0
            super().__init__(**kwargs)

        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            self.messages += 1
            self.json_bytes += len(json.dumps(data))
            self.buffer_bytes += sum(memoryview(b).nbytes for b in buffers or ())

    monitor = Monitor(interval=0.01, gpu=False).start()
    deadline = time.monotonic() + 10
    while monitor.store.seq < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    monitor.stop()
    store = monitor.store
    last = store.latest()
    row = np.array([last[c] for c in store.columns])
    dash = Dashboard(monitor, start=False)
    dash.widget.comm = comm = CountingComm(target_name="jupyter.widget")
    print()
    print("Dashboard.refresh (new samples since the last frame, one custom message), one new sample per frame,")
    print("in a real Monitor's store (default 32 MiB, so ~100k samples held of 1M appended)")
    header = f"{'appended':>9} {'median ms':>9} {'min ms':>7} {'max ms':>7} {'msgs/frame':>10} {'JSON B/frame':>12} {'buffer B/frame':>14}"
    print(header)
    print("-" * len(header))
    have = store.seq
    for target in (10_000, 1_000_000):
        if target <= have:
            continue
        wave = 1.0 + 0.5 * np.sin(np.arange(4096) / 50.0)
        for i in range(have, target):
            store.append(last["t"] + i * INTERVAL, last["wall"] + i * INTERVAL, row * wave[i & 4095])
        have = target
        dash.refresh()   # catch up with the samples just appended: not a live frame
        comm.json_bytes = comm.buffer_bytes = comm.messages = 0
        clock = [have]

        def step():  # one new sample per frame, as live
            clock[0] += 1
            store.append(last["t"] + clock[0] * INTERVAL, last["wall"] + clock[0] * INTERVAL, row)
            t = time.perf_counter()
            assert dash.refresh()
            return (time.perf_counter() - t) * 1e3

        times = [step() for _ in range(builds + 3)][3:]
        med, lo, hi = statistics.median(times), min(times), max(times)
        have = clock[0]
        frames = builds + 3
        print(f"{target:>9,} {med:>9.2f} {lo:>7.2f} {hi:>7.2f} {comm.messages / frames:>10.1f} "
              f"{comm.json_bytes / frames:>12,.0f} {comm.buffer_bytes / frames:>14,.0f}")
    dash.freeze()
    dash.widget.close()


def main() -> None:
    # The store's decimation of all-NaN buckets (absent GPU fields) warns; not ours to show here.
    warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=50, help="timed builds per row (default 50)")
    parser.add_argument("--no-refresh", action="store_true", help="skip the Dashboard.refresh table")
    args = parser.parse_args()
    bench_frames(max(1, args.builds))
    if not args.no_refresh:
        bench_refresh(max(1, args.builds))


if __name__ == "__main__":
    main()
