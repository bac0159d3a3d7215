"""The memory scenarios of issue 16, before and after, against ground truth.

    python benchmarks/scenarios.py [--before DIR] [--runs N]

Each scenario runs in fresh processes, once with the nbmon of this checkout
and once with the nbmon in DIR (another checkout, e.g. ``git worktree add
/tmp/before c135e1e``; put first on PYTHONPATH), alternated. The truth is
taken outside nbmon, as in tests/test_memory.py (whose workloads these
are): a memory cgroup the script makes (its exact peak), the processes' own
VmHWM and getrusage, wait4's accounts. Prints one Markdown table per
scenario: median (min-max) over the runs. Needs root for the cgroups.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import test_memory as tm  # noqa: E402  (the workloads)
from cgroups import MemoryCgroup  # noqa: E402

PY = sys.executable

# Run under either nbmon: the headline peak as each version names it.
WATCH = """
import json, os, sys, time
from nbmon.engine import Monitor
pid, prefix = int(sys.argv[1]), sys.argv[2]
with Monitor(pid, interval=0.1, gpu=False) as mon:
    span = mon.window()
    open(prefix + ".go", "w").close()
    while not os.path.exists(prefix + ".done"):
        time.sleep(0.005)
    s = span.close()
open(prefix + ".end", "w").close()
new = getattr(s, "peak_mem_mb", None) is not None
print(json.dumps({"peak": s.peak_mem_mb if new else s.peak_rss_mb,
                  "kind": s.peak_mem_kind if new else s.peak_rss_kind,
                  "rss_sum": s.peak_rss_mb, "limit": s.memory_limit_mb,
                  "container": getattr(s, "peak_container_mem_mb", None),
                  "growth": s.mem_growth_mb if new else s.memory_growth_mb,
                  "file_growth": getattr(s, "file_growth_mb", None),
                  "rows": s.rows()}))
