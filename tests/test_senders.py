"""CSV / JSON Lines / callback senders: whole lines only, on real files."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
import subprocess
import sys
import textwrap

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import nbmon
from helpers import csv_rows, disk_full_run, nbmon_threads, sigkill_mid_write, wait_until
from nbmon.sinks.consumers import SampleForwarder
from nbmon.engine import Monitor
from nbmon.kernel.session import SESSION
from nbmon.sinks.senders import CallbackSender, CSVSender, JSONLinesSender


def run_python(code: str, *args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


# -- line formats -----------------------------------------------------------------


def test_csv_writes_whole_lines_with_header_once(tmp_path):
    path = tmp_path / "s.csv"
    sender = CSVSender(path)
    sender.publish({"a": 1, "b": 2.5, "label": 'x,"y"'})
    sender.publish_many([{"a": math.nan, "b": None, "label": "z"},
                         {"a": math.inf, "b": -1.0, "label": "w", "extra": 9}])
    sender.publish_many([])
    sender.close()
    text = path.read_text()
    assert text == 'a,b,label\n1.0,2.5,"x,""y"""\n,,z\n,-1.0,w\n'
    assert sender.lines_written == 4
    assert list(csv.reader(io.StringIO(text)))[1] == ["1.0", "2.5", 'x,"y"']


def test_csv_explicit_columns(tmp_path):
    sender = CSVSender(tmp_path / "c.csv", columns=["b", "a"])
    sender.publish({"a": 1, "b": 2, "c": 3})
    sender.close()
    assert (tmp_path / "c.csv").read_text() == "b,a\n2.0,1.0\n"


def test_jsonl_writes_one_object_per_line_and_nan_as_null(tmp_path):
    path = tmp_path / "s.jsonl"
    sender = JSONLinesSender(path)
    sender.publish({"a": 1, "b": math.nan, "s": "text"})
    sender.publish_many([{"a": math.inf}, {"a": -2.5}])
    sender.close()
    lines = path.read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)
    assert [json.loads(line) for line in lines] == [{"a": 1.0, "b": None, "s": "text"},
                                                   {"a": None}, {"a": -2.5}]
    assert sender.lines_written == 3


def test_callback_sender(tmp_path):
    got = []
    sender = CallbackSender(got.append)
    event = {"a": 1.0}
    sender.publish(event)
    assert got == [{"a": 1.0}] and got[0] is not event
    with pytest.raises(TypeError) as err:
        CallbackSender(5)
    assert str(err.value) == "callback must be callable, got 5"


# -- existing files and permissions ------------------------------------------------------


@pytest.mark.parametrize("cls", [CSVSender, JSONLinesSender])
def test_existing_file_is_not_overwritten(tmp_path, cls):
    path = tmp_path / "keep.out"
    path.write_text("precious\n")
    with pytest.raises(FileExistsError) as err:
        cls(path)
    assert str(err.value) == (f"{path} already exists; pass overwrite=True "
                              f"(or --force on the command line) to replace it")
    assert path.read_text() == "precious\n"
    sender = cls(path, overwrite=True)
    sender.publish({"a": 1})
    sender.close()
    assert "precious" not in path.read_text() and path.read_text().endswith("\n")


@pytest.mark.parametrize("umask, mode", [(0o077, 0o600), (0o022, 0o644)])
@pytest.mark.parametrize("cls", ["CSVSender", "JSONLinesSender"])
def test_file_is_created_with_the_users_umask(tmp_path, cls, umask, mode):
    path = tmp_path / "out"
    done = run_python(f"""
        import os, sys
        from nbmon.sinks.senders import {cls}
        os.umask({umask})
        s = {cls}(sys.argv[1])
        s.publish({{"a": 1}})
        s.close()
        """, path)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(path).st_mode) == mode


# -- through the monitor --------------------------------------------------------------


@pytest.mark.parametrize("cls", [CSVSender, JSONLinesSender])
def test_clean_stop_has_every_sample_in_the_file(tmp_path, cls):
    path = tmp_path / "samples.out"
    forward = SampleForwarder(cls(path), every_s=0.05)
    mon = Monitor(interval=0.01, gpu=False, consumers=[forward])
    mon.start()
    try:
        wait_until(lambda: mon.store.seq >= 20, timeout=30.0, what="20 samples")
    finally:
        assert mon.stop(timeout=10)
    assert not nbmon_threads()
    seq = mon.store.seq
    if cls is CSVSender:
        header, rows = csv_rows(path)
        assert header[:2] == ["time", "elapsed_s"] and header[2:] == list(mon.fields)
        elapsed = [float(r[1]) for r in rows]
    else:
        lines = path.read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert list(rows[0])[2:] == list(mon.fields)
        elapsed = [r["elapsed_s"] for r in rows]
    assert len(rows) == seq == forward.sent
    assert forward.lost == 0
    # Seconds since the run started (not since the first sample), in time order.
    t = mon.store.rows_since(0)[0].tolist()
    assert elapsed == [ti - mon.store.t_start for ti in t] and elapsed == sorted(elapsed)
    assert mon.store.t_start == mon._sampler.t_start and elapsed[0] == 0.0  # the baseline at start
    assert mon.faults == {}


