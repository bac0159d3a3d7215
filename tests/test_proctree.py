"""ProcessTree on real processes, through both readers (/proc and psutil).

The tree's root is usually a "driver": a Python child that runs code the test
sends it, so the test decides exactly when the tree gains, loses and reaps
processes, and the pytest process's own CPU stays out of the figures.
"""
from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from helpers import DEADLINE_S, burn_cpu, fd_count, free_pid, in_forked_child, wait_until
from nbmon import catalog
from nbmon.sources.tree import ProcessTree

MIB = 1024 * 1024
READERS = [pytest.param(True, id="proc"), pytest.param(False, id="psutil")]
FIELDS = catalog.names(catalog.TREE)

DRIVER = r"""
import json, sys
ns = {}
for line in sys.stdin:
    ns["out"] = None
    try:
        exec(json.loads(line), ns)
        reply = {"ok": ns["out"]}
    except BaseException as err:
        reply = {"error": repr(err)}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""

# Burns `secs` of its own CPU time, noting (monotonic, process_time) as it
# goes, then writes the marks to `path` (renamed into place when complete).
BURN = r"""
import json, os, sys, time
path, secs = sys.argv[1], float(sys.argv[2])
marks = []
c0 = time.process_time()
while True:
    c = time.process_time()
    marks.append((time.monotonic(), c))
    if c - c0 >= secs:
        break
    x = 0
    for _ in range(2000):
        x += 1
with open(path + ".tmp", "w") as f:
    json.dump(marks, f)
os.rename(path + ".tmp", path)
"""


class Driver:
    """A Python child that executes the code sent to it; ``out`` is the reply."""

    def __init__(self, **popen):
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, **popen)
        self.pid = self.proc.pid
        self.run("import os, subprocess, sys, time")

    def run(self, code: str):
        self.proc.stdin.write(json.dumps(code) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the driver died"
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"driver: {reply['error']}")
        return reply["ok"]

    def cpu_s(self) -> tuple[float, float]:
        """The kernel's account: (CPU of its reaped descendants, its own CPU)."""
        kids, own = self.run("t = os.times(); out = [t.children_user + t.children_system, time.process_time()]")
        return kids, own

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.close()


def sample(tree: ProcessTree) -> dict[str, float]:
    return tree.sample(time.monotonic())


def poll(tree: ProcessTree, cond, what: str) -> dict[str, float]:
    """Sample until ``cond(sample)`` holds (that sample); fail after DEADLINE_S."""
    last: dict[str, float] = {}

    def holds():
        last.clear()
        last.update(sample(tree))
        return dict(last) if cond(last) else None

    return wait_until(holds, what=lambda: f"{what}; last sample {last}")


def wait_for_file(path) -> None:
    wait_until(lambda: os.path.exists(path), timeout=DEADLINE_S, what=f"{path} to appear")


# -- basics ------------------------------------------------------------------

@pytest.mark.parametrize("use_proc", READERS)
def test_reader_and_fields(use_proc):
    tree = ProcessTree(use_proc=use_proc)
    assert tree.reader == ("proc" if use_proc else "psutil")
    tree.start()
    try:
        s = sample(tree)
        # I/O is read on the cadence: not in a sample between two reads.
        assert math.isnan(s["proc_read_bytes"])
        tree.boundary()  # a span's boundary reads them
        s = sample(tree)
        assert tree.fields == FIELDS and set(s) == set(FIELDS)
        assert all(type(v) is float for v in s.values())
        # This process and the children it already had (other tests' long-lived helpers).
        others = {c.pid for c in psutil.Process().children(recursive=True)}
        assert s["proc_count"] == 1.0 + len(others)
        assert set(tree.pids) == {os.getpid()} | others
        assert s["proc_threads"] >= 1
        assert s["proc_rss_mb"] > 1
        assert math.isfinite(s["proc_read_bytes"]) and math.isfinite(s["proc_write_bytes"])
        assert tree.root_alive
    finally:
        tree.close()


