"""Reliability, faults: broken sources through a real running Monitor,
processes that vanish or belong to another user mid-sample, and the line
files under kill, restart and a full disk.

Figures for the reliability report are printed as ``FIGURE <scenario>: ...``
lines (run with ``-s`` to see them).

Already proven elsewhere, not repeated here:
  - every fault kind through a Sampler on a fake clock: test_sampler.py::test_source_raising_every_call,
    ::test_source_raising_every_third_call, ::test_source_returning_none, ::test_source_returning_a_non_number,
    ::test_source_returning_negative_values, ::test_source_returning_the_wrong_number_of_values
  - a source failing every other call in a real Monitor: test_monitor.py::test_a_failing_extra_source_is_isolated
  - another user's process, read statically: test_proctree.py::test_other_users_process_gives_numbers_or_nan
  - children exiting between samples (both backends): test_proctree.py::test_children_exiting_between_samples
  - CSV after SIGKILL: test_senders.py::test_sigkill_mid_run_leaves_only_whole_lines
  - every sample in the file after a clean stop (thread backend, CSV and JSON Lines):
    test_senders.py::test_clean_stop_has_every_sample_in_the_file
  - CSV on a full disk (RLIMIT_FSIZE): test_senders.py::test_disk_full_is_one_clear_error_and_the_file_stays_whole,
    test_cli.py::test_output_that_fails_mid_run_is_reported_even_when_quiet
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
from helpers import figure, wait_until

from nbmon.monitor import Monitor
from nbmon.sources.proctree import FIELDS, ProcessTree
from nbmon.senders import CallbackSender, CSVSender, ForwardSamples, JSONLinesSender

DEADLINE_S = 30.0


def poll(cond, what: str, timeout: float = DEADLINE_S):
    return wait_until(cond, timeout=timeout, what=what)




# -- broken sources through a running Monitor --------------------------------------------


class Broken:
    """One field; ``behave(call)`` gives the values or raises. Counts the calls
    that are faults by design, so the monitor's count can be checked exactly."""

    fields = ("broken_value",)

    def __init__(self, name, behave, faulty):
        self.name = name
        self.behave = behave
        self.faulty = faulty   # call -> whether that call is a fault
        self.calls = 0
        self.faults = 0

    def start(self, now):
        pass

    def sample(self, now):
        self.calls += 1
        self.faults += self.faulty(self.calls)
        return self.behave(self.calls)

    def close(self):
        pass


def _raise(call):
    raise RuntimeError(f"broken on call {call}")


def _every_third(call):
    if call % 3 == 0:
        raise RuntimeError("every third call")
    return (float(call),)


