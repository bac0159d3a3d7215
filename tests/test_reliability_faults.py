"""Reliability, faults: broken sources through a real running Monitor,
processes that vanish or belong to another user mid-sample, and the line
files under kill, restart and a full disk.

Figures for the reliability report are printed as ``FIGURE <scenario>: ...``
lines (run with ``-s`` to see them).

Already proven elsewhere, not repeated here:
  - every fault kind through a Sampler on a fake clock: test_sampler.py::test_source_raising_every_call,
    ::test_source_raising_every_third_call, ::test_source_returning_no_dict, ::test_source_returning_a_non_number,
    ::test_source_returning_negative_values, ::test_source_leaving_out_a_field
  - a source failing every other call in a real Monitor: test_engine.py::test_a_failing_extra_source_is_isolated
  - another user's process, read statically: test_proctree.py::test_other_users_process_gives_numbers_or_nan
  - children exiting between samples (both readers): test_proctree.py::test_children_exiting_between_samples
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
import subprocess
import time
import warnings

import numpy as np
import pytest
from helpers import (DEADLINE_S, StubSource, disk_full_run, figure, in_forked_child, sigkill_mid_write,
                     wait_until)

from nbmon import catalog
from nbmon.sinks.consumers import SampleForwarder
from nbmon.engine import Monitor
from nbmon.sources.tree import ProcessTree
from nbmon.sinks.senders import CallbackSender, CSVSender, JSONLinesSender

FIELDS = catalog.names(catalog.TREE)


# -- broken sources through a running Monitor --------------------------------------------


def Broken(name, behave, faulty) -> StubSource:
    """One field, ``broken_value``; ``behave(call)`` gives its answer or raises.
    ``faulty(call)``: whether that call is a fault by design (counted in
    ``faults``, so the monitor's count can be checked exactly)."""
    return StubSource(name, ("broken_value",), behave=behave, faulty=faulty)


def _raise(call):
    raise RuntimeError(f"broken on call {call}")


def _every_third(call):
    if call % 3 == 0:
        raise RuntimeError("every third call")
    return {"broken_value": float(call)}


BROKEN = {
    "raises-always": (_raise, lambda c: True),
    "raises-every-3rd": (_every_third, lambda c: c % 3 == 0),
    "returns-none": (lambda c: None, lambda c: True),
    "returns-string": (lambda c: {"broken_value": "12"}, lambda c: True),
    "returns-garbage-text": (lambda c: "x", lambda c: True),  # text, not {field: value}
    "returns-a-tuple": (lambda c: (float(c),), lambda c: True),  # the values without their names
    "returns-another-field": (lambda c: {"other_value": float(c)}, lambda c: True),
    "returns-negative": (lambda c: {"broken_value": -float(c)}, lambda c: True),
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
            wait_until(lambda: source.calls >= 20, what="20 calls")
            first = wait_until(lambda: m.faults.get(kind), what="the fault to be counted").count
            wait_until(lambda: m.faults[kind].count > first + 5, what="the fault count to keep growing")
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
                wait_until(lambda: m.faults.get("flaky") and m.faults["flaky"].count >= 3, what="three faults")
            finally:
                assert m.stop(timeout=DEADLINE_S)
    assert len([w for w in caught if "flaky" in str(w.message)]) == 2  # once per run


def test_resmon_status_prints_the_faults(monkeypatch):
    from IPython.testing import globalipapp
    from IPython.utils.capture import capture_output

    from nbmon.kernel.session import SESSION

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # None once anyone started it
    with capture_output():
        ip.run_line_magic("load_ext", "nbmon")
    source = Broken("broken", _raise, lambda c: True)
    m = Monitor(interval=0.005, gpu=False, extra_sources=[source]).start()
    monkeypatch.setattr(SESSION.host_for("kernel"), "monitor", m)   # the session in this process: its monitor
    try:
        wait_until(lambda: source.calls >= 3, what="three calls")
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


def _check_row(row: dict, bad: list, last: list) -> None:
    """Every field of the tree there, each value a float, NaN or >= 0; the
    tree's CPU time never goes back."""
    if set(row) != set(FIELDS):
        bad.append(("fields", sorted(row)))
    for name, v in row.items():
        if type(v) is not float or not (math.isnan(v) or v >= 0):
            bad.append((name, v))
    cpu = row.get("proc_cpu_time_s", math.nan)
    if last and cpu < last[0]:
        bad.append(("proc_cpu_time_s went back", last[0], cpu))
    last[:] = [cpu]


@pytest.fixture
def churner_as_nobody():
    if os.geteuid() != 0:
        pytest.skip("starting a process as user nobody needs root")
    p = subprocess.Popen(["sh", "-c", CHURN], preexec_fn=_as_nobody)
    yield p
    p.kill()
    p.wait()


def test_psutil_reader_survives_another_users_children_coming_and_going(churner_as_nobody):
    # Monitor cannot pick the psutil reader (it uses /proc where there is one):
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
    figure("psutil reader, nobody's churning tree", samples=n, gone=tree.gone, bad_values=len(bad),
           root_alive=tree.root_alive)
    assert tree.gone >= 20, "children that exited were not counted as gone"
    assert bad == [] and tree.root_alive


def test_proc_reader_monitor_survives_another_users_children_coming_and_going(churner_as_nobody):
    m = Monitor(pid=churner_as_nobody.pid, interval=0.005, gpu=False).start()
    try:
        assert m.sources.tree.reader == "proc"
        wait_until(lambda: m.sources.tree.gone >= 20, what="20 children to come and go")
        assert m.running
    finally:
        assert m.stop(timeout=DEADLINE_S)
    _, _, rows, _, _ = m.store.rows_since(0)
    bad: list = []
    last: list = []
    assert m.fields[:len(FIELDS)] == FIELDS
    for row in rows[:len(FIELDS)].T.tolist():
        _check_row(dict(zip(FIELDS, row)), bad, last)
    count = rows[m.fields.index("proc_count")]
    figure("proc reader, nobody's churning tree", samples=m.store.seq, gone=m.sources.tree.gone,
           faults=len(m.faults), bad_values=len(bad), max_tree=int(count.max()))
    assert m.faults == {} and bad == []
    assert count.min() >= 1 and count.max() >= 2  # children were seen, and the root always


def test_unprivileged_monitor_of_roots_churning_tree_gets_access_denied_not_a_crash():
    # AccessDenied only happens to an unprivileged monitor: the sampling runs
    # in a forked child that dropped to user nobody, watching root's processes.
    if os.geteuid() != 0:
        pytest.skip("dropping to user nobody needs root")
    churner = subprocess.Popen(["sh", "-c", CHURN])

    def as_nobody():
        _as_nobody()
        out = {}
        for use_proc in (True, False):
            tree = ProcessTree(churner.pid, use_proc=use_proc, slow_every_s=0.0)
            tree.start()
            bad, last, n = [], [], 0
            deadline = time.monotonic() + 20
            while tree.gone < 10 and time.monotonic() < deadline:
                row = tree.sample(time.monotonic())
                _check_row(row, bad, last)
                n += 1
            out[tree.reader] = dict(samples=n, gone=tree.gone, bad=bad, alive=tree.root_alive,
                                     peaks=tree.peaks, io=row["proc_read_bytes"])
            tree.close()
        m = Monitor(pid=churner.pid, interval=0.005, gpu=False).start()
        deadline = time.monotonic() + 20
        while m.sources.tree.gone < 10 and time.monotonic() < deadline:
            time.sleep(0.005)
        out["monitor"] = dict(gone=m.sources.tree.gone, running=m.running, clean=m.stop(timeout=20),
                              faults={k: f.first_error for k, f in m.faults.items()})
        return out

    try:
        out = in_forked_child(as_nobody, timeout=90)
    finally:
        churner.kill()
        churner.wait()
    for reader in ("proc", "psutil"):
        got = out[reader]
        figure(f"unprivileged {reader} reader on root's churning tree", samples=got["samples"],
               gone=got["gone"], bad_values=len(got["bad"]))
        assert got["bad"] == [] and got["alive"] and got["gone"] >= 10
        # Another user's marks can be read (status is world-readable), never reset.
        assert got["peaks"] == ("high-water marks" if reader == "proc" else "sampled")
        assert math.isnan(got["io"])           # /proc/<pid>/io is denied: unknown, not 0
    assert out["monitor"]["running"] and out["monitor"]["clean"] and out["monitor"]["faults"] == {}


# -- line files ------------------------------------------------------------------------------

def test_jsonl_sigkill_mid_run_leaves_only_whole_lines(tmp_path):
    text = sigkill_mid_write(tmp_path / "killed.jsonl", "JSONLinesSender", 60)
    lines = text.splitlines()
    broken = [line for line in lines if not line.startswith("{") or not line.endswith("}")]
    figure("JSONL SIGKILL mid-run", lines=len(lines), half_lines=len(broken) + (not text.endswith("\n")))
    assert text.endswith("\n") and broken == []
    rows = [json.loads(line) for line in lines]
    assert all("proc_rss_mb" in r for r in rows)


@pytest.mark.parametrize("cls", [CSVSender, JSONLinesSender])
def test_process_backend_clean_stop_has_every_sample_in_the_file(tmp_path, cls):
    path = tmp_path / "samples.out"
    forward = SampleForwarder(cls(path), every_s=0.02)
    m = Monitor(interval=0.005, backend="process", gpu=False, consumers=[forward]).start()
    assert m.backend_used == "process"
    try:
        wait_until(lambda: m.store.seq >= 50, what="50 samples")
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
    forward = SampleForwarder(CallbackSender(got.append), every_s=0.01)
    m = Monitor(interval=0.005, gpu=False, system=False, consumers=[forward])
    lost = []
    for _ in range(3):
        before = len(got)
        m.start()
        try:
            wait_until(lambda: m.store.seq >= 30, what="30 samples")
        finally:
            assert m.stop(timeout=DEADLINE_S)
        run = got[before:]
        walls = m.store.rows_since(0)[1].tolist()
        lost.append(len(walls) - len(run))
        assert [e["time"] for e in run] == walls
        # Seconds since this run's start, not the first run's.
        assert run[0]["elapsed_s"] == m.store.rows_since(0)[0][0] - m.store.t_start
        assert run[0]["elapsed_s"] == 0.0  # the baseline, at start
    figure("restart x3 with a forwarder", lost_per_run=lost)
    assert lost == [0, 0, 0]


def test_jsonl_disk_full_is_one_clear_error_and_sampling_goes_on(tmp_path):
    path = tmp_path / "full.jsonl"
    limit = 20_000   # a few whole lines fit, then the disk is full
    r = disk_full_run(path, "JSONLinesSender", limit, failures=1, more=20)
    (name, (count, first)), = r["faults"].items()
    text = path.read_text()
    figure("JSONL disk full", failed_writes=count, lines=text.count("\n"), sent=r["sent"],
           samples_after_failure=r["seq"] - r["seq_at_failure"])
    assert name == "JSONLinesSender" and count >= 1  # named after the sender
    assert first == f"OSError: [Errno 27] cannot write to {path}: File too large"
    assert r["running"] and r["clean"] and r["seq"] >= r["seq_at_failure"] + 20
    assert os.path.getsize(path) <= limit and text.endswith("\n")
    assert len(text.splitlines()) == r["sent"] > 0
    for line in text.splitlines():
        json.loads(line)