def test_a_sink_attached_to_a_running_monitor_gets_every_sample_of_the_run():
    got: list[dict] = []
    mon = Monitor(interval=0.01, gpu=False, system=False).start()
    try:
        wait_until(lambda: mon.store.seq >= 5, what="5 samples before the sink is attached")
        forward = mon.attach(got.append, every_s=0.02)  # a plain callable
        assert isinstance(forward, SampleForwarder)
        assert [t.name for t in nbmon_threads()].count("nbmon-consumers") == 1
        wait_until(lambda: len(got) >= 10, what="10 forwarded samples")
    finally:
        assert mon.stop(timeout=10)
    assert not nbmon_threads()
    assert [e["time"] for e in got] == mon.store.rows_since(0)[1].tolist()
    assert forward.sent == len(got) == mon.store.seq and forward.lost == 0


def test_a_hurried_consumer_is_called_at_once_not_at_its_turn():
    """The memory guard is hurried as a cell starts: a consumer due every
    hour is called once as the run starts, then again only when hurried."""
    called = []

    class Hourly:
        every_s, at_start = 3600.0, True

        def consume(self, store, final):
            called.append(final)

        def close(self):
            pass

    mon = Monitor(interval=0.05, gpu=False, system=False)
    hourly = mon.attach(Hourly())
    mon.start()
    try:
        wait_until(lambda: called == [False], what="the call at the run's start")
        wait_until(lambda: mon.store.seq >= 5, what="5 samples")
        assert called == [False]
        mon.hurry(hourly)
        wait_until(lambda: called == [False, False], what="the hurried call")
    finally:
        assert mon.stop(timeout=10)
    assert called == [False, False, True]


@pytest.mark.parametrize("lines", [5, 40, 120])
def test_sigkill_mid_run_leaves_only_whole_lines(tmp_path, lines):
    path = tmp_path / "killed.csv"
    sigkill_mid_write(path, "CSVSender", lines)
    header, rows = csv_rows(path)
    assert header[:2] == ["time", "elapsed_s"] and "proc_rss_mb" in header
    assert len(rows) >= lines - 1


def test_disk_full_is_one_clear_error_and_the_file_stays_whole(tmp_path):
    path = tmp_path / "full.csv"
    limit = 6000
    r = disk_full_run(path, "CSVSender", limit, failures=3, more=5)
    assert r["failures"] >= 3 and r["clean"]
    assert r["running"] and r["seq"] > r["seq_at_failure"]  # it kept sampling
    # One fault, named after the sender's class, counted once per failed
    # write, with one clear sentence.
    assert r["faults"] == {"CSVSender": [r["failures"], f"OSError: [Errno 27] cannot write "
                                                        f"to {path}: File too large"]}
    assert os.path.getsize(path) <= limit
    header, rows = csv_rows(path)
    assert len(rows) == r["sent"] > 0


# -- the sink table: one entry, every front end (issue 19) --------------------------------

TSV_SINK = """
    import json, os, sys, time

    from nbmon.sinks import files
    from nbmon.sinks import senders

    class TSVSender:   # the newcomer: a sender made from a path
        def __init__(self, path, *, overwrite=False):
            self.path, self.fd = path, files.create(path, overwrite=overwrite, append=True)

        def publish_many(self, events):
            os.write(self.fd, "".join(f"{e['time']}\\t{e['proc_rss_mb']}\\n" for e in events).encode())

        def publish(self, event, **kwargs):
            self.publish_many([event])

        def close(self):
            os.close(self.fd)

    senders.SINKS["tsv"] = senders.Sink("tsv", "stream every sample to this TSV file", open=TSVSender)

    import nbmon
    from IPython.core.interactiveshell import InteractiveShell
    from nbmon import cli
    from nbmon.kernel.magics import ResmonMagics
    from nbmon.kernel.session import SESSION

    run_tsv, magic_tsv, monitor_tsv = sys.argv[1:4]
    code = cli.main(["run", "--quiet", "--interval", "0.05", "--tsv", run_tsv, "--",
                     sys.executable, "-c", "import time; time.sleep(0.5)"])
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbmon")
    shell.run_line_magic("resmon", f"--interval 0.05 --session kernel --tsv {magic_tsv}")
    while SESSION.monitor.store.seq < 10:
        time.sleep(0.05)
    shell.run_line_magic("resmon", "stop")
    stored = SESSION.monitor.store.seq
    monitor = nbmon.monitor(interval=0.05, tsv=monitor_tsv)
    while monitor.store.seq < 10:
        time.sleep(0.05)
    SESSION.stop()
    print(json.dumps({"code": code, "magic_samples": stored, "monitor_samples": monitor.store.seq,
                      "run_help": cli._parser()._subparsers._group_actions[0].choices["run"].format_help(),
                      "magic_help": ResmonMagics.resmon.__doc__}))
"""


