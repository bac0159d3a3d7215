"""Options declared once (issue 19): each field of ``Options`` says its
default, check, flag and help, and which front ends offer it; ``nbmon run``
and ``%resmon`` get their arguments and help from there. Run through the
real parsers: the CLI as a subprocess, the magic in a real IPython shell."""
from __future__ import annotations

import csv
import dataclasses
import re
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring
from IPython.utils.capture import capture_output

from nbmon import options
from nbmon.postmortem import memwarn
from nbmon.cli import _parser
from nbmon.kernel.magics import ResmonMagics
from nbmon.kernel.session import SESSION
from nbmon.options import CLI, MAGIC, Options

# A good value as typed, for each option that takes one (a new option needs one here).
TYPED = {"interval": ("0.5", 0.5), "session": ("kernel", "kernel"), "memory_warning_percent": ("80", 80.0),
         "memory_guard_percent": ("85", 85.0)}


def parsed(front_end: str, flag_args: list[str]):
    if front_end == CLI:
        return _parser().parse_args(["run", *flag_args, "--", "true"])
    return parse_argstring(ResmonMagics.resmon, " ".join(flag_args))


def cases():
    for front_end in (CLI, MAGIC):
        for name, flag in options.flags(front_end):
            yield pytest.param(front_end, name, flag, id=f"{front_end}:{flag.flag}")


@pytest.mark.parametrize("front_end, name, flag", list(cases()))
def test_each_flag_sets_its_own_option_and_nothing_else(front_end, name, flag):
    default = getattr(Options(), name)
    if flag.metavar is None:
        args, expected = [flag.flag], not default
    else:
        text, expected = TYPED[name]
        args = [flag.flag, text]
    got = Options.from_arguments(parsed(front_end, args))
    assert getattr(got, name) == expected != default
    assert dataclasses.replace(got, **{name: default}) == Options()
    assert Options.from_arguments(parsed(front_end, [])) == Options()   # a flag not given changes nothing


def normal(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_help_of_both_front_ends_comes_from_the_table():
    run_help = normal(subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--help"], capture_output=True,
                                     text=True, timeout=60).stdout)
    magic_help = normal(ResmonMagics.resmon.__doc__)
    for front_end, text in ((CLI, run_help), (MAGIC, magic_help)):
        offered = options.flags(front_end)
        assert offered, front_end
        for _, flag in offered:
            assert f"{flag.flag}{' ' + flag.metavar if flag.metavar else ''} {normal(flag.help)}" in text, flag
    assert {f.flag for _, f in options.flags(MAGIC)} > {f.flag for _, f in options.flags(CLI)}
    assert "--memory-warning" in magic_help and "--memory-warning" not in run_help   # a notebook's warning
    assert "NVIDIA" not in run_help + magic_help   # GPUs of any vendor


@pytest.mark.parametrize("typed, percent", [("80", 80.0), ("97.5", 97.5), ("off", None), ("OFF", None)])
def test_resmon_memory_warning_reaches_the_monitors_warning(ip, typed, percent):
    with capture_output():
        ip.run_line_magic("resmon", f"--interval 0.05 --session kernel --memory-warning {typed}")
    try:
        assert SESSION.monitor.options.memory_warning_percent == percent
        assert memwarn.attached(SESSION.monitor).percent == percent
    finally:
        with capture_output():
            ip.run_line_magic("resmon", "stop")


@pytest.mark.parametrize("typed, percent", [("85", 85.0), ("auto", "auto"), ("off", None)])
def test_resmon_memory_guard_reaches_the_monitors_guard(ip, typed, percent):
    from nbmon.postmortem.memguard import MemoryGuard

    with capture_output():
        ip.run_line_magic("resmon", f"--interval 0.05 --session kernel --memory-guard {typed}")
    try:
        assert SESSION.monitor.options.memory_guard_percent == percent
        (guard,) = [c for c in SESSION.monitor.consumers if isinstance(c, MemoryGuard)]
        assert guard.percent == percent
    finally:
        with capture_output():
            ip.run_line_magic("resmon", "stop")


@pytest.mark.parametrize("line, message", [
    ("--memory-guard 100",
     "--memory-guard must be a percentage between 0 and 100, 'auto' or None (off), got '100'"),
    ("--memory-warning 150",
     "--memory-warning must be a percentage between 0 and 100 (None: no warning), got '150'"),
    ("--memory-warning abc",
     "--memory-warning must be a percentage between 0 and 100 (None: no warning), got 'abc'"),
    ("--memory-warning 1e2",
     "--memory-warning must be a percentage between 0 and 100 (None: no warning), got '1e2'"),
    ("--session gpu", "--session must be one of 'helper', 'kernel', got 'gpu'"),
])
def test_a_bad_value_names_the_flag_and_the_text_as_typed(ip, line, message):
    with capture_output() as cap, pytest.raises(UsageError) as info:
        ip.run_line_magic("resmon", line)
    assert str(info.value) == message
    assert SESSION.monitor is None or not SESSION.monitor.running
    assert cap.outputs == []


def test_nbmon_run_no_system_leaves_the_machine_out(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--quiet", "--no-system", "--interval",
                           "0.05", "--csv", "s.csv", "--", sys.executable, "-c", "import time; time.sleep(0.4)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "s.csv", newline="") as f:
        header = next(csv.reader(f))
    assert "proc_rss_mb" in header
    assert not [c for c in header if c.startswith(("sys_", "cgroup_"))], header