"""


def env_for(nbmon_dir: str | None) -> dict:
    env = dict(os.environ)
    if nbmon_dir:
        env["PYTHONPATH"] = nbmon_dir + os.pathsep + env.get("PYTHONPATH", "")
    return env


def watched(script: str, nbmon_dir: str | None, limit_mb: float | None = None) -> tuple[dict, float]:
    """Run a workload of tests/test_memory.py under a monitor of the given
    nbmon (from another process: the workload's own figures stay its own),
    inside a fresh cgroup; (the monitor's figures, the cgroup's exact peak)."""
    tmp = tempfile.mkdtemp(prefix="nbmon-scenario-")
    prefix = os.path.join(tmp, "work")
    code = "import os, sys, time\n" + textwrap.dedent(script)
    with MemoryCgroup(limit_mb=limit_mb) as group:
        work = subprocess.Popen([PY, "-c", code, prefix])
        group.add(work.pid)
        tm.wait_until(lambda: os.path.exists(prefix + ".ready") or work.poll() is not None, what="ready")
        out = subprocess.run([PY, "-c", WATCH, str(work.pid), prefix], capture_output=True, text=True,
                             timeout=300, env=env_for(nbmon_dir))
        work.wait(120)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        return json.loads(out.stdout.strip().splitlines()[-1]), group.peak_mb()


def med(values) -> str:
    values = [v for v in values if v is not None and v == v]
    if not values:
        return "–"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def kinds(values) -> str:
    return ", ".join(f"{k} {values.count(k)}/{len(values)}" for k in sorted(set(values)))


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# -- scenarios -------------------------------------------------------------------------

def forked_pool(versions, runs):
    got = {v: [] for v in versions}
    for _ in range(runs):
        for v, d in versions.items():
            got[v].append(watched(tm.FORKED_POOL, d, limit_mb=3072))
    rows = [[v, med([r["peak"] for r, _ in got[v]]), kinds([r["kind"] for r, _ in got[v]]),
             med([r["rss_sum"] for r, _ in got[v]]), med([r["container"] for r, _ in got[v]]),
             med([t for _, t in got[v]])] for v in versions]
    return table("A 1 GiB array read by 4 forked workers, in a container limited to 3 GiB (MiB)",
                 ["nbmon", "headline peak", "label", "RSS sum peak", "container's usage peak", "truth: the cgroup's exact peak"],
                 rows)


def shared_segment(versions, runs):
    got = {v: [] for v in versions}
    for _ in range(runs):
        for v, d in versions.items():
            prefix = f"/dev/shm/nbmon-scenario-{os.getpid()}-{time.monotonic_ns()}"
            try:
                got[v].append(watched(tm.SHARED_SEGMENT.replace('sys.argv[1] + ".shm"', repr(prefix)), d))
            finally:
                os.unlink(prefix)
    rows = [[v, med([r["peak"] for r, _ in got[v]]), med([t for _, t in got[v]])] for v in versions]
    return table("A 500 MiB /dev/shm segment mapped and read by 3 processes (MiB)",
                 ["nbmon", "headline peak", "truth: the cgroup's exact peak"], rows)


def memmap(versions, runs):
    got = {v: [] for v in versions}
    for _ in range(runs):
        for v, d in versions.items():
            got[v].append(watched(tm.MEMMAP.replace('while not os.path.exists(sys.argv[1] + ".end"):\n    time.sleep(0.005)\n', ""), d)[0])
    rows = []
    for v in versions:
        split = [next((text for t, text in r["rows"] if "by kind" in t), "no split") for r in got[v]]
        rows.append([v, med([r["growth"] for r in got[v]]), med([r["file_growth"] for r in got[v]]), split[-1]])
    return table("A 512 MiB file read through np.memmap (truth: 512 MiB of page cache)",
                 ["nbmon", "growth shown", "of which page cache", "what the record says"], rows)


def observer(versions, runs):
    rows = []
    for v, d in versions.items():
        inside = [subprocess.run([PY, "-c", tm.SPIKE.format(
            monitor="from nbmon.engine import Monitor\nmon = Monitor(interval=0.1, gpu=False).start()",
            stop="mon.stop()")], capture_output=True, text=True, env=env_for(d), timeout=120) for _ in range(runs)]
        inside = [json.loads(r.stdout.strip().splitlines()[-1])["maxrss_kb"] / 1024 for r in inside]
        code = tm.SPIKE.format(monitor="", stop="")
        waited = [waited_maxrss([PY, "-m", "nbmon.cli", "run", "--quiet", "--", PY, "-c", code], d) / 1024
                  for _ in range(runs)]
        cell = [subprocess.run([PY, "-c", tm.CELL], capture_output=True, text=True, env=env_for(d), timeout=120)
                for _ in range(runs)]
        cell = [json.loads(r.stdout.strip().splitlines()[-1])["maxrss_kb"] / 1024 for r in cell]
        rows.append([v, med(inside), med(waited), med(cell)])
    alone = [waited_maxrss([PY, "-c", tm.SPIKE.format(monitor="", stop="")], None) / 1024 for _ in range(runs)]
    rows.append(["truth: no nbmon", med(alone), med(alone), med(alone)])
    return table("What the watched process reads of its own peak after a 500 MiB spike (MiB)",
                 ["nbmon", "ru_maxrss under a Monitor", "/usr/bin/time -v (wait4) of nbmon run", "ru_maxrss after a %%resmon cell"],
                 rows)


def waited_maxrss(argv, nbmon_dir) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_for(nbmon_dir))
    return os.wait4(proc.pid, 0)[2].ru_maxrss


def short_child(versions, runs):
    rows = []
    for how, label in (("t = threading.Thread(target=spawn); t.start(); t.join()", "from a thread"),
                       ("spawn()", "from the main thread")):
        for v, d in versions.items():
            got = []
            for _ in range(runs):
                tmp = tempfile.mkdtemp(prefix="nbmon-scenario-")
                prefix = os.path.join(tmp, "work")
                script = tm.SHORT_CHILD.format(child=tm.CHILD_300, how=how)
                work = subprocess.Popen([PY, "-c", "import os, sys, time\n" + script, prefix])
                tm.wait_until(lambda: os.path.exists(prefix + ".ready"), what="ready")
                out = subprocess.run([PY, "-c", WATCH, str(work.pid), prefix], capture_output=True, text=True,
                                     timeout=300, env=env_for(d))
                work.wait(120)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                truth = int(open(prefix + ".hwm").read()) / 1024
                got.append((r, truth))
            rows.append([label, v, med([r["peak"] for r, _ in got]), kinds([r["kind"] for r, _ in got]),
                         med([t for _, t in got])])
    return table("A child filling 300 MiB for 0.3 s (MiB; truth: the child's own VmHWM, plus the root's ~20 MiB)",
                 ["started", "nbmon", "headline peak", "label", "truth: child's VmHWM"], rows)


def pinned_loop(versions, runs):
    rows = []
    for v, d in versions.items():
        monitor, cli = [], []
        for _ in range(runs):
            code = ("import json, subprocess, sys, time\nfrom nbmon.engine import Monitor\n"
                    f"loop = subprocess.Popen({tm.TRUE_LOOP!r})\n"
                    "mon = Monitor(loop.pid, interval=0.1, gpu=False, system=False).start()\nloop.wait()\n"
                    "while mon.running: time.sleep(0.01)\nmon.stop()\nprint(mon.summary().peak_cpu_percent)")
            monitor.append(float(subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env_for(d),
                                                timeout=120).stdout.split()[-1]))
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run([PY, "-m", "nbmon.cli", "run", "--quiet", "--summary-json", f"{tmp}/s.json", "--",
                                *tm.TRUE_LOOP], env=env_for(d), timeout=120, capture_output=True)
                cli.append(json.load(open(f"{tmp}/s.json"))["peak_cpu_percent"])
        rows.append([v, med(monitor), f"{sum(x > 105 for x in monitor)}/{runs}", med(cli),
                     f"{sum(x > 105 for x in cli)}/{runs}"])
    return table("1,000 /bin/true from a shell pinned to one CPU: peak CPU % (truth: at most 100)",
                 ["nbmon", "Monitor", "above 105 %", "nbmon run", "above 105 %"], rows)


def daemons(versions, runs):
    rows = []
    for v, d in versions.items():
        said = 0
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                pid_file = os.path.join(tmp, "daemon")
                done = subprocess.run([PY, "-m", "nbmon.cli", "run", "--quiet", "--", PY, "-c", tm.DAEMON, pid_file],
                                      capture_output=True, text=True, env=env_for(d), timeout=120)
                tm.wait_until(lambda: os.path.exists(pid_file) and open(pid_file).read(), what="daemon")
                daemon = open(pid_file).read()
                middle = open(pid_file + ".mid").read() if os.path.exists(pid_file + ".mid") else ""
                found = re.search(r"still run \(pid ([\d, ]+)\)", done.stderr)
                said += bool(found and {daemon, middle} & set(found.group(1).split(", ")))
                while os.path.exists(f"/proc/{daemon}"):
                    time.sleep(0.05)
        short = 0
        for _ in range(max(1, runs // 2)):
            done = subprocess.run([PY, "-m", "nbmon.cli", "run", "--quiet", "--", "sh", "-c",
                                   "i=0; while [ $i -lt 1500 ]; do /bin/true; i=$((i+1)); done"],
                                  capture_output=True, text=True, env=env_for(d), timeout=120)
            short += "still run" not in done.stderr
        means = 0
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run([PY, "-m", "nbmon.cli", "run", "--quiet", "--summary-json", f"{tmp}/s.json", "--", PY, "-c",
                                "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.05: pass"],
                               env=env_for(d), timeout=120, capture_output=True)
                s = json.load(open(f"{tmp}/s.json"))
                means += (s.get("peak_cpu_percent") or -1) >= (s.get("mean_cpu_percent") or 0)
        rows.append([v, f"{said}/{runs}", f"{short}/{max(1, runs // 2)}", f"{means}/{runs}"])
    return table("nbmon run: what it says is left running, and short commands",
                 ["nbmon", "a double-forked daemon named", "1,500 reaped children: none said to run",
                  "a 50 ms command: peak ≥ mean"], rows)


SCENARIOS = {"pool": forked_pool, "shm": shared_segment, "memmap": memmap, "observer": observer,
             "child": short_child, "cpu": pinned_loop, "run": daemons}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", metavar="DIR", help="another checkout to run beside this one")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    # Out of the checkout: `python -c` puts the working directory first on sys.path.
    os.chdir(tempfile.gettempdir())
    versions = {"after": None}
    if args.before:
        versions = {"before": os.path.abspath(args.before), "after": None}
    print(f"`python benchmarks/scenarios.py{' --before ' + args.before if args.before else ''} --runs {args.runs}`, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {open('/proc/loadavg').read().split()[0]}\n")
    for name in args.only or SCENARIOS:
        print(SCENARIOS[name](versions, args.runs), flush=True)


if __name__ == "__main__":
    main()
