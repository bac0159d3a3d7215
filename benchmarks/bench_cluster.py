"""What watching a Dask cluster costs, as the cluster grows: this checkout and another, in one run.

    pip install -e ".[dask]"
    python benchmarks/bench_cluster.py [--before DIR] [--seconds 30] [--sizes 4,32,128,1000,128/32]
        # writes benchmarks/RESULTS_CLUSTER.md (its "## Earlier" part is kept)

For each cluster size and each checkout (``--before DIR``, e.g. ``git
worktree add --detach /tmp/before main``, then this one), a fresh process
is the notebook (the Dask client, nbmon's collector and view), with that
checkout first on PYTHONPATH everywhere: it starts the scheduler in its own
process and real worker processes (no nannies), each hosting many Dask
workers, spread over simulated hosts (a private directory each, hence a
host lock each; ``LAYOUT``). Each process counts the bytes it writes on
Dask's TCP comms (``TCP.write`` returns them; the scheduler gets the
counter through ``--preload`` of this file). Dask's own idle work is cut
in every process of the cluster (``IDLE_CONFIG``: the profiler, the GIL and
system monitors off or slowed), so that 1,000 workers fit beside the rest
on a small machine and the scheduler's idle CPU varies less; it is the same
in every window. The scheduler runs alone on the first CPU, everything
else on the others (``--anywhere``: not so): on a cluster it has a machine
or a core of its own, and on shared CPUs its figures would include its own
work slowed down by the workers' samplers beside it.

Windows: the cluster idle without nbmon, with nbmon (sampling every worker
at 10 Hz), idle again; each figure is the nbmon window's excess over the
mean of the two idle ones:

- bytes on the wire per worker per second (every process's writes),
- CPU of the scheduler process (read from its own CPU clock), of the
  notebook process, and per worker of the worker processes (% of a core),
- latency: from each sample to its arrival in the notebook (every sample
  of every batch: a batch's samples spread over its span), p50 and p95;
  and from a batch's newest sample,
- the view: a forced refresh's CPU (median of 10) and frame bytes, and the
  notebook's RSS growth from before the watch to after the view; the
  notebook's stores of the workers can grow to their bound (``stores``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "RESULTS_CLUSTER.md")
# workers -> (worker processes, simulated hosts); "N/P" in --sizes: N workers in P processes, a host each
LAYOUT = {4: (4, 2), 32: (4, 2), 128: (4, 2), 1000: (8, 4)}
IDLE_CONFIG = {   # Dask's own idle work, the same in every window
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__GIL__ENABLED": "False",
    "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "1s",
}


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


def cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` (its kernel CPU clock: ns, not 10 ms ticks)."""
    return time.clock_gettime(((~pid) << 3) | 2)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


# -- a worker process: many Dask workers ------------------------------------------------

async def _host(address: str, n: int, roll: str) -> None:
    from distributed import Worker

    count_tcp_writes()
    workers = [Worker(address, nthreads=1, memory_limit="4GiB", dashboard=False, host="127.0.0.1")
               for _ in range(n)]
    await asyncio.gather(*workers)
    with open(roll + ".part", "w") as f:   # the notebook asks one worker per process for its bytes
        json.dump([w.address for w in workers], f)
    os.rename(roll + ".part", roll)
    await asyncio.Event().wait()


def on(cpus) -> list[str]:
    """A command's prefix that runs it, and every thread it starts, on ``cpus`` (None: anywhere)."""
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []


