"""What watching a Dask cluster costs, per transport and as the cluster grows.

    pip install -e ".[dask]"
    python benchmarks/bench_cluster.py [--seconds 20] [--sizes 4,32,128]   # writes benchmarks/RESULTS_CLUSTER.md

The scheduler runs in its own process, the workers in 4 more (1, 8 or 32
workers each: "several workers per process" for 32 and 128), and this
process is the notebook (the Dask client, nbmon's collector). Each process
counts the bytes it writes on Dask's TCP comms (``TCP.write`` returns them;
the scheduler gets the counter through ``--preload`` of this file). For
each cluster size: one window with the cluster idle and no nbmon (the
baseline), then one window per transport with nbmon sampling every worker
at 10 Hz and batching once a second; a figure is the window's excess over
the baseline:

- bytes on the wire per worker per second (every process's writes: worker
  to scheduler, scheduler to notebook, and back for the pulls),
- CPU of the scheduler process, of the notebook process and, per worker,
  of the worker processes (% of one core),
- latency: from a batch's newest sample to its arrival in the notebook's
  store (median, 95th percentile), and the view's refresh time and frame
  at that size.

Transports: ``events`` (``worker.log_event`` + ``client.subscribe_topic``,
nbmon's), ``heartbeat`` (a ``worker.metrics`` entry carried by every
heartbeat, the notebook polling the scheduler every 0.5 s), ``pull``
(``client.run`` every second).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from nbmon.dask.worker import HEARTBEATS_PER_BATCH  # noqa: E402

RESULTS = os.path.join(HERE, "RESULTS_CLUSTER.md")
PROCESSES = 4   # worker processes
TRANSPORTS = ("events", "heartbeat", "pull")


# -- byte counting, in every process -----------------------------------------------

def count_tcp_writes() -> None:
    """Count what this process writes on Dask's TCP comms (idempotent)."""
    from distributed.comm import tcp

    if hasattr(tcp, "_bench_bytes"):
        return
    tcp._bench_bytes = [0]
    write = tcp.TCP.write

    async def counted(self, msg, serializers=None, on_error="message"):
        n = await write(self, msg, serializers, on_error)
        tcp._bench_bytes[0] += n
        return n

    tcp.TCP.write = counted


def written_bytes(dask_scheduler=None, dask_worker=None) -> tuple[int, int]:
    """(this process's pid, the bytes it wrote): workers sharing a process share the count."""
    from distributed.comm import tcp

    return os.getpid(), tcp._bench_bytes[0]


def dask_setup(server) -> None:   # --preload hook of the scheduler process
    count_tcp_writes()


# -- the other two transports ---------------------------------------------------------

def _pending(worker, topic: str) -> collections.deque:
    if not hasattr(worker, "_nbmon_pending"):
        worker._nbmon_pending = collections.defaultdict(collections.deque)
    return worker._nbmon_pending[topic]


def buffer_batch(worker, topic, msg) -> None:
    """Keep the batch on the worker, for a heartbeat or a pull to take."""
    _pending(worker, topic).append(msg)


def take_batches(topic: str, dask_worker=None) -> list:
    pending = _pending(dask_worker, topic)
    out = []
    while pending:
        out.append(pending.popleft())
    return out


def scheduler_metrics(topic: str, seen: dict, dask_scheduler=None) -> list:
    """The batches the workers' last heartbeats carried, less those ``seen``
    ({worker: last batch number}) already: only new ones travel."""
    return [m for ws in dask_scheduler.workers.values() for m in (ws.metrics.get(topic) or ())
            if m["s"] > seen.get(m["w"], -1)]


def make_plugin(transport: str, topic: str, options_json: str):
    from nbmon.dask.worker import NbmonPlugin

    if transport == "events":
        return None

    class Buffered(NbmonPlugin):
        def setup(self, worker) -> None:
            if transport == "heartbeat":
                worker.metrics[self.topic] = lambda w: take_batches(self.topic, w)
            super().setup(worker)

        def teardown(self, worker) -> None:
            super().teardown(worker)
            worker.metrics.pop(self.topic, None)

    return Buffered(topic, options_json, 1.0, send=buffer_batch)


class Poller(threading.Thread):
    """The notebook's side of heartbeat and pull: fetch batches, feed the collector."""

    def __init__(self, transport: str, watch):
        super().__init__(name="bench-poller", daemon=True)
        self.transport, self.watch, self.stop = transport, watch, threading.Event()

    def run(self) -> None:
        client, handle = self.watch.client, self.watch.collector.handle
        period = 0.5 if self.transport == "heartbeat" else 1.0
        seen: dict[str, int] = {}
        while not self.stop.wait(period):
            topic = self.watch.topic
            if self.transport == "heartbeat":
                batches = client.run_on_scheduler(scheduler_metrics, topic, seen)
            else:
                batches = [m for ms in client.run(take_batches, topic, on_error="ignore").values() for m in ms]
            for msg in sorted(batches, key=lambda m: m["s"]):
                if msg["s"] > seen.get(msg["w"], -1):   # a heartbeat repeats what the scheduler holds
                    seen[msg["w"]] = msg["s"]
                    handle(msg)