BROKEN = {
    "raises-always": (_raise, lambda c: True),
    "raises-every-3rd": (_every_third, lambda c: c % 3 == 0),
    "returns-none": (lambda c: None, lambda c: True),
    "returns-string": (lambda c: ("12",), lambda c: True),
    "returns-garbage-text": (lambda c: "x", lambda c: True),  # a 1-char str: right length, wrong kind
    "returns-negative": (lambda c: (-float(c),), lambda c: True),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_broken_source_in_a_running_monitor(kind):
    behave, faulty = BROKEN[kind]
    source = Broken(kind, behave, faulty)
    m = Monitor(interval=0.005, gpu=False, extra_sources=[source])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the once is the monitor's doing, not the registry's
        m.start()
        try:
            poll(lambda: source.calls >= 20, "20 calls")
            first = poll(lambda: m.faults.get(kind), "the fault to be counted").count
            poll(lambda: m.faults[kind].count > first + 5, "the fault count to keep growing")
            assert m.running
            assert caught == []  # nothing said from the thread while it runs
        finally:
            assert m.stop(timeout=DEADLINE_S)
        m.stop(timeout=DEADLINE_S)  # a second stop says nothing more
    ours = [w for w in caught if kind in str(w.message)]
    fault = m.faults[kind]
    _, _, rows, _, _ = m.store.rows_since(0)
    values = rows[m.fields.index("broken_value")]
    rss = rows[m.fields.index("proc_rss_mb")]
    figure(f"broken source ({kind})", calls=source.calls, injected_faults=source.faults,
           counted=fault.count, uncounted=source.faults - fault.count, samples=m.store.seq,
           nan_rows=int(np.isnan(values).sum()), warnings=len(ours))
    # Counted exactly: every injected fault, and nothing else.
    assert fault.count == source.faults
    assert fault.first_error
    # Said once, from stop() in this thread, with the count and the first error.
    assert len(ours) == 1 and ours[0].category is RuntimeWarning
    assert f"failed {fault.count} time(s)" in str(ours[0].message)
    assert ours[0].filename == __file__
    # The broken field is NaN where it failed; the other metrics never stopped.
    assert len(values) == m.store.seq >= 20
    assert np.all(rss > 0) and not np.isnan(rss).any()
    if kind == "raises-every-3rd":
        good = ~np.isnan(values)
        assert good.any() and (~good).any()
        assert np.all(values[good] % 3 != 0)  # the good calls' own values, untouched
    else:
        assert np.isnan(values).all()


def test_a_restart_reports_the_new_runs_faults_once_again():
    source = Broken("flaky", _every_third, lambda c: c % 3 == 0)
    m = Monitor(interval=0.005, gpu=False, system=False, extra_sources=[source])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            m.start()
            try:
                poll(lambda: m.faults.get("flaky") and m.faults["flaky"].count >= 3, "three faults")
            finally:
                assert m.stop(timeout=DEADLINE_S)
    assert len([w for w in caught if "flaky" in str(w.message)]) == 2  # once per run


def test_resmon_status_prints_the_faults(monkeypatch):
    from IPython.testing import globalipapp
    from IPython.utils.capture import capture_output

    from nbmon.notebook.session import SESSION

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # None once anyone started it
    with capture_output():
        ip.run_line_magic("load_ext", "nbmon")
    source = Broken("broken", _raise, lambda c: True)
    m = Monitor(interval=0.005, gpu=False, extra_sources=[source]).start()
    monkeypatch.setattr(SESSION, "monitor", m)
    try:
        poll(lambda: source.calls >= 3, "three calls")
        with capture_output() as cap:
            ip.run_line_magic("resmon", "status")
        line = [x for x in cap.stdout.splitlines() if x.startswith("fault: broken")]
        assert len(line) == 1 and "RuntimeError: broken on call 1" in line[0], cap.stdout
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m.stop(timeout=DEADLINE_S)
        with capture_output():
            ip.run_line_magic("unload_ext", "nbmon")


# -- processes that vanish or are not ours ------------------------------------------------

# Spawns and reaps a short-lived child every few ms; `sh`, which user nobody can run.
CHURN = "while :; do sleep 0.005 & wait $!; /bin/true; done"


def _as_nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


CPU_TIME = FIELDS.index("proc_cpu_time_s")


def _check_row(row, bad: list, last: list) -> None:
    """Every value a float, NaN or >= 0; the tree's CPU time never goes back."""
    for name, v in zip(FIELDS, row):
        if type(v) is not float or not (math.isnan(v) or v >= 0):
            bad.append((name, v))
    if last and row[CPU_TIME] < last[0]:
        bad.append(("proc_cpu_time_s went back", last[0], row[CPU_TIME]))
    last[:] = [row[CPU_TIME]]


@pytest.fixture
def churner_as_nobody():
    if os.geteuid() != 0:
        pytest.skip("starting a process as user nobody needs root")
    p = subprocess.Popen(["sh", "-c", CHURN], preexec_fn=_as_nobody)
    yield p
    p.kill()
    p.wait()


def test_psutil_backend_survives_another_users_children_coming_and_going(churner_as_nobody):
    # Monitor cannot pick the psutil backend (it uses /proc where there is one):
    # ProcessTree(use_proc=False) is driven here in a plain sampling loop.
    tree = ProcessTree(churner_as_nobody.pid, use_proc=False, slow_every_s=0.0)
    tree.start()
    bad: list = []
    last: list = []
    n = 0
    try:
        deadline = time.monotonic() + DEADLINE_S
        while tree.gone < 20 and time.monotonic() < deadline:
            _check_row(tree.sample(time.monotonic()), bad, last)
            n += 1
    finally:
        tree.close()
    figure("psutil backend, nobody's churning tree", samples=n, gone=tree.gone, bad_values=len(bad),
           root_alive=tree.root_alive)
    assert tree.gone >= 20, "children that exited were not counted as gone"
    assert bad == [] and tree.root_alive


def test_proc_backend_monitor_survives_another_users_children_coming_and_going(churner_as_nobody):
    m = Monitor(pid=churner_as_nobody.pid, interval=0.005, gpu=False).start()
    try:
        assert m.tree.backend == "proc"
        poll(lambda: m.tree.gone >= 20, "20 children to come and go")
        assert m.running
    finally:
        assert m.stop(timeout=DEADLINE_S)
    _, _, rows, _, _ = m.store.rows_since(0)
    bad: list = []
    last: list = []
    for row in rows[:len(FIELDS)].T.tolist():
        _check_row(row, bad, last)
    count = rows[m.fields.index("proc_count")]
    figure("proc backend, nobody's churning tree", samples=m.store.seq, gone=m.tree.gone,
           faults=len(m.faults), bad_values=len(bad), max_tree=int(count.max()))
    assert m.faults == {} and bad == []
    assert count.min() >= 1 and count.max() >= 2  # children were seen, and the root always


def test_unprivileged_monitor_of_roots_churning_tree_gets_access_denied_not_a_crash():
    # AccessDenied only happens to an unprivileged monitor: the sampling runs
    # in a forked child that dropped to user nobody, watching root's processes.
    if os.geteuid() != 0:
        pytest.skip("dropping to user nobody needs root")
    churner = subprocess.Popen(["sh", "-c", CHURN])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            out = {}
            try:
                _as_nobody()
                for use_proc in (True, False):
                    tree = ProcessTree(churner.pid, use_proc=use_proc, slow_every_s=0.0)
                    tree.start()
                    bad, last, n = [], [], 0
                    deadline = time.monotonic() + 20
                    while tree.gone < 10 and time.monotonic() < deadline:
                        row = tree.sample(time.monotonic())
                        _check_row(row, bad, last)
                        n += 1
                    out[tree.backend] = dict(samples=n, gone=tree.gone, bad=bad, alive=tree.root_alive,
                                             peak_exact=tree.peak_exact,
                                             io=row[FIELDS.index("proc_read_bytes")])
                    tree.close()
                m = Monitor(pid=churner.pid, interval=0.005, gpu=False).start()
                deadline = time.monotonic() + 20
                while m.tree.gone < 10 and time.monotonic() < deadline:
                    time.sleep(0.005)
                out["monitor"] = dict(gone=m.tree.gone, running=m.running, clean=m.stop(timeout=20),
                                      faults={k: f.first_error for k, f in m.faults.items()})
                code = 0
            except BaseException as err:
                out["error"] = repr(err)
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(code)
    os.close(w)
    try:
        deadline = time.monotonic() + 90
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the unprivileged sampler hung")
            time.sleep(0.01)
        with os.fdopen(r, "rb") as f:
            out = json.loads(f.read())
    finally:
        churner.kill()
        churner.wait()
    assert "error" not in out, out
    for backend in ("proc", "psutil"):
        got = out[backend]
        figure(f"unprivileged {backend} backend on root's churning tree", samples=got["samples"],
               gone=got["gone"], bad_values=len(got["bad"]))
        assert got["bad"] == [] and got["alive"] and got["gone"] >= 10
        assert got["peak_exact"] is False      # clear_refs is denied: peaks are sampled, and said so
        assert math.isnan(got["io"])           # /proc/<pid>/io is denied: unknown, not 0
    assert out["monitor"]["running"] and out["monitor"]["clean"] and out["monitor"]["faults"] == {}


# -- line files ------------------------------------------------------------------------------

KILLED_JSONL_CHILD = """
    import sys, time
    from nbmon.monitor import Monitor
    from nbmon.senders import ForwardSamples, JSONLinesSender
    mon = Monitor(interval=0.005, gpu=False,
                  consumers=[ForwardSamples(JSONLinesSender(sys.argv[1]), every_s=0.01)])
    mon.start()
    while True:
        time.sleep(1)
"""


def test_jsonl_sigkill_mid_run_leaves_only_whole_lines(tmp_path):
    path = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_JSONL_CHILD), str(path)],
                            stderr=subprocess.PIPE, text=True)
    try:
        def enough():
            assert proc.poll() is None, proc.stderr.read()
            return path.exists() and path.read_bytes().count(b"\n") >= 60

        poll(enough, "60 lines")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(20)
        proc.stderr.close()
    text = path.read_text()
    lines = text.splitlines()
    broken = [line for line in lines if not line.startswith("{") or not line.endswith("}")]
    figure("JSONL SIGKILL mid-run", lines=len(lines), half_lines=len(broken) + (not text.endswith("\n")))
    assert text.endswith("\n") and broken == []
    rows = [json.loads(line) for line in lines]
    assert all("proc_rss_mb" in r for r in rows)