@pytest.mark.parametrize("use_proc", READERS)
def test_first_sample_after_start_has_true_cpu_percent(use_proc):
    tree = ProcessTree(children=False, use_proc=use_proc)
    t0 = time.monotonic()
    # The tree reads the kernel's counter somewhere inside start() and
    # sample(): the truth is bracketed by process_time() on either side of
    # each, so CPU either call itself uses (or a busy machine makes it use)
    # cannot flip the test.
    outer_c0 = time.process_time()
    tree.start(t0)
    inner_c0 = time.process_time()
    try:
        burn_cpu(0.3)
        inner_c1 = time.process_time()
        t1 = time.monotonic()
        first = tree.sample(t1)
        outer_c1 = time.process_time()
    finally:
        tree.close()
    # /proc/PID/stat gives utime and stime in whole ticks, each rounded down.
    slack_s = 2 * 2 / os.sysconf("SC_CLK_TCK") + 0.002
    low_s, high_s = inner_c1 - inner_c0 - slack_s, outer_c1 - outer_c0 + slack_s
    assert low_s <= first["proc_cpu_time_s"] <= high_s
    # The rate is over the window the tree was given, t0 to t1.
    window_s = t1 - t0
    assert low_s / window_s * 100 <= first["proc_cpu_percent"] <= high_s / window_s * 100
    assert first["proc_cpu_norm_percent"] == pytest.approx(first["proc_cpu_percent"] / (os.cpu_count() or 1))


# -- CPU ---------------------------------------------------------------------

@pytest.mark.parametrize("use_proc", READERS)
def test_cpu_percent_never_exceeds_all_cpus_and_integrates_to_cpu_time(use_proc):
    """CPU that shows up late (here: 0.3 s used within a 1 ms "interval" of a
    fake clock) is carried over, never shown as more than every CPU busy."""
    cap = 100.0 * (os.cpu_count() or 1)
    tree = ProcessTree(children=False, use_proc=use_proc)
    tree.start(0.0)
    try:
        burn_cpu(0.3)
        times = [0.001, 0.002, 10.0, 20.0]
        rows = [tree.sample(t) for t in times]
    finally:
        tree.close()
    assert rows[0]["proc_cpu_percent"] == pytest.approx(cap)
    assert all(0.0 <= r["proc_cpu_percent"] <= cap for r in rows)
    assert all(0.0 <= r["proc_cpu_norm_percent"] <= 100.0 for r in rows)
    shown_s = sum(r["proc_cpu_percent"] / 100.0 * (t - t_prev)
                  for r, t, t_prev in zip(rows, times, [0.0] + times))
    assert shown_s == pytest.approx(rows[-1]["proc_cpu_time_s"], rel=1e-9)
    assert rows[-1]["proc_cpu_time_s"] >= 0.3 - 0.02  # psutil reads 10 ms ticks


