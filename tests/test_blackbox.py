"""The black box and the memory warning, piece by piece, on real files, real
processes and real cgroups: what a box keeps, what a dead kernel leaves,
bad boxes (truncated, garbage, damaged, links, a FIFO, another user's file,
a box from another pid namespace or boot) skipped with a reason and never
raised, the sweep, the warning's threshold and hysteresis against the
cgroup's own figures, the machine fallback, and the meter's mark."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from IPython.utils.capture import capture_output

from cgroups import MemoryCgroup
from helpers import RecordingComm, wait_until
from multiuser import other_user, shared_dir  # noqa: F401 - fixtures
from nbmon.postmortem import blackbox
from nbmon.postmortem import deaths
from nbmon.engine import Monitor
from nbmon.postmortem.memwarn import MemoryWatch
from nbmon.views.meter import Meter, MeterFeed
from nbmon.options import Options
from test_postmortem import boxes as listed, without_swap   # listed: {name: pid} of the boxes there

MIB = 1 << 20

# A kernel stand-in: the notebook's session monitor (with its black box) in a
# process of its own, running cell 3 "chunks = []", which holds ``HOLD`` MiB
# for a moment in its first second, then waits to be killed.
KERNEL = """
    import os, sys, time
    from nbmon.helper.host import SessionHost
    class Nowhere:
        update = say = stop_cell = staticmethod(lambda *args: None)
    host = SessionHost(os.getpid(), Nowhere(), kernel=False)
    host.start()
    host.cell_started(3, 'chunks = []')
    held = b'x' * ({hold} << 20)
    time.sleep(0.4)
    del held
    print('ready', flush=True)
    time.sleep(120)
"""
HOLD = 300


@pytest.fixture
def boxes(tmp_path, monkeypatch) -> Path:
    """This test's own private directory (XDG_RUNTIME_DIR), inherited by the
    processes it starts; the boxes go to the returned directory."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return runtime / "nbmon" / "boxes"


def dead_kernel(boxes: Path) -> Path:
    """Run the kernel stand-in, SIGKILL it once its box has three records
    and its last one is of a second after the memory it held; its box."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KERNEL.format(hold=HOLD))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        ready = time.time()   # the memory held is freed
        path = wait_until(lambda: next((boxes / n for n in listed(boxes) if n.startswith(f"{proc.pid}-")), None),
                          what="the box")
        # Three records, the last one folded from samples after the memory was freed (the one before
        # it written after that too: a loaded machine may write the first ones late, during the hold).
        wait_until(lambda: len(records := blackbox.read_box(str(path)).records) >= 3 and records[-2].wall > ready,
                   what="three records, the last two after the memory was freed")
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return path


def test_a_dead_kernels_box_has_its_cell_and_its_peak(boxes):
    path = dead_kernel(boxes)
    assert path.stat().st_size == blackbox.box_size(len(blackbox.FIELDS)) < 8192
    assert (path.stat().st_mode & 0o777) == 0o600
    box = blackbox.read_box(str(path))
    assert box.cell.number == 3 and box.cell.label == "chunks = []" and box.cell.running
    assert box.damaged == 0 and 3 <= len(box.records) <= blackbox.SLOTS
    tree = blackbox.FIELDS[0][0]
    # The 0.4 s it held HOLD MiB is in the record of its second, the highest of it.
    assert max(r.values[tree] for r in box.records) >= HOLD
    assert box.records[-1].values[tree] < HOLD / 2
    (death, problem), again = deaths.claim(""), deaths.claim("")
    assert problem == "" and again == (None, "")
    assert death.cause == deaths.UNKNOWN and death.cell.number == 3
    assert death.tree_memory_peak_mb >= HOLD and death.pid == box.header["pid"]
    assert os.listdir(boxes) == [path.name.replace(".box", ".seen")]
    assert deaths.last_death("").pid == death.pid
    assert deaths.last_death("another.ipynb") is None


def test_a_monitor_that_stops_removes_its_box(boxes):
    from nbmon.postmortem.blackbox import CellNote
    from nbmon.helper.host import watch_kernel

    monitor = Monitor(interval=0.05, gpu=False)
    watch_kernel(monitor, CellNote())
    with monitor:
        (name,) = wait_until(lambda: len(listed(boxes)) == 1 and listed(boxes), what="the box")
        assert name.startswith(f"{os.getpid()}-")
        # A live kernel's box is never a death.
        found = deaths.scan()
        assert [b.header["pid"] for b in found.live] == [os.getpid()] and found.dead == []
    assert os.listdir(boxes) == []
    assert monitor.faults == {}


def test_a_box_kept_for_another_process_ends_with_its_last_sign_of_life(boxes):
    # As the kernel's helper keeps its box, and samples on for up to a second
    # after the kernel died (an OOM kill counted then would read as "no OOM kill").
    from nbmon.postmortem.blackbox import BlackBox, CellNote

    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    monitor = Monitor(interval=0.05, gpu=False)   # samples on whatever the box's process does
    monitor.attach(BlackBox(CellNote(), pid=kernel.pid))
    try:
        with monitor:
            path = wait_until(lambda: next((boxes / n for n in listed(boxes) if n.startswith(f"{kernel.pid}-")),
                                           None), what="the box")
            wait_until(lambda: len(blackbox.read_box(str(path)).records) >= 2, what="two records")
            kernel.kill()
            kernel.wait(30)
            died = time.time()
            time.sleep(2.5)   # the keeper samples on meanwhile
            box = blackbox.read_box(str(path))
    finally:
        kernel.kill()
        kernel.wait(30)
    assert box.records[-1].wall <= died, (box.records[-1].wall, died)


def machine_percent() -> float:
    """The machine's memory in use, as a percentage (total less available), read here."""
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return 100.0 * (1 - info["MemAvailable"] / info["MemTotal"])


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full, blocking: a kernel's that reads nothing (its GIL held by a C call)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    return read_end, write_end