class Cluster:
    """The scheduler and the worker processes of one size, this process the
    notebook; the scheduler on ``scheduler_cpus`` (None: anywhere), the
    worker processes where this process may run."""

    def __init__(self, spec: str, tmp: str, scheduler_cpus=None):
        size, _, apart = spec.partition("/")
        size = int(size)
        processes, hosts = (int(apart), int(apart)) if apart else LAYOUT.get(size, (4, 2))
        path = os.path.join(tmp, "scheduler.json")
        self.scheduler = subprocess.Popen(
            [*on(scheduler_cpus), sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", "0",
             "--no-dashboard", "--scheduler-file", path, "--preload", os.path.abspath(__file__)],
            env={**os.environ, **IDLE_CONFIG}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        with open(path) as f:
            self.address = json.load(f)["address"]
        self.procs, rolls = [], []
        for k in range(processes):
            private = os.path.join(tmp, f"host{k % hosts}")   # a simulated host: its own host lock
            os.makedirs(private, mode=0o700, exist_ok=True)
            rolls.append(os.path.join(tmp, f"process{k}.json"))
            env = {**os.environ, **IDLE_CONFIG, "XDG_RUNTIME_DIR": private,
                   "DASK_TEMPORARY_DIRECTORY": os.path.join(tmp, "scratch")}
            count = size // processes + (k < size % processes)
            self.procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "_host", self.address,
                                                str(count), rolls[-1]], env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        self.client = Client(self.address, set_as_default=False)
        self.client.wait_for_workers(size, timeout=300)
        deadline = time.monotonic() + 60
        while not all(os.path.exists(r) for r in rolls) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.askers = []   # a worker of each process
        for r in rolls:
            with open(r) as f:
                self.askers.append(json.load(f)[0])
        self.size, self.hosts = size, hosts

    def snapshot(self) -> dict:
        """Bytes written and CPU seconds, per process kind, now."""
        client = self.client
        processes = dict([client.run_on_scheduler(written_bytes), written_bytes(),
                          *client.run(written_bytes, workers=self.askers).values()])
        return {"bytes": sum(processes.values()),
                "scheduler_cpu": cpu_s(self.scheduler.pid), "notebook_cpu": cpu_s(os.getpid()),
                "workers_cpu": sum(cpu_s(p.pid) for p in self.procs), "t": time.monotonic()}

    def window(self, seconds: float) -> dict:
        before = self.snapshot()
        time.sleep(seconds)
        after = self.snapshot()
        span = after["t"] - before["t"]
        return {k: (after[k] - before[k]) / span for k in ("bytes", "scheduler_cpu", "notebook_cpu", "workers_cpu")}

    def close(self) -> None:
        self.client.close()
        for p in self.procs + [self.scheduler]:
            p.terminate()
        for p in self.procs + [self.scheduler]:
            p.wait(60)


# -- one measurement: one checkout, one size (a process of its own) --------------------------

class Arrivals:
    """Every event the watch's handler got, with its arrival, read after the window."""

    def __init__(self, handler):
        self.handler, self.seen, self.on = handler, [], False

    def __call__(self, event) -> None:
        if self.on:
            self.seen.append((time.time(), event[1]))
        self.handler(event)


def batches(watch, msg):
    """(first sample, newest sample, samples) of each batch in an event, in
    either checkout's wire (a sealed host batch of process batches, or a
    worker's own batch)."""
    if isinstance(msg, dict) and "b" in msg and "k" in msg:
        from nbmon.dask import wire

        body = wire.opened(watch.key, msg)
        return [(b["t"][0], b["t"][1], b["n"]) for b in map(wire.unpack, body.get("p", ()))]
    if isinstance(msg, dict) and "t" in msg and "n" in msg:
        return [(msg["t"][0], msg["t"][1], msg["n"])]
    return []


def measure(spec: str, seconds: float, scheduler_cpus=None) -> dict:
    import numpy as np

    from nbmon.dask.client import Watch
    from nbmon.views.cluster import ClusterView
    from nbmon.options import Options

    count_tcp_writes()
    import anywidget  # noqa: F401 - the view's imports, before the RSS it grows by is read
    import plotly.graph_objects  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(spec, tmp, scheduler_cpus)
        size = cluster.size
        try:
            time.sleep(5)   # past the workers' start
            idle = [cluster.window(seconds)]
            rss0 = rss_mb()
            watch = Watch(cluster.client, Options(interval=0.1, gpu=False))
            watch.collector.on_event = arrivals = Arrivals(watch.collector.on_event)
            watch.start()
            assert watch.ready(120), "the workers' first batches did not arrive"
            time.sleep(5)   # past the start
            arrivals.on = True
            got = cluster.window(seconds)
            arrivals.on = False
            view = ClusterView(watch, start=False)
            cpu = []
            for _ in range(10):
                c = time.thread_time()
                view.refresh(force=True)
                cpu.append((time.thread_time() - c) * 1e3)
            rss = rss_mb() - rss0
            feeds = [f for f in watch.collector.workers() if f.store is not None]
            stores = sum(f.store.nbytes for f in feeds)
            period = max(f.about.get("period_s") or 0.0 for f in feeds)
            frame, compact = view.last_frame_bytes, view.compact
            view.close()
            watch.stop()
            time.sleep(3)
            idle.append(cluster.window(seconds))
        finally:
            cluster.close()
    newest, every = [], []
    for arrived, msg in arrivals.seen:
        for first, last, n in batches(watch, msg):
            newest.append(arrived - last)
            every.extend(arrived - np.linspace(last if n < 2 else first, last, max(1, n)))
    base = {k: statistics.fmean(w[k] for w in idle) for k in idle[0]}

    def pct(values, q):
        return 1e3 * float(np.percentile(values, q)) if len(values) else float("nan")

    return {"workers": size, "hosts": cluster.hosts, "processes": len(cluster.procs),
            "bytes_per_worker_s": (got["bytes"] - base["bytes"]) / size,
            "scheduler_cpu": 100 * (got["scheduler_cpu"] - base["scheduler_cpu"]),
            "scheduler_idle": 100 * base["scheduler_cpu"],
            "scheduler_drift": 50 * abs(idle[0]["scheduler_cpu"] - idle[1]["scheduler_cpu"]),
            "notebook_cpu": 100 * (got["notebook_cpu"] - base["notebook_cpu"]),
            "worker_cpu": 100 * (got["workers_cpu"] - base["workers_cpu"]) / size,
            "events_s": len(arrivals.seen) / seconds, "period_s": period,
            "latency_p50_ms": pct(every, 50), "latency_p95_ms": pct(every, 95),
            "newest_p50_ms": pct(newest, 50), "newest_p95_ms": pct(newest, 95),
            "refresh_cpu_ms": statistics.median(cpu), "frame_bytes": frame, "compact": compact,
            "notebook_mb": rss, "stores_mb": stores / 2**20, "load": os.getloadavg()[0]}