@pytest.mark.parametrize("use_proc", READERS)
def test_child_burning_a_core_reads_its_cpu_percent(use_proc, driver, tmp_path):
    """A child burning 1 s of CPU: the tree's CPU % over the burn equals the
    child's own (about 100 on an idle machine) within 15 points."""
    # psutil finds children only on the slow cadence: make it find this one soon.
    tree = ProcessTree(driver.pid, use_proc=use_proc, slow_every_s=1.0 if use_proc else 0.2)
    tree.start()
    marks_path = tmp_path / "marks.json"
    try:
        before = sample(tree)
        child = driver.run(f"p = subprocess.Popen([sys.executable, '-c', {BURN!r}, {str(marks_path)!r}, '1.0']);"
                           " out = p.pid")
        samples = []  # (t_before, t_after, sample, child in tree)
        while not marks_path.exists():
            t_a = time.monotonic()
            values = tree.sample(t_a)
            t_b = time.monotonic()
            samples.append((t_a, t_b, values, child in tree.pids))
            if t_b - samples[0][0] > DEADLINE_S:
                pytest.fail("the burning child never finished")
            time.sleep(0.05)
        driver.run("p.wait()")
        after = poll(tree, lambda s: s["proc_count"] == 1, "the child to leave the tree")
    finally:
        tree.close()
    marks = np.array(json.loads(marks_path.read_text()))
    burn_from, burn_to = marks[0, 0], marks[-1, 0]
    # Samples read inside the burn, with the child in the tree, and read
    # promptly (the tree read happened within 10 ms of the `now` it was given).
    inside = [(t_a, s) for t_a, t_b, s, seen in samples
              if seen and burn_from < t_a and t_b < burn_to and t_b - t_a < 0.01]
    assert len(inside) >= 3, f"too few clean samples inside the burn: {len(samples)} taken"
    (ta, sa), (tb, sb) = inside[0], inside[-1]
    assert tb - ta > 0.4
    tree_percent = (sb["proc_cpu_time_s"] - sa["proc_cpu_time_s"]) / (tb - ta) * 100.0
    child_percent = (np.interp(tb, marks[:, 0], marks[:, 1])
                     - np.interp(ta, marks[:, 0], marks[:, 1])) / (tb - ta) * 100.0
    assert tree_percent == pytest.approx(child_percent, abs=15.0)
    # No interval reads more than every CPU busy, however late a child is found.
    cap = 100.0 * (os.cpu_count() or 1)
    assert max(s["proc_cpu_percent"] for _a, _b, s, _seen in samples) <= cap + 1e-6
    assert all(s["proc_cpu_norm_percent"] <= 100.0 + 1e-9 for _a, _b, s, _seen in samples)
    # Over the child's whole life the tree counted its whole CPU time once.
    assert after["proc_cpu_time_s"] - before["proc_cpu_time_s"] == pytest.approx(marks[-1, 1], abs=0.15)


def assert_counted_once(before, after, cpu0, cpu1) -> None:
    """Between two samples the tree's CPU time grew by what the kernel says the
    driver used, itself and through its reaped descendants (>= 0.5 s burnt)."""
    (kids0, own0), (kids1, own1) = cpu0, cpu1
    assert kids1 - kids0 >= 0.5
    grown = after["proc_cpu_time_s"] - before["proc_cpu_time_s"]
    assert grown == pytest.approx((kids1 - kids0) + (own1 - own0), abs=0.05)


@pytest.mark.parametrize("use_proc", READERS)
@pytest.mark.parametrize("seen_alive", [True, False], ids=["discovered", "never-seen"])
def test_cpu_of_reaped_children_is_counted_once(use_proc, seen_alive, driver, tmp_path):
    tree = ProcessTree(driver.pid, use_proc=use_proc)
    tree.start()
    marks_path = tmp_path / "marks.json"
    try:
        before = sample(tree)
        cpu0 = driver.cpu_s()
        child = driver.run(f"p = subprocess.Popen([sys.executable, '-c', {BURN!r}, {str(marks_path)!r}, '0.5']);"
                           " out = p.pid")
        if seen_alive:
            poll(tree, lambda s: child in tree.pids, "the child to be discovered")
        wait_for_file(marks_path)
        driver.run("p.wait()")
        cpu1 = driver.cpu_s()
        after = poll(tree, lambda s: child not in tree.pids, "the reaped child to leave")
        later = sample(tree)
    finally:
        tree.close()
    assert_counted_once(before, after, cpu0, cpu1)
    assert later["proc_cpu_time_s"] >= after["proc_cpu_time_s"] - 0.02
    assert after["proc_count"] == 1
    assert tree.gone == (1 if seen_alive else 0)


GRANDCHILD = r"""
import subprocess, sys
burn = sys.argv[1]
g = subprocess.Popen([sys.executable, "-c", burn] + sys.argv[2:])
g.wait()
sys.stdin.read()
"""