def test_the_box_keeps_its_records_while_the_kernel_reads_nothing(boxes):
    """A memory warning comes while the kernel reads nothing from the helper
    (its pipe full): the box, written on the same thread as the warning is
    said from, keeps its one-second records all the same."""
    from nbmon.helper.host import watch_kernel
    from nbmon.helper.serve import Outlet, Pipe
    from nbmon.postmortem.blackbox import CellNote

    read_end, write_end = full_pipe()
    # A threshold the machine is past already: the warning comes with the first reading.
    monitor = Monitor(interval=0.05, gpu=False, memory_warning_percent=max(1.0, machine_percent() - 5))
    note = CellNote()
    watch_kernel(monitor, note, Outlet(Pipe(write_end)).say)
    note.started(7, "train()")   # a warning is said in the running cell
    try:
        with monitor:
            path = wait_until(lambda: next((boxes / n for n in listed(boxes)), None), what="the box")
            time.sleep(4.0)   # the warning is said (and waits on the pipe) meanwhile
            newest = blackbox.read_box(str(path)).records[-1].wall
            read_at = time.time()
            os.close(read_end)   # the writer, if it waits, ends (EPIPE)
            read_end = -1
    finally:
        if read_end >= 0:
            os.close(read_end)
        os.close(write_end)
    # A record a second, the newest no older than two: none held back by the warning's wait.
    assert read_at - newest < 2.0, read_at - newest


BEYOND_THE_BUDGET = """
    import json, os, resource, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (80, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from nbmon.postmortem import blackbox
    from nbmon.engine import Monitor
    from nbmon.postmortem.blackbox import CellNote
    from nbmon.helper.host import watch_kernel
    from nbmon.sources.procfs import BUDGET, fd_budget
    def boxes_open():
        held = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                held += os.readlink(f"/proc/self/fd/{fd}").endswith(blackbox.SUFFIX)
            except OSError:   # the listing's own
                pass
        return held
    monitor, note = Monitor(interval=0.05, gpu=False, system=False), CellNote()
    watch_kernel(monitor, note)
    BUDGET.take(fd_budget() - BUDGET.held)   # the user's other monitors hold the budget
    with monitor:
        box = [c for c in monitor.consumers if isinstance(c, blackbox.BlackBox)][0]
        note.started(7, "x = 1")
        deadline = time.monotonic() + 30
        while box.writes < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        held = min(boxes_open() for _ in range(5))   # kept open (not a write in flight)
        read = blackbox.read_box(box.path)
    print(json.dumps({"writes": box.writes, "held": held, "cell": read.cell.number, "records": len(read.records),
                      "faults": list(monitor.faults)}))
"""


