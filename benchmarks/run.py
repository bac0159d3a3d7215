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
import resource
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
from nbmon.sampling.sampler import Sampler  # noqa: E402
from nbmon.sources import Sources  # noqa: E402
from nbmon.sources.procfs import BUDGET, fd_budget  # noqa: E402
from nbmon.sources.tree import ProcessTree  # noqa: E402
from nbmon.sampling.store import Store  # noqa: E402
from nbmon.report.summary import summarize  # noqa: E402
import results_file  # noqa: E402  (benchmarks/, the script's own folder)

sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from test_do_no_harm import POOL_UNDER_A_LIMIT, run_child  # noqa: E402  (the pool the test measures)

MIB = 1024 * 1024
SLEEPER = "import time\nwhile True: time.sleep(1)"


# -- contenders: each runs a workload under its monitor --------------------------

class Run:
    """What a contender reports for one monitored workload."""

    def __init__(self, times, peak_mb, sampler_cpu_s, samples, base_mb=None):
        self.times = np.asarray(times, dtype=float)
        self.peak_mb = peak_mb
        self.sampler_cpu_s = sampler_cpu_s   # CPU the monitoring itself used (thread or process)
        self.samples = samples
        # The contender's own figure before the workload, where it differs from the RSS: nbmon's
        # headline is PSS, below RSS by the pages shared with other processes (the parent's libraries).
        self.base_mb = base_mb


def thread_cpu_s(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def process_cpu_s(pid: int) -> float:
    return time.clock_gettime(((~pid) << 3) | 2)


def new_threads(before: set) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.ident not in before]


def run_nbmon(backend, exact_peaks=False):
    def run(workload, interval):
        monitor = Monitor(interval=interval, gpu=False, backend=backend, exact_peaks=exact_peaks).start()
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
        t, _, cols = monitor.store.series(["proc_pss_mb"])
        return Run(t, monitor.summary().peak_mem_mb, c1 - c0, len(t), base_mb=float(cols["proc_pss_mb"][0]))
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
        for exact_peaks in (False, True):
            sampler = samplers[exact_peaks] = Sampler(
                Sources(os.getpid(), Options(gpu=False, exact_peaks=exact_peaks)).all, None, 0.1)
            sampler.prime()
            sampler.sink = Store(sampler.fields).append
        default, resets = samplers[False], samplers[True]
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
               # Only nbmon's sampler ran since the last sample: nothing of the process to read but its clock.
               "nbmon (thread), process idle": lambda: default.step(time.monotonic()),
               # Another thread ran (here the loop itself): its status (memory, mark) and stat are read.
               "nbmon (thread), process busy": lambda: default.step(time.monotonic()),
               # The opt-in (Options(exact_peaks=True)): the mark is also reset, through the board.
               "nbmon (thread), busy, --exact-peaks": lambda: resets.step(time.monotonic()),
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
            return in_nbmon_thread(lambda: timed(fns[name]))
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


def in_nbmon_thread(fn):
    """``fn()`` on a thread named as nbmon's sampler is (its own CPU is then
    not the watched process running), its answer."""
    out = []
    reader = threading.Thread(target=lambda: out.append(fn()), name="nbmon-bench")
    reader.start()
    reader.join()
    return out[0]


def tree_cost(children: int, rounds: int, per_round: int, exact: bool = False) -> dict:
    """The process tree alone, this process and ``children`` sleeping
    children: µs of thread CPU per sample when nothing ran (each process's
    clock only) and per full sample (every process's stat and status, and
    with ``exact`` its high-water mark taken and reset: kept open within the
    fd budget, by path beyond it), and the fds kept."""
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(children)]
    tree = ProcessTree(os.getpid(), exact_peaks=exact)
    try:
        tree.start()
        deadline = time.monotonic() + 60
        while len(tree.pids) < children + 1 and time.monotonic() < deadline:
            tree.boundary()
            tree.sample(time.monotonic())
        kept = BUDGET.held

        def timed(full: bool) -> float:
            t0 = time.thread_time_ns()
            for _ in range(per_round):
                if full:
                    tree.boundary()
                tree.sample(time.monotonic())
            return (time.thread_time_ns() - t0) / per_round / 1000
        out = alternate(["idle", "full"], rounds, lambda kind: in_nbmon_thread(lambda: timed(kind == "full")))
        return {**out, "kept": kept, "counted": len(tree.pids), "limit": fd_budget()}
    finally:
        tree.close()
        for k in kids:
            k.kill()
            k.wait()


def fds_held(children: int, exact: bool, limit: int) -> dict:
    """A Monitor on a fresh process and ``children`` sleeping children under
    ``ulimit -n limit`` (0: as it is): the descriptors it holds, the
    processes it counts, how many of 100 ``open()`` of the process's own
    failed meanwhile (tests/test_do_no_harm.py's pool)."""
    return run_child(POOL_UNDER_A_LIMIT, children, exact, limit, env={"PYTHONPATH": os.path.dirname(HERE)})


