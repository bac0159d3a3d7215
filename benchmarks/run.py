"""nbmon against the tools users would otherwise pick, in one run, on one machine.

    pip install -e ".[bench]"          # calibrax and memory_profiler from PyPI
    python benchmarks/run.py [--quick]  # writes benchmarks/RESULTS.md

Contenders are alternated (A B C ... A B C ...) so that machine drift
cancels; figures are medians with (min-max) and a ratio to nbmon's thread
backend. A contender that is not installed is listed as missing, not faked.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from nbmon.engine import Monitor  # noqa: E402
from nbmon.options import Options  # noqa: E402
from nbmon.sampler import Sampler  # noqa: E402
from nbmon.sources import Sources  # noqa: E402
from nbmon.store import Store  # noqa: E402
from nbmon.summary import summarize  # noqa: E402
import results_file  # noqa: E402  (benchmarks/, the script's own folder)

MIB = 1024 * 1024
SLEEPER = "import time\nwhile True: time.sleep(1)"


# -- contenders: each runs a workload under its monitor --------------------------

class Run:
    """What a contender reports for one monitored workload."""

    def __init__(self, times, peak_mb, sampler_cpu_s, samples):
        self.times = np.asarray(times, dtype=float)
        self.peak_mb = peak_mb
        self.sampler_cpu_s = sampler_cpu_s   # CPU the monitoring itself used (thread or process)
        self.samples = samples


def thread_cpu_s(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def process_cpu_s(pid: int) -> float:
    return time.clock_gettime(((~pid) << 3) | 2)


def new_threads(before: set) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.ident not in before]


def run_nbmon(backend):
    def run(workload, interval):
        monitor = Monitor(interval=interval, gpu=False, backend=backend).start()
        while monitor.store.seq == 0:  # running, like calibrax's sample taken at start
            time.sleep(0.001)
        if backend == "thread":
            tid = next(t.native_id for t in threading.enumerate() if t.name == "nbmon-sampler")
            cpu = lambda: thread_cpu_s(tid)  # noqa: E731
        else:
            reader = next(t.native_id for t in threading.enumerate() if t.name == "nbmon-reader")
            helper = monitor._sampler.proc.pid
            cpu = lambda: thread_cpu_s(reader) + process_cpu_s(helper)  # noqa: E731
        c0 = cpu()
        workload()
        c1 = cpu()
        monitor.stop()
        t, _, cols = monitor.store.series(["proc_rss_mb"])
        return Run(t, monitor.summary().peak_rss_mb, c1 - c0, len(t))
    return run


def run_psutil(workload, interval):
    """A sampler as most tools write it: psutil per tick, a fresh children() scan."""
    proc, stop, times, rss = psutil.Process(), threading.Event(), [], []
    proc.cpu_percent()
    psutil.cpu_percent()

    def loop():
        while not stop.wait(interval):
            procs = [proc] + proc.children(recursive=True)
            total = 0
            for p in procs:
                try:
                    p.cpu_percent()
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            psutil.cpu_percent()
            psutil.virtual_memory()
            times.append(time.monotonic())
            rss.append(total / MIB)
    thread = threading.Thread(target=loop)
    thread.start()
    c0 = thread_cpu_s(thread.native_id)
    workload()
    c1 = thread_cpu_s(thread.native_id)
    stop.set()
    thread.join()
    return Run(times, max(rss, default=0.0), c1 - c0, len(times))


def run_calibrax(workload, interval):
    from calibrax.profiling.resources import ResourceMonitor

    before = {t.ident for t in threading.enumerate()}
    mon = ResourceMonitor(sample_interval_sec=interval)
    with mon:
        tid = new_threads(before)[0].native_id
        c0 = thread_cpu_s(tid)
        workload()
        c1 = thread_cpu_s(tid)
    samples = mon.samples
    return Run([s.timestamp for s in samples], mon.summary.peak_rss_mb, c1 - c0, len(samples))


def run_memory_profiler(workload, interval):
    from memory_profiler import memory_usage

    t0 = time.time()
    cpu0 = sum(c.cpu_times().user + c.cpu_times().system for c in psutil.Process().children())
    mem = memory_usage((workload, (), {}), interval=interval, timestamps=True, include_children=True)
    # Its sampler is a child process that is gone by now: charge what the children used.
    usage = os.times()
    cpu = usage.children_user + usage.children_system - cpu0
    times = [t for _, t in mem if t >= t0]
    return Run([t - t0 + time.monotonic() for t in times], max(m for m, _ in mem), cpu, len(times))


def available(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:
        return False


CONTENDERS = {
    "nbmon (thread)": run_nbmon("thread"),
    "nbmon (process)": run_nbmon("process"),
    "plain psutil": run_psutil,
    "calibrax ResourceMonitor": run_calibrax if available("calibrax.profiling.resources") else None,
    "memory_profiler": run_memory_profiler if available("memory_profiler") else None,
}


# -- workloads ----------------------------------------------------------------

def python_loop(seconds: float):
    def work():
        end = time.perf_counter() + seconds
        x = 0
        while time.perf_counter() < end:
            for i in range(1000):
                x += i
    return work


def gil_held_call():
    # One C call that keeps the GIL for about a second on this machine.
    def work():
        time.sleep(0.3)
        sum(range(100_000_000))
        time.sleep(0.3)
    return work


def numpy_no_gil(seconds: float):
    a = np.random.default_rng(0).random((600, 600))

    def work():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            a @ a  # BLAS releases the GIL
    return work


def spike():
    def work():
        time.sleep(0.25)
        block = np.ones(160 * MIB // 8)  # 160 MiB, every page touched
        time.sleep(0.03)
        del block
        time.sleep(0.25)
    return work


# -- figures ------------------------------------------------------------------

def med(values) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "–"
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def ratio(values, base) -> str:
    values, base = [v for v in values if v == v], [v for v in base if v == v]
    if not values or not base or statistics.median(base) == 0:
        return "–"
    return f"{statistics.median(values) / statistics.median(base):.2f}×"


def alternate(names, rounds, body):
    """{name: [result per round]}, contenders interleaved round by round."""
    out = {n: [] for n in names}
    for _ in range(rounds):
        for n in names:
            gc.collect()
            out[n].append(body(n))
    return out


def tight_loop_cost(children: int, rounds: int, per_round: int) -> dict:
    """µs of thread CPU per sample, no sleeping (wake-up excluded)."""
    kids = [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(children)]
    time.sleep(0.3)
    try:
        samplers = {}
        for exact_peak in (True, False):
            sampler = samplers[exact_peak] = Sampler(
                Sources(os.getpid(), Options(gpu=False, exact_peak=exact_peak)).all, None, 0.1)
            sampler.prime()
            sampler.sink = Store(sampler.fields).append
        exact, sampled = samplers[True], samplers[False]
        proc = psutil.Process()
        proc.cpu_percent()
        pids = [os.getpid()] + [k.pid for k in kids]
        fds = [os.open(f"/proc/{p}/{n}", os.O_RDONLY) for p in pids for n in ("stat", "statm")]
        fds += [os.open(path, os.O_RDONLY) for path in ("/proc/stat", "/proc/meminfo")]

        def floor():
            for fd in fds:
                os.pread(fd, 4096, 0)

        def plain():
            for p in [proc] + proc.children(recursive=True):
                p.cpu_percent()
                p.memory_info()
            psutil.cpu_percent()
            psutil.virtual_memory()

        def calibrax_body():  # calibrax's _sample_loop body, without a profiler
            return (time.perf_counter(), proc.cpu_percent(), proc.memory_info().rss / MIB)

        fns = {"raw-read floor": floor,
               # Only nbmon's sampler ran since the last sample: no high-water mark to read.
               "nbmon (thread), process idle": lambda: exact.step(time.monotonic()),
               # Another thread ran (here the loop itself): this process's mark is read each sample.
               "nbmon (thread), process busy": lambda: exact.step(time.monotonic()),
               # The same without the exact-peak work (Options(exact_peak=False)): its cost is the difference.
               "nbmon (thread), busy, exact peak off": lambda: sampled.step(time.monotonic()),
               "plain psutil": plain, "calibrax ResourceMonitor": calibrax_body}
        if available("memory_profiler"):
            from memory_profiler import _get_memory
            fns["memory_profiler"] = lambda: _get_memory(os.getpid(), "psutil", include_children=True)

        def timed(fn):
            for _ in range(20):
                fn()
            t0 = time.thread_time_ns()
            for _ in range(per_round):
                fn()
            return (time.thread_time_ns() - t0) / per_round / 1000

        def body(name):
            if not name.endswith("idle"):
                return timed(fns[name])
            # As the sampler thread does: nbmon's thread names start with "nbmon-".
            out = []
            reader = threading.Thread(target=lambda: out.append(timed(fns[name])), name="nbmon-bench")
            reader.start()
            reader.join()
            return out[0]
        result = alternate(list(fns), rounds, body)
        for sampler in samplers.values():
            sampler.close_sources()
        for fd in fds:
            os.close(fd)
        return result
    finally:
        for k in kids:
            k.kill()
            k.wait()


def schedstat(tid: int) -> tuple[float, float]:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        on_cpu, runq, _ = f.read().split()
    return int(on_cpu) / 1e9, int(runq) / 1e9


def main_thread_cost(names, interval: float, seconds: float, rounds: int) -> dict:
    """GIL-blocked share of the main thread and wall slowdown of a Python loop."""
    tid = threading.get_native_id()
    n = 3_000_000

    def loop():
        x = 0
        for i in range(n):
            x += i

    def measure(run_under):
        out = {}

        def work():
            c0, q0, w0 = *schedstat(tid), time.perf_counter()
            loop()
            c1, q1, w1 = *schedstat(tid), time.perf_counter()
            out["wall"] = w1 - w0
            # Not on a CPU and not waiting for one: sleeping, and this loop only sleeps on the GIL.
            out["blocked"] = max(0.0, (w1 - w0) - (c1 - c0) - (q1 - q0)) / (w1 - w0) * 100
        run_under(work)
        return out

    names = ["no monitor"] + names

    def body(name):
        if name == "no monitor":
            return measure(lambda w: w())
        return measure(lambda w: CONTENDERS[name](w, interval))
    return alternate(names, rounds, body)


def gaps(names, interval: float, rounds: int) -> dict:
    works = {"pure Python": python_loop(1.5), "C call holding the GIL 1 s": gil_held_call(),
             "NumPy releasing the GIL": numpy_no_gil(1.5)}
    out = {}
    for label, work in works.items():
        def body(name):
            t = CONTENDERS[name](work, interval).times
            return float(np.diff(t).max() * 1000) if len(t) > 1 else float("nan")
        out[label] = alternate(names, rounds, body)
    return out


def spike_capture(names, trials: int) -> dict:
    work = spike()
    base = psutil.Process().memory_info().rss / MIB

    def body(name):
        return CONTENDERS[name](work, 0.1).peak_mb - base >= 0.9 * 160
    return alternate(names, trials, body)


def sampler_cpu(names, interval: float, rounds: int, work) -> dict:
    def body(name):
        r = CONTENDERS[name](work, interval)
        return r.sampler_cpu_s / max(1, r.samples) * 1e6
    return alternate(names, rounds, body)


def memory_figures() -> dict:
    store = Store([f"c{i}" for i in range(34)])
    per_sample = store.nbytes / (store.capacity + store.coarse_capacity)
    tracemalloc.start()
    from nbmon.summary import ResourceSample
    kept = [ResourceSample(timestamp=float(i), cpu_percent=1.5, rss_mb=100.25, gpu_util=None, gpu_mem_mb=None)
            for i in range(20_000)]
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    obj_per_sample = size / len(kept)
    day = 864_000
    w = store.open_window(0.0)
    row = np.ones(34)
    for i in range(1_000_000):
        store.append(i * 0.1, i * 0.1, row)
    times = []
    for _ in range(21):
        t0 = time.perf_counter()
        summarize(w.stats(), peak_exact=True)
        times.append((time.perf_counter() - t0) * 1000)
    samples = [ResourceSample(timestamp=i * 0.1, cpu_percent=1.0, rss_mb=100.0, gpu_util=None, gpu_mem_mb=None)
               for i in range(1_000_000)]
    list_times = []
    for _ in range(5):
        t0 = time.perf_counter()
        rss = [s.rss_mb for s in samples]
        (max(rss), sum(rss) / len(rss), rss[-1] - rss[0])
        list_times.append((time.perf_counter() - t0) * 1000)
    return {"nbmon_per_sample": per_sample, "nbmon_bound_mb": store.nbytes / MIB,
            "objects_per_sample": obj_per_sample, "objects_day_mb": obj_per_sample * day / MIB,
            "nbmon_summary_ms": times, "list_summary_ms": list_times}


def startup_figures(rounds: int) -> dict:
    imports, first = [], []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import nbmon"],
                             capture_output=True, text=True).stderr.strip().splitlines()
        imports.append(int(out[-1].split("|")[1]) / 1000)
    for backend in ("thread", "process"):
        values = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            m = Monitor(interval=0.1, gpu=False, backend=backend).start()
            while m.store.seq == 0:
                time.sleep(0.001)
            values.append((time.perf_counter() - t0) * 1000)
            m.stop()
        first.append((backend, values))
    resmon = []
    code = ("import time\nfrom IPython.core.interactiveshell import InteractiveShell\n"
            "ip = InteractiveShell.instance()\n"
            "ip.run_line_magic('load_ext', 'nbmon')\nimport nbmon.notebook.session as s\n"
            "t0 = time.perf_counter()\nimport io, contextlib\n"
            "with contextlib.redirect_stdout(io.StringIO()): ip.run_line_magic('resmon', '')\n"
            "t1 = time.perf_counter()\nwhile s.SESSION.monitor.store.seq == 0: time.sleep(0.001)\n"
            "print('\\nms', (time.perf_counter() - t0) * 1000, (t1 - t0) * 1000)\n"
            "with contextlib.redirect_stdout(io.StringIO()): ip.run_line_magic('resmon', 'stop')\n")
    for _ in range(max(3, rounds // 2)):
        # The shell also prints the record's updates (text/plain) to stdout, from another thread.
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        times = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("ms ")]
        if not times:
            raise RuntimeError(f"%resmon start-up measurement failed: {run.stderr or run.stdout}")
        resmon.append([float(x) for x in times[0]])
    return {"import_ms": imports, "first": first, "resmon": resmon}


def frame_figures(quick: bool) -> list[str]:
    out = subprocess.run([sys.executable, os.path.join(HERE, "bench_frame.py"), "--builds", "10" if quick else "50"],
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()


# -- report -------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds: a smoke run")
    parser.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    args = parser.parse_args()
    q = args.quick
    names = [n for n, f in CONTENDERS.items() if f is not None]
    missing = [n for n, f in CONTENDERS.items() if f is None]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip() or "?"
    lines = ["# nbmon benchmark results",
             "",
             f"Commit `{commit}`, {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. `python benchmarks/run.py"
             f"{' --quick' if q else ''}`. Median (min–max) over rounds; contenders alternated.",
             ""]
    if missing:
        lines += [f"Not installed here (pip install -e '.[bench]'): {', '.join(missing)}.", ""]

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    log("1. CPU per sample (tight loop)")
    rounds = 5 if q else 15
    lines += ["## 1. CPU µs per sample", "",
              "Tight loop (no sleeping, so wake-up is excluded), thread CPU time. The floor reads what "
              "every sample must: `stat` and `statm` of each process, `/proc/stat` and `/proc/meminfo`. "
              "nbmon reads a process's high-water mark (`/proc/<pid>/status`) in the samples after it "
              "ran: *idle* is a process where only nbmon's sampler ran (a kernel between cells), *busy* "
              "one whose own threads ran in every interval; *exact peak off* is the busy case without "
              "that read (`Options(exact_peak=False)`): the difference is what exact peaks cost.", "",
              "| contender | no children | 4 children | ratio to floor |", "|---|---|---|---|"]
    loops = {k: tight_loop_cost(k, rounds, 200 if q else 1000) for k in (0, 4)}
    for name in loops[0]:
        lines.append(f"| {name} | {med(loops[0][name])} | {med(loops[4][name])} | "
                     f"{ratio(loops[0][name], loops[0]['raw-read floor'])} / "
                     f"{ratio(loops[4][name], loops[4]['raw-read floor'])} |")
    log("1b. sampler CPU at 10 Hz")
    cpu10 = {"idle": sampler_cpu(names, 0.1, 3 if q else 5, lambda: time.sleep(2.0)),
             "busy": sampler_cpu(names, 0.1, 3 if q else 5, python_loop(2.0))}
    lines += ["", "At 10 Hz, the monitor's own CPU (its thread, or its helper process and reader "
              "thread) per sample, while the main thread sleeps (idle) or runs a Python loop (busy):", "",
              "| contender | µs per sample, idle | µs per sample, busy | ratio to nbmon (thread), idle / busy |",
              "|---|---|---|---|"]
    for name in names:
        lines.append(f"| {name} | {med(cpu10['idle'][name])} | {med(cpu10['busy'][name])} | "
                     f"{ratio(cpu10['idle'][name], cpu10['idle']['nbmon (thread)'])} / "
                     f"{ratio(cpu10['busy'][name], cpu10['busy']['nbmon (thread)'])} |")

    log("2. main-thread cost")
    lines += ["", "## 2. Main-thread cost of sampling", "",
              "A pure-Python loop on the main thread: share of its time blocked waiting for the "
              "GIL (wall − on-CPU − run-queue wait, from /proc/self/task/<tid>/schedstat) and its "
              "wall time relative to no monitor.", "",
              "| contender | GIL-blocked % at 10 Hz | wall × at 10 Hz | GIL-blocked % at 100 Hz | wall × at 100 Hz |",
              "|---|---|---|---|---|"]
    costs = {hz: main_thread_cost(names, 1.0 / hz, 1.0, 5 if q else 11) for hz in (10, 100)}
    for name in ["no monitor"] + names:
        cells = []
        for hz in (10, 100):
            rows = costs[hz][name]
            cells += [med([r["blocked"] for r in rows]),
                      ratio([r["wall"] for r in rows], [r["wall"] for r in costs[hz]["no monitor"]])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    log("3. spike capture")
    trials = 8 if q else 20
    caught = spike_capture(names, trials)
    lines += ["", "## 3. Spike capture", "",
              f"A 30 ms, 160 MiB allocate-touch-free in the monitored process, sampled at 10 Hz, {trials} trials: "
              "how often the reported peak catches ≥ 90 % of the spike.", "",
              "| contender | caught |", "|---|---|"]
    for name in names:
        lines.append(f"| {name} | {sum(caught[name])}/{trials} |")

    log("4. gaps")
    interval = 0.02
    gap = gaps(names, interval, 3 if q else 5)
    lines += ["", "## 4. Longest gap between samples", "",
              f"Interval {interval * 1000:.0f} ms (target ≤ {2 * interval * 1000:.0f} ms), longest gap in ms:", "",
              "| contender | " + " | ".join(gap) + " |", "|---" * (len(gap) + 1) + "|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(med(gap[w][name]) for w in gap) + " |")

    log("5. memory")
    mem = memory_figures()
    lines += ["", "## 5. Memory and summary time", "",
              "| figure | nbmon | a list of sample objects (calibrax, plain tools) |", "|---|---|---|",
              f"| bytes per stored sample | {mem['nbmon_per_sample']:.0f} (34 float64 columns + 2 times) | "
              f"{mem['objects_per_sample']:.0f} (a ResourceSample of 7 fields) |",
              f"| a 24 h run at 10 Hz (864,000 samples) | ≤ {mem['nbmon_bound_mb']:.0f} MiB, bounded "
              f"(older samples kept as min/max pairs) | {mem['objects_day_mb']:.0f} MiB, unbounded |",
              f"| summary of 1,000,000 samples, ms | {med(mem['nbmon_summary_ms'])} | "
              f"{med(mem['list_summary_ms'])} (max/mean/growth over the list) |"]

    log("6. live frame")
    lines += ["", "## 6. Live frame", "", "From `benchmarks/bench_frame.py`:", "", "```"]
    lines += frame_figures(q)
    lines += ["```"]

    log("7. start-up")
    st = startup_figures(5 if q else 11)
    lines += ["", "## 7. Start-up", "", "| figure | ms |", "|---|---|",
              f"| `import nbmon` (-X importtime, cumulative) | {med(st['import_ms'])} |"]
    for backend, values in st["first"]:
        lines.append(f"| Monitor(backend='{backend}').start() to first sample | {med(values)} |")
    lines.append(f"| `%resmon` to first sample (IPython shell, includes building the plotly "
                 f"FigureWidget) | {med([r[0] for r in st['resmon']])} |")
    print(results_file.update(args.out, "\n".join(lines) + "\n", owns=r"## \d+\. ", header=True))


if __name__ == "__main__":
    main()