def test_a_sink_added_to_the_table_reaches_every_front_end(tmp_path):
    """The newcomer's change for a new sink: one entry in nbmon.sinks.senders.SINKS
    (here a TSV writer, made before the front ends are imported, as an entry
    in the file would be). ``nbmon run --tsv``, ``%resmon --tsv`` and
    ``nbmon.monitor(tsv=...)`` each write every sample there, and both
    front ends' help names it."""
    paths = [tmp_path / name for name in ("run.tsv", "magic.tsv", "monitor.tsv")]
    done = run_python(TSV_SINK, *paths, timeout=180)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["code"] == 0
    run_lines, magic_lines, monitor_lines = ([line.split("\t") for line in p.read_text().splitlines()] for p in paths)
    assert len(run_lines) >= 3 and all(float(rss) > 0 for _, rss in run_lines)
    assert len(magic_lines) == got["magic_samples"] >= 10   # every sample of the run, once
    assert len(monitor_lines) == got["monitor_samples"] >= 10
    for text in (got["run_help"], got["magic_help"]):
        assert re.search(r"--tsv PATH\s+stream every sample to this TSV file", text), text


def test_resmon_streams_every_sample_of_its_monitor(ip, tmp_path):
    csv_path, jsonl_path = tmp_path / "k.csv", tmp_path / "k.jsonl"
    with capture_output():
        ip.run_line_magic("resmon", f"--interval 0.05 --session kernel --csv {csv_path} --jsonl '{jsonl_path}'")
    monitor = SESSION.monitor
    wait_until(lambda: monitor.store.seq >= 5, what="five samples")
    with capture_output():
        ip.run_line_magic("resmon", "stop")
    wall = monitor.store.rows_since(0)[1].tolist()
    header, rows = csv_rows(csv_path)
    assert header[2:] == list(monitor.fields)
    assert [float(r[0]) for r in rows] == wall
    assert [json.loads(line)["time"] for line in jsonl_path.read_text().splitlines()] == wall


def test_resmon_keeps_an_existing_file_unless_forced_and_never_writes_through_a_link(ip, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    planted = tmp_path / "k.csv"
    planted.symlink_to(victim)
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_line_magic("resmon", f"--interval 0.05 --csv {planted}")
    assert str(info.value) == f"output file {str(planted)!r} already exists (add --force to replace it)"
    assert cap.outputs == [] and (SESSION.monitor is None or not SESSION.monitor.running)
    with capture_output():
        ip.run_line_magic("resmon", f"--interval 0.05 --session kernel --csv {planted} --force")
    wait_until(lambda: SESSION.monitor.store.seq >= 3, what="three samples")
    with capture_output():
        ip.run_line_magic("resmon", "stop")
    assert victim.read_text() == "precious\n" and not planted.is_symlink()
    assert len(csv_rows(planted)[1]) == SESSION.monitor.store.seq


def test_nbmon_monitor_streams_to_the_files_it_is_given(tmp_path, session):
    path = tmp_path / "kernel.jsonl"
    nbmon.monitor(interval=0.05, gpu=False, jsonl=str(path))   # the session in its helper process: the file too
    try:
        wait_until(lambda: SESSION.host.info()["samples"] >= 5, what="five samples")
    finally:
        SESSION.stop()
    times = [json.loads(line)["time"] for line in path.read_text().splitlines()]
    stored = nbmon.samples().index.astype("int64") / 1e9   # every sample the monitor stored, once
    assert len(times) == len(stored) >= 5 and max(abs(a - b) for a, b in zip(times, stored)) < 1e-6


@pytest.mark.parametrize("settings, message", [
    ({"csv": "keep.csv"}, "output file 'keep.csv' already exists (pass overwrite=True to replace it)"),
    ({"jsonl": "new.jsonl", "intervall": 1}, "unknown option(s) 'intervall'"),
    ({"jsonl": "new.jsonl", "csv": "./new.jsonl"}, "each output needs its own file: 'new.jsonl', './new.jsonl'"),
])
def test_nbmon_monitor_refuses_a_sink_before_anything_starts(tmp_path, monkeypatch, session, settings, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.csv").write_text("precious\n")
    with pytest.raises(ValueError) as info:
        nbmon.monitor(interval=0.05, **settings)
    assert str(info.value) == message
    assert SESSION.monitor is None or not SESSION.monitor.running
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"keep.csv": "precious\n"}