@pytest.mark.parametrize("use_proc", READERS)
def test_child_and_grandchild_gone_in_one_interval_are_counted_once(use_proc, driver, tmp_path):
    """A grandchild reaped by its parent, which is reaped by the root, both
    between two samples: the root's cutime holds both; nothing is added twice."""
    tree = ProcessTree(driver.pid, use_proc=use_proc)
    tree.start()
    marks_path = tmp_path / "marks.json"
    try:
        before = sample(tree)
        cpu0 = driver.cpu_s()
        # The grandchild burns, then waits on the child's stdin (inherited) before exiting.
        hold = BURN + "\nsys.stdin.read()\n"
        child = driver.run(
            f"p = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, {hold!r}, {str(marks_path)!r}, '0.5'],"
            " stdin=subprocess.PIPE); out = p.pid")
        wait_for_file(marks_path)  # the grandchild has burnt its CPU and now waits
        poll(tree, lambda s: s["proc_count"] == 3 and s["proc_cpu_time_s"] - before["proc_cpu_time_s"] >= 0.5,
             "child and grandchild with the burnt CPU in the tree")
        assert child in tree.pids
        driver.run("p.stdin.close(); p.wait()")  # both exit; each parent reaps its child
        cpu1 = driver.cpu_s()
        after = sample(tree)
    finally:
        tree.close()
    assert after["proc_count"] == 1
    assert_counted_once(before, after, cpu0, cpu1)


# -- memory, counts, grandchildren ---------------------------------------------

ALLOCATE = r"""
import os, subprocess, sys
g = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
block = b"\x01" * (200 * 1024 * 1024)   # written, so resident
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(g.pid))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
sys.stdin.read()
g.stdin.close()
g.wait()
"""


@pytest.mark.parametrize("use_proc", READERS)
def test_child_memory_count_and_grandchildren(use_proc, driver, tmp_path):
    tree = ProcessTree(driver.pid, use_proc=use_proc)
    tree.start()
    ready = tmp_path / "ready"
    try:
        base = sample(tree)
        assert base["proc_count"] == 1
        child = driver.run(f"p = subprocess.Popen([sys.executable, '-c', {ALLOCATE!r}, {str(ready)!r}],"
                           " stdin=subprocess.PIPE); out = p.pid")
        wait_for_file(ready)
        grandchild = int(ready.read_text())
        full = poll(tree, lambda s: s["proc_count"] == 3 and s["proc_rss_mb"] - base["proc_rss_mb"] >= 200,
                    "child and grandchild with 200 MiB in the tree")
        assert set(tree.pids) == {driver.pid, child, grandchild}
        # 200 MiB plus two small interpreters, nothing counted twice.
        assert full["proc_rss_mb"] - base["proc_rss_mb"] < 200 + 120
        tree.boundary()
        assert sample(tree)["proc_threads"] >= 3
        driver.run("p.stdin.close(); p.wait()")
        back = poll(tree, lambda s: s["proc_count"] == 1, "the tree to shrink back to the root")
        assert back["proc_rss_mb"] < base["proc_rss_mb"] + 50
        assert tree.gone == 2
    finally:
        tree.close()


@pytest.mark.parametrize("use_proc", READERS)
def test_children_false_ignores_children(use_proc, driver):
    tree = ProcessTree(driver.pid, children=False, use_proc=use_proc, slow_every_s=0.0)
    tree.start()
    try:
        child = driver.run("p = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],"
                           " stdin=subprocess.PIPE); out = p.pid")
        for _ in range(5):
            s = sample(tree)
            assert s["proc_count"] == 1
            assert child not in tree.pids
        driver.run("p.stdin.close(); p.wait()")
    finally:
        tree.close()


# -- peaks ---------------------------------------------------------------------