# -- the report --------------------------------------------------------------------------

def report(results, args, loads) -> str:
    head = ("| workers (processes, hosts) | checkout | scheduler CPU % (± idle drift; idle %) | events / s | notebook CPU % "
            "| CPU % per worker | B/s per worker | latency p50 / p95 ms, every sample | newest sample p50 / p95 ms "
            "| view refresh ms CPU | frame B | notebook MiB (RSS growth) | stores' bound MiB |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = "".join(
        f"| {r['workers']:,} ({r['processes']}, {r['hosts']}) | {r['checkout']} | {r['scheduler_cpu']:.2f} "
        f"(± {r['scheduler_drift']:.2f}; {r['scheduler_idle']:.1f}) | {r['events_s']:.1f} | {r['notebook_cpu']:.2f} | "
        f"{r['worker_cpu']:.2f} | "
        f"{r['bytes_per_worker_s']:.0f} | {r['latency_p50_ms']:.0f} / {r['latency_p95_ms']:.0f} | "
        f"{r['newest_p50_ms']:.0f} / {r['newest_p95_ms']:.0f} | {r['refresh_cpu_ms']:.1f}"
        f"{' (compact)' if r['compact'] else ''} | {r['frame_bytes']:,} | {r['notebook_mb']:.0f} | "
        f"{r['stores_mb']:.0f} |\n"
        for r in sorted(results, key=lambda r: (r["workers"], r["hosts"], r["checkout"] != "before")))
    return (
        "# Watching a Dask cluster: what it costs\n\n"
        f"`python benchmarks/bench_cluster.py --seconds {args.seconds:g} --sizes {args.sizes}"
        f"{' --before ' + args.before if args.before else ''}`, {platform.platform()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        f"Load average before / after: {loads[0]} / {loads[1]}. \"before\" is {args.before_rev}, \"after\" "
        f"{args.after_rev}{' (with uncommitted changes)' if args.dirty else ''}.\n\n"
        "Each row: its own notebook process, scheduler process and worker processes (no nannies, many Dask workers "
        "each) on simulated hosts (a private directory each, so a host lock each), all on this machine's "
        f"{os.cpu_count()} CPUs ({args.placement}); nbmon samples every worker at 10 Hz. Each figure is a {args.seconds:g} s "
        "window's excess over the mean of an idle window before and one after (in brackets, half the difference "
        "of the two idle windows: how much the scheduler's own idle work, mostly Dask's heartbeats, drifted; and "
        "its idle CPU). Latency: from each sample to its batch's arrival in the notebook "
        "(the view adds at most one refresh period, 0.25 s, and its refresh); \"newest sample\": from a "
        "batch's last. The stores' bound: what the workers' stores in the notebook can grow to over a long watch "
        "(the RSS growth is what they had touched after this one's minute).\n\n" + head + rows + projection(results))


