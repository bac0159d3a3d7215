"""CSV / JSON Lines / callback senders: whole lines only, on real files."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from helpers import csv_rows, disk_full_run, nbmon_threads, sigkill_mid_write, wait_until
from nbmon.consumers import SampleForwarder
from nbmon.engine import Monitor
from nbmon.senders import CallbackSender, CSVSender, JSONLinesSender


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
        from nbmon.senders import {cls}
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