def spike_160mib() -> None:
    spike = np.ones(160 * MIB // 8)  # allocated and written: 160 MiB resident
    time.sleep(0.03)
    del spike


def own_marks_kb() -> tuple[int, int]:
    """This process's own VmHWM and getrusage ru_maxrss: what other tools read."""
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return hwm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_exact_peaks_option_catches_a_short_spike_every_time():
    """exact_peaks=True (the opt-in): a 30 ms spike between two samples is in
    the next full sample's peak, 20 times out of 20; the sample after that no
    longer carries it."""
    tree = ProcessTree(children=False, use_proc=True, exact_peaks=True)
    tree.start(0.0)
    try:
        assert tree.peaks == "reset"
        t = 0.0
        for trial in range(20):
            t += 1.0  # a fake clock: every sample here is one second apart, so a full one
            s1 = tree.sample(t)
            assert s1["proc_rss_peak_mb"] < s1["proc_rss_mb"] + 50, f"trial {trial}: stale peak {s1}"
            spike_160mib()
            t += 1.0
            s2 = tree.sample(t)
            assert s2["proc_rss_mb"] < s1["proc_rss_mb"] + 50, "the spike was not returned to the OS"
            assert s2["proc_rss_peak_mb"] >= s1["proc_rss_mb"] + 155, f"trial {trial}: spike missed {s1} {s2}"
            assert s2["proc_pss_peak_bound_mb"] - s2["proc_pss_peak_mb"] < 1, s2   # exact: no bracket
    finally:
        tree.close()


def test_by_default_a_process_keeps_its_own_peak_figures():
    """Without the opt-in nbmon never resets a mark: after a spike under a
    tree, the process's own VmHWM and ru_maxrss still hold it. A spike above
    the process's earlier high-water mark is exact in the next sample; a
    smaller one later is bracketed: sampled, with the mark as the most."""
    def body():
        tree = ProcessTree(children=False, use_proc=True)
        tree.start(0.0)
        base = sample_at(tree, 1.0)["proc_rss_mb"]
        spike_160mib()
        first = sample_at(tree, 2.0)
        hwm_kb, maxrss_kb = own_marks_kb()
        small = np.ones(80 * MIB // 8)
        time.sleep(0.03)
        del small
        second = sample_at(tree, 3.0)
        tree.close()
        return {"base": base, "first": first, "second": second, "hwm_kb": hwm_kb, "maxrss_kb": maxrss_kb,
                "after": own_marks_kb(), "peaks": tree.peaks}

    got = in_forked_child(body)
    base, first, second = got["base"], got["first"], got["second"]
    assert got["peaks"] == "high-water marks"
    # The truth is the process's own marks, which nbmon never touched:
    assert got["hwm_kb"] / 1024 >= base + 155 and got["maxrss_kb"] / 1024 >= base + 155, got
    assert got["after"][0] >= got["hwm_kb"], got
    assert first["proc_rss_peak_mb"] >= base + 155, got                                  # caught,
    assert first["proc_pss_peak_bound_mb"] - first["proc_pss_peak_mb"] < 1, got          # exactly
    assert second["proc_rss_peak_mb"] < base + 60, got                                   # missed, but
    assert second["proc_pss_peak_bound_mb"] >= second["proc_pss_peak_mb"] + 75, got      # bracketed


def sample_at(tree: ProcessTree, t: float) -> dict[str, float]:
    tree.boundary()
    return tree.sample(t)


def test_spike_between_two_samples_is_in_the_next_sample_only():
    tree = ProcessTree(children=False, use_proc=True, slow_every_s=1.0, exact_peaks=True)
    tree.start(0.0)
    try:
        for trial in range(5):
            t0 = 10.0 * (trial + 1)
            s1 = tree.sample(t0)
            spike_160mib()
            s2 = tree.sample(t0 + 0.1)   # the kernel's peak since s1: the interval's
            s3 = tree.sample(t0 + 0.2)   # nothing happened in this one
            assert s2["proc_rss_peak_mb"] >= s1["proc_rss_mb"] + 155, (trial, s1, s2)
            assert s3["proc_rss_peak_mb"] < s1["proc_rss_mb"] + 50, (trial, s1, s3)
    finally:
        tree.close()


def test_boundary_makes_the_next_sample_read_the_exact_peak():
    tree = ProcessTree(children=False, use_proc=True, exact_peaks=True)
    tree.start()
    try:
        for trial in range(20):
            tree.boundary()
            s1 = sample(tree)
            assert s1["proc_rss_peak_mb"] < s1["proc_rss_mb"] + 50, f"trial {trial}: stale peak {s1}"
            spike_160mib()
            tree.boundary()
            s2 = sample(tree)
            assert s2["proc_rss_peak_mb"] >= s1["proc_rss_mb"] + 155, f"trial {trial}: spike missed {s1} {s2}"
    finally:
        tree.close()


def test_peaks_are_sampled_with_psutil():
    tree = ProcessTree(use_proc=False)
    tree.start()
    try:
        assert tree.peaks == "sampled"
        s = sample(tree)
        assert s["proc_rss_peak_mb"] == s["proc_rss_mb"] and math.isnan(s["proc_pss_peak_bound_mb"])
    finally:
        tree.close()


# -- odd processes -------------------------------------------------------------

@pytest.mark.parametrize("use_proc", READERS)
def test_nonexistent_pid_raises_process_lookup_error(use_proc):
    before = fd_count()
    tree = ProcessTree(free_pid(), use_proc=use_proc)
    with pytest.raises(ProcessLookupError):
        tree.start()
    tree.close()
    assert fd_count() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as user nobody needs root")
@pytest.mark.parametrize("use_proc", READERS)
def test_other_users_process_gives_numbers_or_nan(use_proc):
    # `cat` rather than this Python, which may sit where user nobody cannot read.
    p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, user=65534)
    try:
        tree = ProcessTree(p.pid, use_proc=use_proc)
        tree.start()
        try:
            for _ in range(3):
                s = sample(tree)
                for name, v in s.items():
                    assert type(v) is float, name
                    assert math.isnan(v) or v >= 0, (name, v)
                assert s["proc_count"] == 1
                assert s["proc_rss_mb"] > 0
        finally:
            tree.close()
    finally:
        p.stdin.close()
        p.wait()


@pytest.mark.parametrize("use_proc", READERS)
def test_root_that_exited_is_not_alive_even_before_it_is_reaped(use_proc):
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    tree = ProcessTree(p.pid, use_proc=use_proc)
    tree.start()
    try:
        assert sample(tree)["proc_count"] == 1
        assert tree.root_alive
        p.stdin.close()
        # Not reaped: a zombie has exited, only its exit status is left.
        poll(tree, lambda s: not tree.root_alive, "the exited root to count as not alive")
        assert p.poll() is not None  # reap it now
        for _ in range(3):  # a tree whose root is gone keeps answering
            s = sample(tree)
            assert set(s) == set(FIELDS)
        assert not tree.root_alive
        assert s["proc_count"] == 0
    finally:
        tree.close()
        p.wait()


@pytest.mark.parametrize("use_proc", READERS)
def test_children_exiting_between_samples(use_proc, driver):
    # The psutil backend discovers on its cadence; make it every sample here.
    tree = ProcessTree(driver.pid, use_proc=use_proc, slow_every_s=1.0 if use_proc else 0.0)
    tree.start()
    try:
        driver.run("prev = None")
        for i in range(20):
            # A child that lives until told, one that is born and reaped within
            # a single command, and the previous child reaped in between.
            child = driver.run(
                "p = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],"
                " stdin=subprocess.PIPE)\n"
                "subprocess.run([sys.executable, '-c', 'pass'])\n"
                "if prev is not None: prev.wait()\n"
                "out = p.pid")
            poll(tree, lambda s: child in tree.pids, f"child {i} to be discovered")
            driver.run("p.stdin.close(); prev = p")
            sample(tree)
        driver.run("prev.wait()")
        s = poll(tree, lambda s: s["proc_count"] == 1, "the tree to shrink back to the root")
        assert tree.gone == 20
        assert tree.pids == (driver.pid,)
        read_every_sample = ("proc_cpu_time_s", "proc_rss_mb", "proc_rss_peak_mb", "proc_count")
        assert all(s[k] == s[k] for k in read_every_sample), s
    finally:
        tree.close()


# -- resources of the monitor itself -----------------------------------------

@pytest.mark.parametrize("use_proc", READERS)
def test_no_file_descriptor_leak(use_proc, driver):
    before = fd_count()
    for _ in range(3):
        tree = ProcessTree(driver.pid, use_proc=use_proc, slow_every_s=0.0)
        tree.start()
        child = driver.run("p = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],"
                           " stdin=subprocess.PIPE); out = p.pid")
        poll(tree, lambda s: child in tree.pids, "the child to be discovered")
        driver.run("p.stdin.close(); p.wait()")
        poll(tree, lambda s: child not in tree.pids, "the child to leave")
        tree.close()
    assert fd_count() == before