@pytest.mark.parametrize("cls", [CSVSender, JSONLinesSender])
def test_process_backend_clean_stop_has_every_sample_in_the_file(tmp_path, cls):
    path = tmp_path / "samples.out"
    forward = ForwardSamples(cls(path), every_s=0.02)
    m = Monitor(interval=0.005, backend="process", gpu=False, consumers=[forward]).start()
    assert m.backend_used == "process"
    try:
        poll(lambda: m.store.seq >= 50, "50 samples")
    finally:
        assert m.stop(timeout=DEADLINE_S)
    text = path.read_text()
    lines = text.splitlines()[1 if cls is CSVSender else 0:]
    figure(f"clean stop, process backend ({cls.__name__})", samples=m.store.seq, lines=len(lines),
           lost=m.store.seq - len(lines) + forward.lost)
    assert text.endswith("\n")
    assert len(lines) == m.store.seq == forward.sent and forward.lost == 0


def test_restarted_monitor_forwards_every_sample_of_every_run():
    # The forwarder's cursor used to carry over into the next run's store,
    # skipping that run's first samples.
    got: list[dict] = []
    forward = ForwardSamples(CallbackSender(got.append), every_s=0.01)
    m = Monitor(interval=0.005, gpu=False, system=False, consumers=[forward])
    lost = []
    for _ in range(3):
        before = len(got)
        m.start()
        try:
            poll(lambda: m.store.seq >= 30, "30 samples")
        finally:
            assert m.stop(timeout=DEADLINE_S)
        run = got[before:]
        walls = m.store.rows_since(0)[1].tolist()
        lost.append(len(walls) - len(run))
        assert [e["time"] for e in run] == walls
        assert run[0]["elapsed_s"] == 0.0
    figure("restart x3 with a forwarder", lost_per_run=lost)
    assert lost == [0, 0, 0]


