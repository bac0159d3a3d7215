"""Every kernel at a glance (issue 44): what one refresh of the kernels'
table costs with 1, 20 and 50 kernels of 10 processes each (a kernel and 9
forked workers), and what ``nbmon top`` and ``%resmon kernels`` cost while they show 20 of them.

The kernels are stand-ins with a kernel's command line (``-f
kernel-<n>.json``) and a notebook's name: the table reads /proc, and what it
reads is the same for them as for ipykernels, without starting 50 of those.
CPU is this process's (``time.process_time``) per refresh, the first (each
tree opened) and the later ones (median of 20); ``nbmon top``'s is read
from /proc/<pid>/stat over 20 s in a pseudo-terminal; ``%resmon kernels``'
(its helper's and its kernel's) over 20 s in a real kernel.

    python benchmarks/bench_kernels.py [--out benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import pty
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import results_file  # noqa: E402
from nbmon import overview  # noqa: E402
from nbmon.cli.top import REFRESH_S  # noqa: E402

COUNTS = (1, 20, 50)
WORKERS = 9
REFRESHES = 20
TOP_S = 20.0
# A kernel stand-in: forks its workers, then all sleep until killed.
STAND_IN = ("import os, sys, time\n"
            f"for _ in range({WORKERS}):\n"
            "    if os.fork() == 0:\n"
            "        break\n"
            "time.sleep(3600)")


@contextlib.contextmanager
def stand_ins(count: int, directory: str):
    procs = [subprocess.Popen([sys.executable, "-c", STAND_IN, "-f", f"{directory}/kernel-{n}.json"],
                              env={**os.environ, "JPY_SESSION_NAME": f"{directory}/notebook-{n}.ipynb"})
             for n in range(count)]
    try:
        deadline = time.monotonic() + 60
        while sum(r["proc_count"] for r in overview.measure(0.0, gpu=False).rows
                  if r["notebook"].startswith(directory)) < count * (WORKERS + 1):
            if time.monotonic() > deadline:
                raise RuntimeError("the stand-ins did not start")
            time.sleep(0.2)
        yield procs
    finally:
        # The workers keep their kernel's command line: one pkill ends them all.
        subprocess.run(["pkill", "-9", "-f", f"{directory}/kernel-"], check=False)
        for proc in procs:
            proc.wait()


def refresh_cost() -> tuple[float, list[float]]:
    kernels = overview.Kernels()
    try:
        t0 = time.process_time()
        kernels.refresh()
        first = time.process_time() - t0
        later = []
        for _ in range(REFRESHES):
            time.sleep(0.05)
            t0 = time.process_time()
            kernels.refresh()
            later.append(time.process_time() - t0)
        return first, later
    finally:
        kernels.close()


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def top_cost() -> float:
    """nbmon top's CPU, % of a core, over TOP_S in a pseudo-terminal (after its first table)."""
    leader, follower = pty.openpty()
    top = subprocess.Popen([sys.executable, "-m", "nbmon.cli", "top"], stdin=follower, stdout=follower,
                           stderr=follower, start_new_session=True)
    os.close(follower)

    def drain(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.1)[0]:
                os.read(leader, 65536)

    try:
        drain(3.0)
        start = cpu_s(top.pid)
        drain(TOP_S)
        return (cpu_s(top.pid) - start) / TOP_S * 100.0
    finally:
        os.write(leader, b"q")
        top.wait(20)
        os.close(leader)


def widget_cost() -> tuple[float, float]:
    """``%resmon kernels`` in a real kernel, its table shown (the test is the
    page: it says so every 5 s): the CPU of its helper and of the kernel
    (which relays the table to the page), % of a core over TOP_S."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", stderr=subprocess.DEVNULL)
    try:
        opened = []
        kc.execute_interactive("%load_ext nbmon\n%resmon kernels", timeout=120, output_hook=lambda msg: (
            msg["msg_type"] == "comm_open" and "table" in msg["content"]["data"].get("state", {})
            and opened.append(msg["content"]["comm_id"])))
        comm_id = opened[0]
        kernel = km.provisioner.process.pid
        with open(f"/proc/{kernel}/task/{kernel}/children") as f:
            helper = int(f.read().split()[0])

        def seen() -> None:
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {
                "method": "custom", "content": {"type": "nbmon:seen"}}}))

        seen()
        time.sleep(3.0)
        start, t0 = (cpu_s(helper), cpu_s(kernel)), time.monotonic()
        while time.monotonic() - t0 < TOP_S:
            seen()
            time.sleep(5.0)
        elapsed = time.monotonic() - t0
        return ((cpu_s(helper) - start[0]) / elapsed * 100.0, (cpu_s(kernel) - start[1]) / elapsed * 100.0)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f} ({min(values) * 1000:.1f}–{max(values) * 1000:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    rows, top_percent, widget_percent = [], None, None
    for count in COUNTS:
        with tempfile.TemporaryDirectory(prefix="nbmon-bench-kernels-") as directory, stand_ins(count, directory):
            first, later = refresh_cost()
            rows.append(f"| {count} | {count * (WORKERS + 1)} | {first * 1000:.1f} | {ms(later)} |")
            if count == 20:
                top_percent = top_cost()
                widget_percent = widget_cost()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    text = "\n".join([
        "## The kernels' table (nbmon kernels, nbmon top)", "",
        f"Commit `{commit}`, {platform.platform()}, {os.cpu_count()} CPUs, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. `python benchmarks/bench_kernels.py`. "
        f"Stand-in kernels (a kernel's command line, {WORKERS} forked workers each); CPU ms of one refresh "
        f"(every kernel found in /proc, each tree's CPU, PSS from smaps_rollup, the black boxes read): the first "
        f"(each tree opened), then the median (min–max) of {REFRESHES}.", "",
        "| kernels | processes | first refresh, CPU ms | later refreshes, CPU ms |", "|---|---|---|---|",
        *rows, "",
        f"`nbmon top` showing 20 of them (a refresh every {REFRESH_S:g} s), idle in a terminal: "
        f"{top_percent:.2f} % of a core over {TOP_S:g} s. `%resmon kernels` showing them in a notebook (the "
        f"page shows it): its helper {widget_percent[0]:.2f} %, the kernel (relaying the table) "
        f"{widget_percent[1]:.2f} % of a core.", ""])
    print(text)
    results_file.update(args.out, text, owns=r"## The kernels' table", header=False)


if __name__ == "__main__":
    main()