def projection(results) -> str:
    """The scheduler at 1,000 workers in other layouts, from the cost of an
    event measured: a check, beside the measured rows."""
    from distributed.scheduler import heartbeat_interval

    sys.path.insert(0, os.path.dirname(HERE))   # this checkout's nbmon
    from nbmon.dask.worker import host_period_s

    def per_event_ms(checkout):
        """The scheduler's CPU per event, where there were enough of them to tell."""
        many = [r for r in results if r["checkout"] == checkout and r["events_s"] >= 20]
        return max(many, key=lambda r: r["events_s"]) if many else None

    big, after = per_event_ms("before"), per_event_ms("after")
    if big is None:
        return ""
    cost_ms = 10 * big["scheduler_cpu"] / big["events_s"]   # 1 % of a core is 10 ms a second
    own = "" if after is None else (
        f" \"after\"'s own at {after['workers']:,} workers on {after['hosts']} hosts ({after['events_s']:.0f} "
        f"events a second, a host's batches each): {10 * after['scheduler_cpu'] / after['events_s']:.2f} ms.")
    lines = []
    for hosts, per_host in ((4, 250), (32, 32), (125, 8), (1000, 1)):
        rate = hosts / host_period_s(1.0, heartbeat_interval(hosts * per_host), per_host)
        lines.append(f"| {hosts:,} hosts of {per_host} | {hosts / rate:.1f} | {rate:.0f} | "
                     f"{rate * cost_ms / 10:.2f} |")
    return ("\n## At 1,000 workers on other hosts: a projection, as a check\n\n"
            f"The scheduler's CPU per event, measured with \"before\" at {big['workers']:,} workers on "
            f"{big['hosts']} hosts ({big['events_s']:.0f} events a second, one per worker and batch): {cost_ms:.2f} ms."
            f"{own} \"after\" sends an event per host and period, the period growing past 1 s once the hosts "
            "would send more than 50 a second (`nbmon.dask.worker.host_period_s`). The events a second of 1,000 "
            "workers on other hosts, times the first cost:\n\n"
            "| layout | seconds between a host's events | events / s | scheduler CPU % |\n|---|---|---|---|\n"
            + "\n".join(lines) + "\n")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_host":
        asyncio.run(_host(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        print(json.dumps(measure(sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4]))), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="each window (default 30)")
    parser.add_argument("--sizes", default="4,32,128,1000,128/32",
                        help="cluster sizes; N/P: N workers in P processes, a host each (default 4,32,128,1000,128/32)")
    parser.add_argument("--before", help="another checkout (a git worktree) measured beside this one")
    parser.add_argument("--anywhere", action="store_true",
                        help="let the scheduler share the CPUs with the rest (default: the first CPU its own)")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    after = os.path.dirname(HERE)
    checkouts = ([("before", os.path.abspath(args.before))] if args.before else []) + [("after", after)]

    def rev(path):
        return subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()

    args.before_rev = rev(args.before) if args.before else ""
    args.after_rev = rev(after)
    args.dirty = bool(subprocess.run(["git", "-C", after, "status", "--porcelain", "--untracked-files=no", "--",
                                      ".", f":!{os.path.relpath(args.output, after)}"],
                                     capture_output=True, text=True).stdout.strip())
    loads = [" ".join(f"{x:.2f}" for x in os.getloadavg())]
    results = []
    cpus = sorted(os.sched_getaffinity(0))
    # The scheduler alone on the first CPU, as on a cluster: its figures are then its own work,
    # not its work slowed by sharing a CPU with the workers' samplers.
    alone = cpus[:1] if len(cpus) > 1 and not args.anywhere else None
    args.placement = (f"the scheduler alone on CPU {alone[0]}, the rest on the other {len(cpus) - 1}" if alone
                      else "every process on any CPU")
    for i, size in enumerate(args.sizes.split(",")):
        for name, path in (checkouts if i % 2 == 0 else checkouts[::-1]):   # alternated
            env = {**os.environ, "PYTHONPATH": path}
            done = subprocess.run([*on(cpus[1:] if alone else None), sys.executable, os.path.abspath(__file__),
                                   "_measure", size, str(args.seconds), json.dumps(alone)],
                                  env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                sys.exit(f"{name} at {size} workers failed:\n{done.stderr[-4000:]}")
            results.append({**json.loads(done.stdout.strip().splitlines()[-1]), "checkout": name})
            print(json.dumps(results[-1]), flush=True)
    loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
    text = report(results, args, loads)
    earlier = ""
    if os.path.exists(args.output):
        with open(args.output) as f:
            old = f.read()
        earlier = old[old.index("\n## Earlier"):] if "\n## Earlier" in old else ""
    with open(args.output, "w") as f:
        f.write(text + earlier)
    print(text)


if __name__ == "__main__":
    main()