# -- processes ---------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` (its kernel CPU clock: ns, not 10 ms ticks)."""
    return time.clock_gettime(((~pid) << 3) | 2)


async def _host(address: str, n: int) -> None:
    from distributed import Worker

    count_tcp_writes()
    workers = [Worker(address, nthreads=1, memory_limit="4GiB", dashboard=False) for _ in range(n)]
    await asyncio.gather(*workers)
    await asyncio.Event().wait()


class Cluster:
    def __init__(self, size: int, tmp: str):
        self.size = size
        path = os.path.join(tmp, f"scheduler-{size}.json")
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", path, "--preload", os.path.abspath(__file__)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(path) as f:
            self.address = json.load(f)["address"]
        self.hosts = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "_host", self.address,
                                        str(size // PROCESSES)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for _ in range(PROCESSES)]
        from distributed import Client

        self.client = Client(self.address, set_as_default=False)
        self.client.wait_for_workers(size, timeout=120)

    def snapshot(self) -> dict:
        """Bytes written and CPU seconds, per process kind, now."""
        client = self.client
        processes = dict([client.run_on_scheduler(written_bytes), written_bytes(), *client.run(written_bytes).values()])
        return {"bytes": sum(processes.values()),
                "scheduler_cpu": cpu_s(self.scheduler.pid), "notebook_cpu": cpu_s(os.getpid()),
                "workers_cpu": sum(cpu_s(p.pid) for p in self.hosts), "t": time.monotonic()}

    def close(self) -> None:
        self.client.close()
        for p in self.hosts + [self.scheduler]:
            p.terminate()
        for p in self.hosts + [self.scheduler]:
            p.wait(30)


def window(cluster: Cluster, seconds: float) -> dict:
    before = cluster.snapshot()
    time.sleep(seconds)
    after = cluster.snapshot()
    span = after["t"] - before["t"]
    return {k: (after[k] - before[k]) / span for k in ("bytes", "scheduler_cpu", "notebook_cpu", "workers_cpu")}


def measure(cluster: Cluster, transport: str, seconds: float, baseline: dict) -> dict:
    from nbmon.dask.client import Watch
    from nbmon.notebook.cluster import ClusterView
    from nbmon.options import Options

    options = Options(interval=0.1, gpu=False)
    watch = Watch(cluster.client, options)
    watch.start(make_plugin(transport, watch.topic, options.to_json()))
    poller = None
    if transport != "events":
        poller = Poller(transport, watch)
        poller.start()
    try:
        assert watch.ready(60), "the workers' first batches did not arrive"
        time.sleep(3)   # past the start-up
        watch.collector.latency.clear()
        got = window(cluster, seconds)
        latency = sorted(watch.collector.latency)
        period = max(f.about.get("period_s", 0.0) for f in watch.collector.workers())
        view = ClusterView(watch, start=False)
        cpu, wall = [], []
        for _ in range(10):
            c, t = time.thread_time(), time.perf_counter()
            view.refresh(force=True)
            cpu.append((time.thread_time() - c) * 1e3)
            wall.append((time.perf_counter() - t) * 1e3)
        view.widget.close()
    finally:
        if poller is not None:
            poller.stop.set()
            poller.join(5)
        watch.stop()
    n = cluster.size
    return {"transport": transport, "workers": n,
            "bytes_per_worker_s": (got["bytes"] - baseline["bytes"]) / n,
            "scheduler_cpu": 100 * (got["scheduler_cpu"] - baseline["scheduler_cpu"]),
            "notebook_cpu": 100 * (got["notebook_cpu"] - baseline["notebook_cpu"]),
            "worker_cpu": 100 * (got["workers_cpu"] - baseline["workers_cpu"]) / n,
            "latency_p50_ms": 1e3 * latency[len(latency) // 2] if latency else float("nan"),
            "latency_p95_ms": 1e3 * latency[int(len(latency) * 0.95)] if latency else float("nan"),
            "batches": len(latency), "period_s": period, "refresh_cpu_ms": statistics.median(cpu),
            "refresh_ms": statistics.median(wall), "frame_bytes": view.last_frame_bytes, "compact": view.compact}


# -- the report --------------------------------------------------------------------------

def slope(rows, key):
    """Least-squares slope and intercept of ``key`` against the number of workers."""
    xs, ys = [r["workers"] for r in rows], [r[key] for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return b, my - b * mx


def report(results, seconds, sizes, loads) -> str:
    head = ("| transport | workers | batch every s | B/s per worker | scheduler CPU % | notebook CPU % | "
            "CPU % per worker | latency p50 / p95 ms | view refresh ms, CPU / wall | frame B |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    rows = "".join(
        f"| {r['transport']} | {r['workers']} | {r['period_s']:g} | {r['bytes_per_worker_s']:.0f} | "
        f"{r['scheduler_cpu']:.2f} | {r['notebook_cpu']:.2f} | {r['worker_cpu']:.2f} | "
        f"{r['latency_p50_ms']:.0f} / {r['latency_p95_ms']:.0f} | {r['refresh_cpu_ms']:.1f} / {r['refresh_ms']:.1f}"
        f"{' (compact)' if r['compact'] else ''} | {r['frame_bytes']:,} |\n"
        for r in results)
    # At 1,000 workers Dask heartbeats every 1000/200 + 1 = 6 s, so batches come every 9 s.
    period = HEARTBEATS_PER_BATCH * (1000 / 200 + 1)
    projection = []
    for transport in TRANSPORTS:
        mine = [r for r in results if r["transport"] == transport]
        if len(mine) < 2:
            continue
        s_b, s_a = slope(mine, "scheduler_cpu")
        n_b, n_a = slope(mine, "notebook_cpu")
        big = max(mine, key=lambda r: r["workers"])
        per_batch = big["scheduler_cpu"] * big["period_s"] / big["workers"]   # % of a core x s, per batch
        wire = big["bytes_per_worker_s"] * big["period_s"] / period * 1000
        projection.append(f"| {transport} | {s_b * 1000:.2f} | {s_a + s_b * 1000:.1f} | "
                          f"{per_batch * 1000 / period:.1f} | {n_a + n_b * 1000:.1f} | {wire / 1024:.0f} KiB/s |")
    largest = max(r["workers"] for r in results)
    at = {r["transport"]: r for r in results if r["workers"] == largest}
    compared = "; ".join(f"`{t}` {r['bytes_per_worker_s']:.0f} B/s per worker, scheduler {r['scheduler_cpu']:.2f} %, "
                         f"notebook {r['notebook_cpu']:.2f} %, latency p50 {r['latency_p50_ms']:.0f} ms"
                         for t, r in at.items())
    events = at.get("events")

    def verdict(ok: bool) -> str:
        return "met" if ok else "missed"

    targets = "" if events is None else (
        f"Targets at {largest} workers, for `events`: wire {events['bytes_per_worker_s']:.0f} B/s per worker "
        f"(target ≤ 2048: {verdict(events['bytes_per_worker_s'] <= 2048)}), scheduler "
        f"{events['scheduler_cpu']:.2f} % of a core (target ≤ 1 %: {verdict(events['scheduler_cpu'] <= 1)}), "
        f"view refresh {events['refresh_cpu_ms']:.1f} ms of CPU, {events['refresh_ms']:.1f} ms of wall time "
        f"(target ≤ 50 ms: {verdict(events['refresh_cpu_ms'] <= 50)} in CPU time).\n")
    return (
        "# Watching a Dask cluster: what it costs\n\n"
        f"`python benchmarks/bench_cluster.py --seconds {seconds:g} --sizes {','.join(map(str, sizes))}`, "
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Load average before / after: "
        f"{loads[0]} / {loads[1]}; every process of the cluster shares this machine's {os.cpu_count()} CPUs, "
        f"so wall times include waiting for a CPU.\n\n"
        f"Scheduler, notebook and {PROCESSES} worker processes on this machine (1, 8 or 32 workers per process); "
        f"nbmon samples every worker at 10 Hz and sends one batch (min, max, mean of every field) a second, "
        f"or every {HEARTBEATS_PER_BATCH:g} Dask heartbeats when Dask spaces them out (\"batch every\"). "
        f"Each figure is a {seconds:g} s window's excess over the same cluster idle without nbmon. "
        "Latency: from a batch's newest sample to its arrival in the notebook's store; the view adds at most "
        "one refresh period (0.25 s) and its refresh time.\n\n" + head + rows +
        "\n## Projected at 1,000 workers\n\n"
        "From the least-squares line through the sizes measured (its slope: % of a core per 1,000 workers), "
        f"and, as a check, from the scheduler's CPU per batch at the largest size times the batches a second "
        f"1,000 workers send (one every {period:g} s). Wire: bytes per batch at the largest size, "
        f"one batch every {period:g} s.\n\n"
        "| transport | scheduler slope | scheduler CPU % (line) | scheduler CPU % (per batch) | "
        "notebook CPU % (line) | wire |\n|---|---|---|---|---|---|\n" + "\n".join(projection) + "\n"
        f"\n## Measured at {largest} workers\n\n{compared}.\n\n{targets}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_host":
        asyncio.run(_host(sys.argv[2], int(sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each window (default 20)")
    parser.add_argument("--sizes", default="4,32,128", help="cluster sizes, multiples of 4 (default 4,32,128)")
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    count_tcp_writes()
    loads = [" ".join(f"{x:.2f}" for x in os.getloadavg())]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            cluster = Cluster(size, tmp)
            try:
                time.sleep(3)
                baseline = window(cluster, args.seconds)
                for transport in args.transports.split(","):
                    results.append(measure(cluster, transport, args.seconds, baseline))
                    print(json.dumps(results[-1]), flush=True)
            finally:
                cluster.close()
    loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
    text = report(results, args.seconds, sizes, loads)
    with open(args.output, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