WALKED = """
import mmap, os, sys, time
import numpy as np
from nbmon.sources.tree import ProcessTree
size = 1 << 30
if sys.argv[1] == "4k":
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    a = np.frombuffer(buf, np.float64)
else:
    a = np.empty(size // 8)
a[:] = 1.0
tree = ProcessTree(os.getpid())
tree.start()
proc = tree._reader.procs[os.getpid()]
t0 = time.thread_time()
for _ in range(10):
    proc.walk()
print((time.thread_time() - t0) / 10 * 1000)
"""

POOL_RUN = """
import multiprocessing as mp, os, sys, time
import numpy as np
from nbmon.engine import Monitor
a = np.ones(1 << 27)                       # 1 GiB, shared with 4 forked workers
def work(_):
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:          # they read it, and write 1 % of it a second (copy-on-write)
        a[np.random.randint(0, a.size, a.size // 100 // 4 // 10) * 1] += 0.0
        time.sleep(0.1)
    return 0
mon = Monitor(interval=0.1, gpu=False).start()
t0 = time.monotonic()
with mp.get_context("fork").Pool(4) as pool:
    pool.map(work, range(4))
wall = time.monotonic() - t0
walker = mon.sources.tree._reader.walker
mon.stop()
print(walker.walks, walker.spent_s, wall)
"""


def walk_figures(rounds: int, seconds: float) -> dict:
    """What reading PSS costs: one walk of a 1 GiB process (4 KiB pages,
    huge pages), and the walker's share of a core over a run of a forked
    pool that writes into what it shares."""
    out = {kind: [float(subprocess.run([sys.executable, "-c", WALKED, kind], capture_output=True, text=True,
                                       timeout=120).stdout) for _ in range(rounds)] for kind in ("4k", "huge")}
    runs = []
    for _ in range(rounds):
        walks, spent, wall = subprocess.run([sys.executable, "-c", POOL_RUN, str(seconds)], capture_output=True,
                                            text=True, timeout=300).stdout.split()
        runs.append((int(walks), float(spent), float(wall)))
    out["walks"] = [r[0] for r in runs]
    out["share"] = [r[1] / r[2] * 100 for r in runs]
    return out


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


SPIKE_ONLY = {"nbmon (thread), --exact-peaks": run_nbmon("thread", exact_peaks=True),
              "nbmon (process), --exact-peaks": run_nbmon("process", exact_peaks=True)}


def spike_capture(names, trials: int) -> dict:
    """Trials in a fresh interpreter each (``run.py --spike NAME``): in a
    long-lived process the high-water mark stands at the highest it ever
    was, and what the default (no resets) can say depends on that history."""
    def body(name):
        done = subprocess.run([sys.executable, __file__, "--spike", name], capture_output=True, text=True,
                              timeout=120)
        return done.stdout.strip() == "caught"
    return alternate(names, trials, body)


def one_spike(name: str) -> None:
    """The process has been running a while (its mark: its size now), then
    spikes once: caught or missed."""
    np.ones(1)
    base = psutil.Process().memory_info().rss / MIB
    run = {**CONTENDERS, **SPIKE_ONLY}[name](spike(), 0.1)
    print("caught" if run.peak_mb - (base if run.base_mb is None else run.base_mb) >= 0.9 * 160 else "missed")


def repeated_spikes(name: str, trials: int) -> int:
    """One process, the same spike ``trials`` times under one contender each
    (the kernel between cells: its mark is the first spike's after the first)."""
    work = spike()
    base = psutil.Process().memory_info().rss / MIB
    runs = [{**CONTENDERS, **SPIKE_ONLY}[name](work, 0.1) for _ in range(trials)]
    return sum(r.peak_mb - (base if r.base_mb is None else r.base_mb) >= 0.9 * 160 for r in runs)


def sampler_cpu(names, interval: float, rounds: int, work) -> dict:
    def body(name):
        r = CONTENDERS[name](work, interval)
        return r.sampler_cpu_s / max(1, r.samples) * 1e6
    return alternate(names, rounds, body)


def memory_figures() -> dict:
    store = Store([f"c{i}" for i in range(34)])
    per_sample = store.nbytes / (store.capacity + store.coarse_capacity)
    tracemalloc.start()
    from nbmon.report.summary import ResourceSample
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
        summarize(w.stats())
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
            "ip.run_line_magic('load_ext', 'nbmon')\nimport nbmon.kernel.session as s\n"
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

