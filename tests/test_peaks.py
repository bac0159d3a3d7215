"""The shared high-water mark of ``exact_peaks=True``: any number of readers
of one process, in this process or in others, each get every peak, though
the kernel keeps one mark per process and every reset clears it for all."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from helpers import wait_until
from nbmon.engine import Monitor
from nbmon.private import pid_started
from nbmon.sources.tree.peaks import PeakMark

MIB_KB = 1024


def spike(mib: int) -> None:
    block = bytearray(mib << 20)  # zero-filled: every page touched
    del block


def test_two_readers_in_one_process_both_get_the_spike():
    a, b = PeakMark(os.getpid()), PeakMark(os.getpid())
    assert a.open() and b.open()
    try:
        a.take_kb(), b.take_kb()
        spike(150)
        # a's take resets the kernel's mark; b still gets the spike, from its slot.
        assert a.take_kb() >= 150 * MIB_KB
        assert b.take_kb() >= 150 * MIB_KB
        # Each got it once: the next takes hold only what the process has now.
        rss_kb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        assert a.take_kb() < rss_kb + 20 * MIB_KB and b.take_kb() < rss_kb + 20 * MIB_KB
    finally:
        a.close()
        b.close()


def test_a_reader_joining_later_does_not_inherit_an_older_peak():
    a = PeakMark(os.getpid())
    assert a.open()
    try:
        a.take_kb()
        spike(150)
        late = PeakMark(os.getpid())
        assert late.open()
        try:
            rss_kb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
            assert late.take_kb() < rss_kb + 20 * MIB_KB   # the spike was before it joined
            assert a.take_kb() >= 150 * MIB_KB             # and is still a's
        finally:
            late.close()
    finally:
        a.close()


READER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from nbmon.sources.tree.peaks import PeakMark
mark = PeakMark(int(sys.argv[1]))
print(json.dumps({"open": mark.open()}), flush=True)
peak = 0.0
for line in sys.stdin:   # one take per line from the test; EOF ends
    kb = mark.take_kb()
    peak = max(peak, kb if kb == kb else 0.0)
    print(json.dumps({"peak_kb": peak}), flush=True)
mark.close()
"""


def test_readers_in_two_processes_both_get_the_spike():
    """The notebook's case: a dashboard's helper process and a monitor in the
    kernel both reset the kernel's mark."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = subprocess.Popen([sys.executable, "-c", READER, str(os.getpid()), root],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    mine = PeakMark(os.getpid())
    try:
        assert json.loads(other.stdout.readline()) == {"open": True}
        assert mine.open()
        mine.take_kb()
        other.stdin.write("take\n")
        other.stdin.flush()
        json.loads(other.stdout.readline())
        spike(200)
        assert mine.take_kb() >= 200 * MIB_KB      # this take reset the kernel's mark ...
        other.stdin.write("take\n")
        other.stdin.flush()
        assert json.loads(other.stdout.readline())["peak_kb"] >= 200 * MIB_KB   # ... yet the other has it
    finally:
        mine.close()
        other.stdin.close()
        other.wait(30)
    assert other.returncode == 0


def test_the_board_goes_with_its_last_reader_even_when_another_was_killed():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mine = PeakMark(os.getpid())
    assert mine.open()
    path = mine.path
    killed = subprocess.Popen([sys.executable, "-c", READER, str(os.getpid()), root],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert json.loads(killed.stdout.readline()) == {"open": True}
    killed.kill()   # never closes its slot
    killed.wait()
    later = PeakMark(os.getpid())
    assert later.open() and later.path == path
    mine.close()
    assert os.path.exists(path)        # later still reads it
    later.close()
    assert not os.path.exists(path)    # the killed reader's slot does not keep it


def test_a_monitor_that_starts_sweeps_the_boards_of_processes_gone():
    """A reader SIGKILLed with the process it watched (a killed ``nbmon run
    --exact-peaks`` and its tree) leaves their board; the next monitor with
    exact peaks removes it as it starts, even in a process that swept
    moments ago."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    swept = PeakMark(os.getpid())   # a board opened here: this process swept just now
    assert swept.open()
    swept.close()
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    reader = subprocess.Popen([sys.executable, "-c", READER, str(watched.pid), root],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    board = os.path.join(os.path.dirname(swept.path), f"{watched.pid}-{pid_started(watched.pid)}")
    try:
        assert json.loads(reader.stdout.readline()) == {"open": True} and os.path.exists(board)
    finally:
        for process in (reader, watched):
            process.kill()
            process.wait()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with Monitor(other.pid, interval=0.05, gpu=False, exact_peaks=True):
            pass
    finally:
        other.kill()
        other.wait()
    assert not os.path.exists(board)


def test_a_reused_pid_gets_a_board_of_its_own():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mark = PeakMark(child.pid)
        assert mark.open()
        assert mark.path.endswith(f"/{child.pid}-{pid_started(child.pid)}")
        mark.close()
    finally:
        child.kill()
        child.wait()


def test_a_process_that_exited_reads_as_unknown():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    mark = PeakMark(child.pid)
    assert mark.open()
    try:
        child.stdin.close()
        wait_until(lambda: child.poll() is not None, what="the child to exit")
        time.sleep(0.05)
        value = mark.take_kb()
        assert value != value   # NaN: no memory left to read
    finally:
        mark.close()


def test_a_spike_is_taken_once_even_after_a_thread_saw_it_exit():
    """getrusage's ru_maxrss for this process keeps the mark each exiting
    thread saw, whatever was reset since: the mark must come from VmHWM."""
    import threading

    mark = PeakMark(os.getpid())
    assert mark.open()
    try:
        mark.take_kb()
        worker = threading.Thread(target=spike, args=(200,))
        worker.start()
        worker.join()   # its exit records the process's mark at that time
        assert mark.take_kb() >= 200 * MIB_KB
        rss_kb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        assert mark.take_kb() < rss_kb + 20 * MIB_KB   # gone: not reported again
    finally:
        mark.close()


BEYOND_THE_BUDGET = r"""
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (80, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from nbmon.sources.tree.peaks import PeakMark
from nbmon.sources.procfs import BUDGET, fd_budget
def fds():
    return len(os.listdir("/proc/self/fd"))
BUDGET.take(fd_budget() - 3)   # room for one mark's three descriptors
kept, by_path = PeakMark(os.getpid()), PeakMark(os.getpid())
before = fds()
opened = [kept.open(), by_path.open()]
held = fds() - before
kept.take_kb(), by_path.take_kb()
block = bytearray(150 << 20)
del block
peaks = [by_path.take_kb(), kept.take_kb()]   # the one without descriptors resets first
print(json.dumps({"opened": opened, "held": held,
                  "peaks_mib": [p / 1024 for p in peaks], "after_takes": fds() - before,
                  "budget": BUDGET.held}))
kept.close(), by_path.close()
"""


def test_a_mark_beyond_the_fd_budget_keeps_no_descriptor_and_gets_every_spike():
    """``ulimit -n 80``: the budget (5 %: 4, 3 of them left) holds one
    mark's descriptors; the second mark opens its files for each take only."""
    done = subprocess.run([sys.executable, "-c", BEYOND_THE_BUDGET], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["opened"] == [True, True], got
    assert got["held"] == 3 and got["after_takes"] == 3, got   # one mark's three (before: 6), none left by takes
    assert got["budget"] == 80 * 5 // 100, got                  # and counted (before: not)
    assert min(got["peaks_mib"]) >= 150, got                   # both readers got the spike
