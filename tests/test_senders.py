"""CSV / JSON Lines / callback senders: whole lines only, on real files."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from helpers import nbmon_threads, wait_until
from nbmon.monitor import Monitor
from nbmon.senders import CallbackSender, CSVSender, ForwardSamples, JSONLinesSender


def csv_rows(path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV that must consist of whole lines only."""
    text = open(path, encoding="utf-8", newline="").read()
    assert text == "" or text.endswith("\n"), f"half a line at the end: {text[-80:]!r}"
    if not text:
        return [], []
    header, *rows = list(csv.reader(io.StringIO(text)))
    for row in rows:
        assert len(row) == len(header), row
        for cell in row:
            if cell:
                float(cell)  # every cell is a number or empty
    return header, rows


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
    forward = ForwardSamples(cls(path), every_s=0.05)
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
    assert elapsed[0] == 0.0 and elapsed == sorted(elapsed)
    assert mon.faults == {}


KILLED_CHILD = """
    import sys, time
    from nbmon.monitor import Monitor
    from nbmon.senders import CSVSender, ForwardSamples
    mon = Monitor(interval=0.005, gpu=False,
                  consumers=[ForwardSamples(CSVSender(sys.argv[1]), every_s=0.01)])
    mon.start()
    print("started", flush=True)
    while True:
        time.sleep(1)
"""


@pytest.mark.parametrize("lines", [5, 40, 120])
def test_sigkill_mid_run_leaves_only_whole_lines(tmp_path, lines):
    path = tmp_path / "killed.csv"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_CHILD), str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def enough():
            assert proc.poll() is None, proc.stderr.read()
            return path.exists() and path.read_bytes().count(b"\n") >= lines

        wait_until(enough, timeout=30.0, what=f"{lines} lines")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(20)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    header, rows = csv_rows(path)
    assert header[:2] == ["time", "elapsed_s"] and "proc_rss_mb" in header
    assert len(rows) >= lines - 1


DISK_FULL_CHILD = """
    import json, resource, sys, time
    from nbmon.monitor import Monitor
    from nbmon.senders import CSVSender, ForwardSamples

    path, limit = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # SIGXFSZ is ignored: EFBIG

    class Counting(CSVSender):  # a real CSVSender that counts its failed writes
        calls = failures = 0

        def publish_many(self, events):
            Counting.calls += 1
            try:
                super().publish_many(events)
            except OSError:
                Counting.failures += 1
                raise

    forward = ForwardSamples(Counting(path), every_s=0.02)
    mon = Monitor(interval=0.005, gpu=False, consumers=[forward])
    mon.start()
    deadline = time.monotonic() + 30
    while Counting.failures < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    seq = mon.store.seq
    while mon.store.seq < seq + 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    result = dict(running=mon.running, seq_at_failure=seq, seq=mon.store.seq)
    clean = mon.stop(timeout=10)
    result.update(clean=clean, calls=Counting.calls, failures=Counting.failures, sent=forward.sent,
                  faults={k: [f.count, f.first_error] for k, f in mon.faults.items()})
    print(json.dumps(result))
"""


def test_disk_full_is_one_clear_error_and_the_file_stays_whole(tmp_path):
    path = tmp_path / "full.csv"
    limit = 6000
    done = run_python(DISK_FULL_CHILD, path, limit)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # nothing printed from the threads
    r = json.loads(done.stdout)
    assert r["failures"] >= 3 and r["clean"]
    assert r["running"] and r["seq"] > r["seq_at_failure"]  # it kept sampling
    # One fault, counted once per failed write, with one clear sentence.
    assert r["faults"] == {"ForwardSamples": [r["failures"], f"OSError: [Errno 27] cannot write "
                                                             f"to {path}: File too large"]}
    assert os.path.getsize(path) <= limit
    header, rows = csv_rows(path)
    assert len(rows) == r["sent"] > 0