def big_trees(q: bool) -> list[str]:
    """Section 8: the tree's cost by size, the descriptors a monitor holds, the walks."""
    lines = ["## 8. Big trees and shared pages", "",
             "The process tree alone, this process and N sleeping children (`sleep`), µs of thread CPU "
             "per sample: *idle* when no process ran (each one's CPU clock only: no file), *full* every "
             "process's `stat` and `status` (the 1 s cadence, a span's boundary), with *exact peaks* also "
             "its mark taken and reset (`status`, `clear_refs`, its board locked, read and written). Files "
             f"are kept open within the fd budget ({fd_budget()} here: 64 or 5 % of `RLIMIT_NOFILE`, "
             "whichever is smaller) and opened for each read beyond it.", "",
             "| children | µs per sample, idle | µs per sample, full | fds kept open | processes counted |",
             "|---|---|---|---|---|"]
    for exact in (False, True):
        for n in (10, 100, 1000):
            cost = tree_cost(n, 3 if q else 7, 20 if q else 100, exact)
            lines.append(f"| {n}{', exact peaks' if exact else ''} | {med(cost['idle'])} | {med(cost['full'])} | "
                         f"{cost['kept']} | {cost['counted']} |")
    normal = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limits = (256, 0)
    lines += ["", "What a whole monitor (`Monitor(interval=0.1)`, every source) holds in a fresh process "
              "watching itself and N sleeping children, under `ulimit -n 256` and as it is "
              f"({normal}): file descriptors held (the least of 10 counts of `/proc/self/fd`, less the "
              "count before the start), the processes counted, and how many of 100 `open()` calls of "
              "the process's own code failed meanwhile. *Exact peaks* keeps each process's "
              "`clear_refs`, `status` and board open within the same budget.", "",
              "| children | " + " | ".join(f"{mode}, `ulimit -n {limit or normal}`" for limit in limits
                                         for mode in ("default", "exact peaks")) + " |",
              "|---" * 5 + "|"]
    for n in (10, 100, 500):
        cells = []
        for limit in limits:
            for exact in (False, True):
                got = fds_held(n, exact, limit)
                cells.append(f"{got['held']} held, {got['count']:.0f}/{n + 1} counted, {got['failed']} failed")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    walks = walk_figures(3 if q else 5, 10.0 if q else 30.0)
    lines += ["", "Shared pages counted once: PSS from `smaps_rollup`, whose read walks the page tables. "
              "One walk of a 1 GiB process, ms of CPU: "
              f"{med(walks['4k'])} in 4 KiB pages, {med(walks['huge'])} in huge pages. The walks are paid "
              "from a budget (0.5 % of a core on average), when the tree's membership or its shareable "
              "pages change and at most every 5 s while it runs. Over a run of a 1 GiB kernel with a "
              "4-worker forked pool writing into what it shares (copy-on-write), "
              f"{'30' if not q else '10'} s, the walks took {med(walks['share'])} % of a core "
              f"({med(walks['walks'])} walks)."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds: a smoke run")
    parser.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    parser.add_argument("--spike", metavar="CONTENDER", help=argparse.SUPPRESS)  # one trial, in this process
    parser.add_argument("--only", type=int, choices=[8], help="run section 8 alone; its figures replace its own")
    args = parser.parse_args()
    if args.spike:
        return one_spike(args.spike)
    q = args.quick
    if args.only:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=HERE).stdout.strip() or "?"
        lines = big_trees(q)
        lines[1:1] = ["", f"This section alone: commit `{commit}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                          f"`python benchmarks/run.py --only 8{' --quick' if q else ''}`."]
        return print(results_file.replace_section(args.out, "\n".join(lines) + "\n"))
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
              "Tight loop (no sleeping, so wake-up is excluded), thread CPU time. The floor reads "
              "`stat` and `statm` of each process, `/proc/stat` and `/proc/meminfo`. nbmon reads a "
              "process's CPU clock every sample, and its `status` (memory, high-water mark) and `stat` "
              "(reaped children's CPU) in the samples after it ran: *idle* is a process where only "
              "nbmon's sampler ran (a kernel between cells), *busy* one whose own threads ran in every "
              "interval; *--exact-peaks* is the busy case with the opt-in resets (`clear_refs` and the "
              "board's lock and read-write).", "",
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
    spikers = names + list(SPIKE_ONLY)
    caught = spike_capture(spikers, trials)
    again = {name: repeated_spikes(name, trials) for name in spikers}
    lines += ["", "## 3. Spike capture", "",
              f"A 30 ms, 160 MiB allocate-touch-free in the monitored process, sampled at 10 Hz, {trials} trials: "
              "how often the reported peak catches ≥ 90 % of the spike. *First spike*: each trial in a fresh "
              "process, whose high-water mark is its size until then. *Same spike again*: one process "
              "spikes every trial: without resets, nbmon can then only say that the peak was at most the "
              "mark (the figure is the sampled one, labelled so); `--exact-peaks` resets the mark, which "
              "also resets what `ru_maxrss` and `/usr/bin/time -v` read.", "",
              "| contender | first spike | same spike again |", "|---|---|---|"]
    for name in spikers:
        lines.append(f"| {name} | {sum(caught[name])}/{trials} | {again[name]}/{trials} |")

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
    log("8. big trees, shared pages")
    lines += [""] + big_trees(q)
    print(results_file.update(args.out, "\n".join(lines) + "\n", owns=r"## \d+\. ", header=True))


if __name__ == "__main__":
    main()