DISK_FULL_JSONL_CHILD = """
    import json, resource, sys, time
    from nbmon.monitor import Monitor
    from nbmon.senders import ForwardSamples, JSONLinesSender

    path, limit = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # SIGXFSZ is ignored: EFBIG
    forward = ForwardSamples(JSONLinesSender(path), every_s=0.02)
    mon = Monitor(interval=0.005, gpu=False, consumers=[forward]).start()
    deadline = time.monotonic() + 30
    while not mon.faults and time.monotonic() < deadline:
        time.sleep(0.005)
    seq = mon.store.seq
    while mon.store.seq < seq + 20 and time.monotonic() < deadline:
        time.sleep(0.005)
    running = mon.running
    clean = mon.stop(timeout=10)
    print(json.dumps(dict(running=running, clean=clean, seq_at_failure=seq, seq=mon.store.seq,
                          sent=forward.sent,
                          faults={k: [f.count, f.first_error] for k, f in mon.faults.items()})))
"""


def test_jsonl_disk_full_is_one_clear_error_and_sampling_goes_on(tmp_path):
    path = tmp_path / "full.jsonl"
    limit = 6000
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DISK_FULL_JSONL_CHILD), str(path), str(limit)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    r = json.loads(done.stdout)
    (name, (count, first)), = r["faults"].items()
    text = path.read_text()
    figure("JSONL disk full", failed_writes=count, lines=text.count("\n"), sent=r["sent"],
           samples_after_failure=r["seq"] - r["seq_at_failure"])
    assert name == "ForwardSamples" and count >= 1
    assert first == f"OSError: [Errno 27] cannot write to {path}: File too large"
    assert r["running"] and r["clean"] and r["seq"] >= r["seq_at_failure"] + 20
    assert os.path.getsize(path) <= limit and text.endswith("\n")
    assert len(text.splitlines()) == r["sent"] > 0
    for line in text.splitlines():
        json.loads(line)