def test_a_box_beyond_the_fd_budget_holds_no_descriptor_and_is_written_all_the_same(boxes):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(BEYOND_THE_BUDGET)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["held"] == 0, got                  # before: the box's descriptor, beyond the budget
    assert got["writes"] >= 3 and got["records"] >= 2 and got["cell"] == 7 and got["faults"] == [], got


def slow_box_files(monkeypatch, seconds: float) -> None:
    """A box's file takes ``seconds`` longer to fill (its fallocate), as on a slow disk."""
    fallocate = os.posix_fallocate

    def slow_fallocate(fd, offset, length):
        time.sleep(seconds)
        fallocate(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", slow_fallocate)


def test_a_box_closed_at_exit_stays_closed_while_the_sampler_runs_on(boxes, monkeypatch):
    # At exit the monitor's threads (daemons) still run until the interpreter
    # stops them; a consume() after the exit hook must not open a new box,
    # which no one would remove (the next kernel would read a normal exit as a death).
    # The box's file is slow to fill here: the exit hook comes while the box is
    # being opened (once on CI, the box stayed).
    from nbmon.postmortem.blackbox import CellNote
    from nbmon.helper.host import watch_kernel

    slow_box_files(monkeypatch, 0.3)
    monitor = Monitor(interval=0.05, gpu=False)
    watch_kernel(monitor, CellNote())
    with monitor:
        wait_until(lambda: boxes.is_dir() and len(os.listdir(boxes)) == 1, what="the box")
        blackbox._remove_at_exit()   # what atexit runs
        assert os.listdir(boxes) == []
        time.sleep(3 * blackbox.RECORD_EVERY_S)   # three more of the box's turns in the consumers' thread
        assert os.listdir(boxes) == []
    assert monitor.faults == {}


def test_a_box_being_created_is_never_read_half_written(boxes, monkeypatch):
    # A post-mortem's scan in another kernel may come while a box is being
    # created (its file filled slowly here): it finds no box or a whole one,
    # never a file without its header (once on CI: "0 bytes: truncated").
    from nbmon.postmortem.blackbox import CellNote
    from nbmon.helper.host import watch_kernel

    slow_box_files(monkeypatch, 0.5)
    monitor = Monitor(interval=0.05, gpu=False)
    watch_kernel(monitor, CellNote())
    scans = []
    with monitor:
        wait_until(lambda: boxes.is_dir() and os.listdir(boxes), what="the box's file")
        while not (scans and scans[-1].live):
            scans.append(deaths.scan())
        assert [b.header["pid"] for b in scans[-1].live] == [os.getpid()]
    assert [s.skipped for s in scans if s.skipped] == []
    assert len(scans) > 1   # scanned while the box was being created
    assert os.listdir(boxes) == [] and monitor.faults == {}


def _image(boxes: Path) -> bytes:
    return dead_kernel(boxes).read_bytes()


def _with_header(image: bytes, **changes) -> bytes:
    box = blackbox.decode(image)
    return blackbox.encode_header({**box.header, **changes}) + image[blackbox.HEADER_SIZE:]


def test_bad_boxes_are_skipped_with_a_reason_never_raised(boxes, tmp_path, other_user, shared_dir):
    image = _image(boxes)
    for name in os.listdir(boxes):
        os.unlink(boxes / name)
    real = boxes / "1-1-00000000.box"
    real.write_bytes(image)
    real.chmod(0o600)
    planted = {}

    def plant(name: str, data: bytes, mode: int = 0o600) -> Path:
        path = boxes / name
        path.write_bytes(data)
        path.chmod(mode)
        planted[name] = path
        return path

    size = len(image)
    plant("2-2-00000000.box", image[:size // 2])                           # truncated
    plant("3-3-00000000.box", os.urandom(size))                            # garbage
    damaged = bytearray(image)
    damaged[40] ^= 0xFF
    plant("4-4-00000000.box", bytes(damaged))                              # its header's checksum
    plant("5-5-00000000.box", image, mode=0o644)                           # readable by others
    plant("6-6-00000000.box", _with_header(image, version=99))             # another version
    plant("7-7-00000000.box", _with_header(image, pid_ns="pid:[1]"))       # another pid namespace
    plant("8-8-00000000.box", b"\0" * (1 << 20))                           # big and empty
    outside = tmp_path / "elsewhere.box"
    outside.write_bytes(image)
    outside.chmod(0o600)
    os.symlink(outside, boxes / "9-9-00000000.box")                        # a symlink
    os.link(outside, boxes / "10-10-00000000.box")                         # a hard link
    os.mkfifo(boxes / "11-11-00000000.box", 0o600)                         # a FIFO (no writer: no hang)
    (boxes / "12-12-00000000.box").mkdir()                                 # a directory
    plant("notes.txt", b"hello")                                           # not a box's name
    # Another user's file: written by a real second user, moved in by root (who else could).
    other_user.python(f"import sys; open(sys.argv[1], 'wb').write(bytes.fromhex({image.hex()!r}))",
                      f"{shared_dir}/theirs.box")
    os.chmod(f"{shared_dir}/theirs.box", 0o600)
    os.rename(f"{shared_dir}/theirs.box", boxes / "13-13-00000000.box")
    before = {name: (os.lstat(boxes / name).st_mtime_ns, os.lstat(boxes / name).st_size)
              for name in os.listdir(boxes)}

    found = deaths.scan()
    reasons = {os.path.basename(path): why for path, why in found.skipped}
    assert found.problem == "" and [box.path for box, _ in found.dead] == [str(real)]
    expected = {"2-2-00000000.box": "truncated", "3-3-00000000.box": "not a black box",
                "4-4-00000000.box": "checksum", "5-5-00000000.box": "open to other users",
                "6-6-00000000.box": "another version of nbmon", "7-7-00000000.box": "another pid namespace",
                "8-8-00000000.box": "not a black box", "9-9-00000000.box": "symbolic links",
                "10-10-00000000.box": "2 links", "11-11-00000000.box": "not a regular file",
                "12-12-00000000.box": "not a regular file", "notes.txt": "not a black box's name",
                "13-13-00000000.box": f"belongs to uid {other_user.uid}"}
    assert set(reasons) == set(expected)
    for name, why in expected.items():
        assert why in reasons[name], (name, reasons[name])

    cli = subprocess.run([sys.executable, "-m", "nbmon.cli", "postmortem"], capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 0 and "a kernel of yours died" in cli.stdout
    for name in expected:
        assert f"skipped {boxes / name}: " in cli.stderr, name

    death, problem = deaths.claim("")
    assert problem == "" and death is not None and death.path == str(boxes / "1-1-00000000.seen")
    # Nothing was changed, followed or removed but the real box's mark.
    after = {name: (os.lstat(boxes / name).st_mtime_ns, os.lstat(boxes / name).st_size)
             for name in os.listdir(boxes) if name != "1-1-00000000.seen"}
    assert after == {k: v for k, v in before.items() if k != "1-1-00000000.box"}
    assert outside.read_bytes() == image


def test_a_damaged_record_loses_that_record_only(boxes):
    image = bytearray(_image(boxes))
    box = blackbox.decode(bytes(image))
    layout = blackbox.record_struct(len(box.header["fields"]))
    slot = box.records[0].seq % blackbox.SLOTS
    image[blackbox.HEADER_SIZE + blackbox.CELL_SIZE + slot * layout.size + 30] ^= 0xFF
    again = blackbox.decode(bytes(image))
    assert again.damaged == 1 and [r.seq for r in again.records] == [r.seq for r in box.records[1:]]
    assert again.cell == box.cell


def test_many_stale_boxes_never_hide_the_newest_death(boxes):
    """300 boxes of kernels that died an hour ago, named to sort before any
    real pid's; then a kernel dies. Before, only the first 256 names were
    read: claim() and last_death() gave a stale death, never this one."""
    stale = _image(boxes)
    for name in os.listdir(boxes):
        os.unlink(boxes / name)
    hour_ago = time.time() - 3600
    for k in range(1, 301):
        path = boxes / f"{k:05d}-{k}-00000000.box"
        path.write_bytes(_with_header(stale, pid=k, started=10**15 + k))   # a start no process has
        path.chmod(0o600)
        os.utime(path, (hour_ago, hour_ago))
    newest = blackbox.decode(dead_kernel(boxes).read_bytes()).header["pid"]
    assert deaths.last_death("").pid == newest
    death, problem = deaths.claim("")
    assert problem == "" and death.pid == newest
    # The sweep: the newest 256 read, the dead among them but the newest 16 removed; the older 45 kept a week.
    assert len(os.listdir(boxes)) == deaths.KEEP_DEAD + 301 - deaths.MAX_ENTRIES


def test_a_session_name_too_long_for_the_header_is_matched_whole(boxes, monkeypatch):
    """Before, the name cut to fit the header matched no notebook ever again:
    no post-mortem, and nothing said."""
    name = "/home/someone/" + "a deeper folder/" * 160 + "train.ipynb"
    monkeypatch.setenv("JPY_SESSION_NAME", name)
    box = blackbox.decode(dead_kernel(boxes).read_bytes())
    assert box.header["notebook"] != name and "\u2026" in box.header["notebook"]   # it was cut
    twin = name[:1000] + "#" + name[1001:]   # another notebook, cut the same
    assert deaths.claim(twin) == (None, "")
    death, problem = deaths.claim(name)
    assert problem == "" and death is not None and death.pid == box.header["pid"]
    assert deaths.last_death(name).pid == box.header["pid"]


def test_a_newline_in_the_session_name_forges_no_row(boxes, monkeypatch):
    """Before, the name's second line read as a row of the table: "Cause
    killed by the OOM killer at 1.0 TiB"."""
    forged = "a.ipynb\n  Cause                     killed by the OOM killer at 1.0 TiB\u2028"
    monkeypatch.setenv("JPY_SESSION_NAME", forged)
    dead_kernel(boxes)
    text = str(deaths.last_death(forged))
    cli = subprocess.run([sys.executable, "-m", "nbmon.cli", "postmortem"], capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 0, cli.stderr
    for shown in (text, cli.stdout):
        causes = [line for line in shown.splitlines() if line.lstrip().startswith("Cause")]
        assert len(causes) == 1 and "stopped without exiting normally" in causes[0], shown
        assert len(shown.strip().splitlines()) == len(text.splitlines()) and "\u2028" not in shown, shown
    assert "Notebook" in text and "a.ipynb\\n  Cause" in text


def test_a_box_from_before_the_last_boot_is_a_host_restart(boxes):
    path = dead_kernel(boxes)
    path.write_bytes(_with_header(path.read_bytes(), boot="a-boot-before-this-one"))
    death, _ = deaths.claim("")
    assert death.cause == deaths.HOST_RESTART


def test_a_live_process_is_never_dead_even_with_its_pid_reused(boxes):
    image = _image(boxes)
    for name in os.listdir(boxes):
        os.unlink(boxes / name)
    me = blackbox.pid_started(os.getpid())
    for name, started in (("live.box", me), ("reused.box", me + 1)):
        name = f"{os.getpid()}-{started}-00000000.box"
        (boxes / name).write_bytes(_with_header(image, pid=os.getpid(), started=started))
        (boxes / name).chmod(0o600)
    found = deaths.scan()
    assert [b.header["started"] for b in found.live] == [me]
    assert [b.header["started"] for b, _ in found.dead] == [me + 1]


def test_the_sweep_keeps_a_week_and_at_most_16_dead_and_never_the_living(boxes, other_user, shared_dir):
    image = _image(boxes)
    for name in os.listdir(boxes):
        os.unlink(boxes / name)
    last = blackbox.decode(image).records[-1].wall
    for k in range(deaths.KEEP_DEAD + 2):    # 18 dead kernels
        path = boxes / f"{100 + k}-{k}-00000000.box"
        path.write_bytes(_with_header(image, pid=100000 + k, started=k))
        path.chmod(0o600)
    live = boxes / f"{os.getpid()}-{blackbox.pid_started(os.getpid())}-00000000.box"
    live.write_bytes(_with_header(image, pid=os.getpid(), started=blackbox.pid_started(os.getpid())))
    live.chmod(0o600)
    junk = boxes / "junk.box"
    junk.write_bytes(b"old junk")
    os.utime(junk, (time.time() - 8 * 86400,) * 2)
    other_user.python("import sys; open(sys.argv[1], 'wb').write(b'theirs')", f"{shared_dir}/x.box")
    os.utime(f"{shared_dir}/x.box", (time.time() - 8 * 86400,) * 2)
    os.rename(f"{shared_dir}/x.box", boxes / "theirs.box")

    found = deaths.scan()
    assert len(found.dead) == deaths.KEEP_DEAD + 2
    removed = deaths.sweep(found, now=last + 60)
    # All dead boxes have the same last record: the 2 beyond the 16 kept go, and the old junk.
    assert len(removed) == 3 and str(junk) in removed
    left = os.listdir(boxes)
    assert live.name in left and "theirs.box" in left and len(left) == deaths.KEEP_DEAD + 2
    # A week after the last record every dead box goes; the living one and another user's file stay.
    deaths.sweep(deaths.scan(), now=last + deaths.KEEP_S + 60)
    assert sorted(os.listdir(boxes)) == sorted([live.name, "theirs.box"])


def test_an_unsafe_directory_is_one_sentence(boxes, tmp_path):
    boxes.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, boxes)
    death, problem = deaths.claim("")
    assert death is None and "symbolic link" in problem
    cli = subprocess.run([sys.executable, "-m", "nbmon.cli", "postmortem"], capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and "symbolic link" in cli.stderr
    # A monitor runs on without a box: one fault, said in %resmon status.
    from nbmon.postmortem.blackbox import CellNote
    from nbmon.helper.host import watch_kernel

    monitor = Monitor(interval=0.05, gpu=False)
    watch_kernel(monitor, CellNote())
    with monitor:
        wait_until(lambda: "BlackBox" in monitor.faults, what="the box's fault")
        time.sleep(0.6)
    fault = monitor.faults["BlackBox"]
    assert fault.count == 1 and "symbolic link" in fault.first_error
    assert os.listdir(elsewhere) == []


def test_load_ext_shows_the_death_once_and_never_raises_on_bad_boxes(boxes, ipython):
    dead_kernel(boxes)
    (boxes / "3-3-00000000.box").write_bytes(os.urandom(4000))
    (boxes / "3-3-00000000.box").chmod(0o600)
    from nbmon.kernel import magics

    saved = list(ipython.display_formatter.active_types)
    ipython.display_formatter.active_types = list(ipython.display_formatter.format_types)  # as in a kernel
    shown = []
    try:
        for _ in range(2):
            with capture_output() as cap:
                ipython.run_line_magic("load_ext", "nbmon")
            shown.append([o.data["text/html"] for o in cap.outputs if " died" in o.data.get("text/html", "")])
            with capture_output():
                ipython.run_line_magic("unload_ext", "nbmon")
    finally:
        ipython.display_formatter.active_types = saved
    assert len(shown[0]) == 1 and "chunks = []" in shown[0][0] and shown[1] == []
    assert id(ipython) not in magics._loaded
    hooks = ipython.events.callbacks["pre_run_cell"] + ipython.events.callbacks["post_run_cell"]
    assert not [h for h in hooks if getattr(h, "__module__", "").startswith("nbmon.")]


# -- the warning ----------------------------------------------------------------------


GROUP_LIMIT_MB = 1024


@pytest.fixture
def gigabyte():
    """A process in a cgroup limited to 1 GiB; it runs what the test writes to its stdin."""
    with MemoryCgroup(limit_mb=GROUP_LIMIT_MB) as group:
        without_swap(group)
        shell = subprocess.Popen([sys.executable, "-u", "-c",
                                  "import sys\nchunks = []\nfor line in sys.stdin: exec(line)"],
                                 stdin=subprocess.PIPE, text=True)
        group.add(shell.pid)
        yield shell, group
        shell.stdin.close()
        shell.wait(30)


def working_set_percent(group: MemoryCgroup) -> float:
    """The group's usage less its inactive page cache, in % of its limit, read by the test."""
    with open(os.path.join(group.path, "memory.stat")) as f:
        stat = dict(line.split() for line in f)
    inactive = int(stat["total_inactive_file" if group.version == 1 else "inactive_file"]) / MIB
    return 100.0 * (group.usage_mb() - inactive) / GROUP_LIMIT_MB


def test_the_warning_holds_its_threshold_hysteresis_and_one_line_per_cell(gigabyte):
    shell, group = gigabyte

    def hold(percent: float) -> None:
        """Bring the group to ``percent`` of its limit (± 1.5), 10 MiB (1 point) at a
        time, steered by the group's own figure: never across the other line."""
        def step():
            now = working_set_percent(group)
            if abs(now - percent) <= 1.5:
                return True
            shell.stdin.write("chunks.append(b'x' * (10 << 20))\n" if now < percent else "chunks.pop()\n")
            shell.stdin.flush()
            time.sleep(0.02)
            return False

        wait_until(step, what=lambda: f"the group at {percent} % (it is at {working_set_percent(group):.1f} %)")

    said, cell = [], [1]
    watch = MemoryWatch(shell.pid, 60.0, say=said.append, running_cell=lambda: cell[0])
    store = None   # with a limit, only the container is read

    def check(times: int = 3) -> None:
        for _ in range(times):
            watch.consume(store, False)

    check()
    assert said == [] and watch.warning is None and watch.level.kind == "container"
    hold(70)
    check()
    assert len(said) == 1
    percent = float(said[0].split(" at ", 1)[1].split(" %", 1)[0])
    assert abs(percent - working_set_percent(group)) < 2.5 and "of its 1.0 GiB memory limit" in said[0]
    hold(57.5)            # below the threshold, above its re-arm line: the same crossing
    check()
    assert watch.warning is not None
    hold(70)
    check()
    assert len(said) == 1 and len(watch.crossings) == 1
    hold(40)              # the crossing ends
    check()
    assert watch.warning is None
    hold(70)              # a new crossing, in the same cell: not told again there
    check()
    assert len(said) == 1 and len(watch.crossings) == 2 and watch.warning is not None
    cell[0] = 2           # ... but in the next cell that runs while it lasts
    check()
    assert len(said) == 2
    cell[0] = None        # between cells: nobody to tell
    hold(40)
    check()
    hold(70)
    check()
    assert len(said) == 2
    cell[0] = 3
    check()
    assert len(said) == 3


def meminfo_used_percent() -> float:
    info = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/meminfo")}
    return 100.0 * (1 - info["MemAvailable"] / info["MemTotal"])


def test_without_a_limit_the_machine_counts_and_the_meter_marks_it():
    with MemoryCgroup() as group:     # a cgroup with no limit
        shell = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            group.add(shell.pid)
            machine_warning(shell.pid)
        finally:
            shell.kill()
            shell.wait(30)


def machine_warning(pid: int) -> None:
    """A watch on ``pid`` (in a cgroup with no limit) with a threshold below
    the machine's use: it warns of the machine's memory, and the meter marks it."""
    said = []
    watch = MemoryWatch(pid, max(0.5, meminfo_used_percent() / 2), say=said.append, running_cell=lambda: 1)
    with Monitor(pid, interval=0.05, gpu=False, consumers=[watch]) as monitor:
        wait_until(lambda: said, what="the machine's warning")
        assert watch.warning.kind == "machine"
        assert abs(watch.warning.percent - meminfo_used_percent()) < 2
        assert said[0].startswith("nbmon: this machine's memory is ") and len(said) == 1
        comm = RecordingComm(target_name="jupyter.widget")
        meter = Meter(comm=comm)
        feed = MeterFeed(meter, monitor, hz=20.0)
        try:
            wait_until(lambda: meter.memory_alert == "machine", what="the meter's mark")
        finally:
            feed.finish("done")
            meter.close()
    (sent,) = [u for u in comm.updates() if u.get("memory_alert")][:1]
    assert sent["memory_alert"] == "machine" and abs(sent["memory_alert_percent"] - watch.warning.percent) < 2


@pytest.mark.parametrize("bad", [0, 100, -5, 150, math.nan, "90", True])
def test_the_threshold_option_is_checked(bad):
    with pytest.raises(ValueError, match=r"memory_warning_percent must be a percentage between 0 and 100 "
                                         r"\(None: no warning\), got "):
        Options(memory_warning_percent=bad)
    assert Options(memory_warning_percent=None).memory_warning_percent is None
    assert Options().memory_warning_percent == 90.0


def test_no_threshold_no_warning(gigabyte):
    shell, group = gigabyte
    said = []
    watch = MemoryWatch(shell.pid, None, say=said.append, running_cell=lambda: 1)
    shell.stdin.write("chunks.append(b'x' * (900 << 20))\n")
    shell.stdin.flush()
    wait_until(lambda: working_set_percent(group) > 80, what="the group above 80 %")
    watch.consume(None, False)
    assert said == [] and watch.warning is None and watch.level.percent > 80
    assert json.dumps(watch.container)  # plain numbers for the box
