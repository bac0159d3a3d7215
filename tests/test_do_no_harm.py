"""Do no harm, the engine's part (issue 17): nbmon's sampler never takes the
kernel's file descriptors, never dies of a full /dev/shm, and nothing another
user of the host plants can steer it, hang it, or make it write a victim's
file. The default path keeps no file anywhere; the opt-in exact peaks keep
their boards in the private per-user directory.

Real components: a pool of 500 processes under a lowered RLIMIT_NOFILE, a
tmpfs the test mounts (in a private mount namespace for /dev/shm: the host's
is never filled), a real second local user (tests/multiuser.py), SIGKILL."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import wait_until
from multiuser import other_user, shared_dir  # noqa: F401  (fixtures)
from nbmon.private import pid_started

PY = sys.executable


def run_child(code: str, *args, env=None, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON."""
    done = subprocess.run([PY, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- file descriptors --------------------------------------------------------------

# Also benchmarks/run.py's (section 8): argv children, exact peaks, the soft limit (0: as it is).
POOL_UNDER_A_LIMIT = """
    import json, os, resource, subprocess, sys, time
    children, exact, limit = int(sys.argv[1]), sys.argv[2] == "True", int(sys.argv[3])
    if limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from nbmon.engine import Monitor
    pool = [subprocess.Popen(["sleep", "120"]) for _ in range(children)]
    before = len(os.listdir("/proc/self/fd"))
    mon = Monitor(interval=0.1, gpu=False, exact_peaks=exact).start()
    deadline = time.monotonic() + 60
    while mon.latest().get("proc_count", 0) < children + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    held = []
    for _ in range(10):   # what stays open (the least seen): not a read in flight
        time.sleep(0.05)
        held.append(len(os.listdir("/proc/self/fd")) - before)
    failed = 0
    files = []
    for k in range(100):   # the user's own open() calls while nbmon watches
        try:
            files.append(open("/proc/self/stat"))
        except OSError:
            failed += 1
    for f in files:
        f.close()
    count = mon.latest()["proc_count"]
    peaks = mon.peaks
    mon.stop()
    for p in pool:
        p.kill(); p.wait()
    print(json.dumps({"count": count, "held": min(held), "failed": failed, "peaks": peaks,
                      "faults": {k: [f.count, f.first_error] for k, f in mon.faults.items()}}))
"""


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("children", [10, 100, 500])
def test_a_big_pool_under_a_low_fd_limit_is_counted_whole_and_the_users_open_never_fails(children, exact):
    got = run_child(POOL_UNDER_A_LIMIT, children, exact, 256)
    # Before (issue 17): 164 of 201 counted, 99 of 100 of the user's open() failed. With exact
    # peaks before (issue 32): 45 fds held at 10 children, 252 and 99 of 100 open() failing at 100.
    assert got["count"] == children + 1, got
    assert got["failed"] == 0, got
    assert got["held"] <= 256 * 0.05, got             # the documented share: 5 % of the limit
    assert got["faults"] == {}, got
    assert got["peaks"] == ("reset" if exact else "high-water marks"), got


OUT_OF_DESCRIPTORS = """
    import json, os, resource, signal, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from nbmon.engine import Monitor

    def samples(mon, n):
        seq = mon.store.seq
        deadline = time.monotonic() + 30
        while mon.store.seq < seq + n and time.monotonic() < deadline:
            time.sleep(0.02)

    mon = Monitor(interval=0.05, gpu=False, system=False, exact_peaks=sys.argv[1] == "True").start()
    told, tell = os.pipe()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    middle = os.fork()
    if middle == 0:   # forks five children when told, then waits for them without running
        os.setpgid(0, 0)
        signal.sigwait({signal.SIGUSR1})
        kids = []
        for _ in range(5):
            kids.append(os.fork())
            if kids[-1] == 0:
                time.sleep(60)
                os._exit(0)
        os.write(tell, b"x")
        for kid in kids:
            os.waitpid(kid, 0)
        os._exit(0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    samples(mon, 3)
    held = []
    while True:   # the user's code takes every descriptor left
        try:
            held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            break
    os.kill(middle, signal.SIGUSR1)
    os.read(told, 1)
    samples(mon, 5)   # found while nothing can be opened
    during = {"count": mon.latest()["proc_count"], "sampled": mon.sample_now()}
    for fd in held:
        os.close(fd)
    deadline = time.monotonic() + 30
    while mon.latest()["proc_count"] < 7 and time.monotonic() < deadline:
        time.sleep(0.02)
    count = mon.latest()["proc_count"]
    mon.stop()
    os.killpg(middle, signal.SIGKILL)
    os.waitpid(middle, 0)
    print(json.dumps({"during": during, "count": count,
                      "faults": {k: [f.count, f.first_error] for k, f in mon.faults.items()}}))
"""


@pytest.mark.parametrize("exact", [False, True])
def test_children_found_while_out_of_descriptors_are_counted_once_there_are_some(exact):
    """The process runs out of descriptors as a sleeping child forks five:
    the reads that fail are counted faults (never an exception), and the
    five are counted as soon as descriptors are free again, though their
    parent never runs again. Before, they were never found."""
    got = run_child(OUT_OF_DESCRIPTORS, exact)
    assert got["during"]["sampled"] is True, got
    assert got["count"] == 7, got   # before: 2 (this process and the sleeping parent)
    fault = got["faults"]["process tree"]
    assert "Too many open files" in fault[1] and fault[0] >= 1, got


# -- a monitor that cannot start ---------------------------------------------------------

START_OUT_OF_DESCRIPTORS = """
    import json, os, resource, sys, threading
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from nbmon.engine import Monitor
    from nbmon.launch import StartError
    held = []
    while True:   # the user's code takes every descriptor but a few
        try:
            held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            break
    for fd in held[len(held) - int(sys.argv[1]):]:
        os.close(fd)
    before, threads = sorted(os.listdir("/proc/self/fd")), threading.active_count()
    try:
        Monitor(interval=0.05, gpu=False, exact_peaks=True, backend=sys.argv[2]).start()
        said = None
    except StartError as err:
        said = str(err)
    print(json.dumps({"said": said, "same_fds": sorted(os.listdir("/proc/self/fd")) == before,
                      "threads": threading.active_count() - threads}))
"""


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("free", [1, 8])
def test_a_monitor_that_cannot_start_says_so_in_one_sentence_and_leaves_nothing(free, backend):
    """Out of descriptors (1 or 8 left of 256): one StartError, one
    sentence, no descriptor and no thread left. Before: OSError [Errno 24]
    Too many open files: '/proc/<pid>/stat' from deep in the sources."""
    got = run_child(START_OUT_OF_DESCRIPTORS, free, backend)
    said = got["said"]
    assert said is not None and said.startswith("nbmon did not start: this process has only "), got
    assert said.count(". ") == 0 and "\n" not in said and "(ulimit -n)" in said, got
    assert got["same_fds"] and got["threads"] == 0, got


def test_a_process_gone_before_the_start_is_a_start_error():
    from helpers import free_pid
    from nbmon.engine import Monitor
    from nbmon.launch import StartError

    child = subprocess.Popen([PY, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    monitor = Monitor(child.pid, gpu=False)
    child.stdin.close()
    child.wait(30)
    free_pid()
    with pytest.raises(StartError, match=rf"^nbmon could not start: no process with pid {child.pid}$"):
        monitor.start()
    assert not monitor.running


EXHAUST = """
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
while True:
    try:
        held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
for fd in held[-3:]:
    os.close(fd)
del held[-3:]
"""


def test_a_kernel_out_of_descriptors_runs_its_cells_and_is_told_in_one_line(tmp_path):
    """A real kernel whose code took all its descriptors but three. Before,
    ``%%resmon`` raised OSError [Errno 24] into the cell (which did not run)
    and ``%resmon start`` aborted the kernel (SIGABRT: pyzmq could not open
    the socket that plotly's bundle needed)."""
    from test_postmortem import Kernel, html_of, stderr_of, stdout_of

    stacks = tmp_path / "stacks.txt"   # where the kernel's threads were, were it terminated (once on CI)
    with Kernel("descriptors.ipynb") as kernel:
        kernel.run(f"import faulthandler, signal\n_stacks = open({str(stacks)!r}, 'w')\n"
                   f"faulthandler.register(signal.SIGTERM, file=_stacks, all_threads=True, chain=True)")
        kernel.run("%load_ext nbmon")
        kernel.run(EXHAUST)
        for line in ("%%resmon\nran = 'yes'", "%resmon start", "%resmon auto on", "%resmon start --session kernel"):
            cell = kernel.run(line)   # an error output would raise here
            said = stderr_of(cell).splitlines()
            assert len(said) == 1 and said[0].startswith("nbmon did not start: "), cell.outputs
            assert html_of(cell) == [], cell.outputs
        assert stdout_of(kernel.run("print(ran)")) == "yes\n"
        kernel.run("for fd in held:\n    os.close(fd)")
        assert any("nbmon-summary" in h for h in html_of(kernel.run("%%resmon\nx = 1")))
    code = kernel.process.wait(30)
    seen = stacks.read_text()
    # ipykernel's own shutdown race, twice on CI: its control thread's last 'idle' status
    # is handed to the IOPub thread as that thread ends, the send blocks for good, and the
    # main thread waits on the control thread until jupyter_client's SIGTERM (ipykernel
    # #1518, positron#7142). Any other end, or nbmon on a stack, fails.
    ipykernel_race = (code == -signal.SIGTERM and re.search(r'iostream\.py", line \d+ in schedule', seen)
                      and re.search(r'kernelapp\.py", line \d+ in close', seen))
    assert code == 0 or ipykernel_race, f"exit {code}; its threads when terminated:\n{seen}"
    assert "/nbmon/" not in seen, seen


# -- a full /dev/shm, a full disk ---------------------------------------------------

FULL_SHM_VICTIM = """
    import json, os, sys, time
    from nbmon.engine import Monitor
    def workers():   # forked workers (multiprocessing itself needs room in /dev/shm for its locks)
        pids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                b = bytearray(20 << 20)
                time.sleep(0.2)
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
    results = {}
    for exact in (False, True):
        with Monitor(interval=0.05, gpu=False, exact_peaks=exact) as mon:
            workers()   # new processes: new peaks to read
        results[str(exact)] = {"peak": mon.summary().peak_mem_mb, "peaks": mon.peaks,
                               "faults": [f.first_error for f in mon.faults.values()]}
    print(json.dumps(results))
"""


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: it mounts a tmpfs (CI runs as root)")


def test_a_full_dev_shm_never_kills_the_kernel(tmp_path):
    """A 64 KiB /dev/shm filled to the last byte, in a private mount namespace
    (the host's /dev/shm is never touched), and a full runtime directory
    ($XDG_RUNTIME_DIR, a tmpfs as /run/user/<uid> is): the default path needs
    no file at all, the opt-in boards find no room and say so. Before, the
    first new process killed the kernel with SIGBUS."""
    need_root()
    script = tmp_path / "victim.py"
    script.write_text(textwrap.dedent(FULL_SHM_VICTIM))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    fill = "(dd if=/dev/zero of={}/fill bs=4k 2>/dev/null || true)"
    shell = (f"mount -t tmpfs -o size=64k tmpfs /dev/shm && {fill.format('/dev/shm')} && "
             f"mount -t tmpfs -o size=64k,mode=0700 tmpfs {run} && mkdir -m 0700 {run}/nbmon {run}/nbmon/peaks && "
             f"{fill.format(run)} && XDG_RUNTIME_DIR={run} exec {PY} {script}")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"exit {done.returncode} (SIGBUS is -7/135): {done.stderr}"
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["False"]["faults"] == [] and got["False"]["peaks"] == "high-water marks", got
    assert got["True"]["peak"] > 20, got
    # No room for a board: exact peaks are off for that run, with the reason in words.
    assert any("No space left" in f or "exact peaks are off" in f for f in got["True"]["faults"]), got


# -- another user of the host ----------------------------------------------------------

VICTIM = """
    import json, os, sys, time
    from nbmon.engine import Monitor
    go = sys.argv[1]
    open(go + ".ready", "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    t0 = time.monotonic()
    mon = Monitor(interval=0.05, gpu=False, system=False, exact_peaks=True).start()
    started_s = time.monotonic() - t0
    with mon.window() as span:
        block = bytearray(200 << 20)
        time.sleep(0.03)
        del block
    mon.stop()
    print(json.dumps({"started_s": started_s, "peak": span.summary().peak_rss_mb, "peaks": mon.peaks,
                      "faults": [f.first_error for f in mon.faults.values()]}))
"""
OLD_MAGIC = 0x6E626D6F6E504B31   # the boards nbmon once kept in /dev/shm


def start_victim(tmp_path, env=None) -> tuple[subprocess.Popen, str]:
    go = str(tmp_path / "go")
    victim = subprocess.Popen([PY, "-c", textwrap.dedent(VICTIM), go], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    wait_until(lambda: os.path.exists(go + ".ready"), what="the victim to be ready")
    return victim, go


def finish_victim(victim: subprocess.Popen, go: str) -> dict:
    open(go, "w").close()
    out, err = victim.communicate(timeout=60)
    assert victim.returncode == 0, f"exit {victim.returncode}: {err}"
    return json.loads(out.strip().splitlines()[-1])


def test_boards_planted_in_dev_shm_by_another_user_change_nothing(tmp_path, other_user, shared_dir):
    """The other user plants, at the names nbmon once used, a 0666 board
    claiming a 65,536 MiB peak, a hard link to a file of the victim's and a
    symlink to another: the victim's exact peaks are its own, its files are
    untouched, nothing hangs -- with fs.protected_symlinks/regular off."""
    victim, go = start_victim(tmp_path)
    mine = tmp_path / "precious"
    mine.write_text("the victim's own data")
    os.chmod(tmp_path, 0o755)
    os.chmod(mine, 0o644)
    started = pid_started(victim.pid)
    uid = os.geteuid()
    fake = struct.pack("<5q", OLD_MAGIC, 1, victim.pid, 1, 65536 * 1024) + bytes(8 * 93)
    planted = other_user.python(textwrap.dedent(f"""
        import os
        base = "/dev/shm/nbmon-peak-{uid}-{victim.pid}-{started}"
        fd = os.open(base, os.O_RDWR | os.O_CREAT, 0o666); os.write(fd, {fake!r}); os.close(fd); os.chmod(base, 0o666)
        os.symlink({str(mine)!r}, base + ".link")
        print(base)
    """), cwd=shared_dir).stdout.strip()
    before = {p: open(p, "rb").read() for p in (planted, str(mine))}
    got = finish_victim(victim, go)
    assert got["started_s"] < 5, got                       # no flock hang
    assert 195 <= got["peak"] < 1024, got                  # its own spike, not the planted 65,536 MiB
    assert got["peaks"] == "reset" and got["faults"] == [], got
    assert {p: open(p, "rb").read() for p in before} == before   # nothing of anybody's written
    os.unlink(planted)
    os.unlink(planted + ".link")


def take_the_private_directory(other_user, shared_dir: str, plant: str) -> None:
    """The other user makes the victim's private directory in ``shared_dir``
    first (its name is predictable), as a directory of its own or as a
    symlink to one (``<shared_dir>/mine``, where nothing may be written)."""
    target = os.path.join(shared_dir, f"nbmon-{os.geteuid()}")
    other_user.python(textwrap.dedent(f"""
        import os
        os.mkdir({shared_dir + '/mine'!r}, 0o777)
        if {plant!r} == "directory":
            os.mkdir({target!r}, 0o777)
        else:
            os.symlink({shared_dir + '/mine'!r}, {target!r})
    """))


def home_place(home) -> str:
    """The one directory nbmon made under ``home``'s .cache/nbmon (its host's)."""
    (host,) = os.listdir(os.path.join(home, ".cache", "nbmon"))
    return os.path.join(home, ".cache", "nbmon", host)


@pytest.mark.parametrize("plant", ["directory", "symlink"])
def test_a_private_directory_taken_by_another_user_is_passed_over_for_one_in_the_home(tmp_path, other_user,
                                                                                       shared_dir, plant):
    """The victim refuses the taken directory and keeps its boards in
    ``~/.cache/nbmon/<host>``, made 0700: its peaks are exact all the same.
    Before, exact peaks were off for good ("belongs to uid ...")."""
    take_the_private_directory(other_user, shared_dir, plant)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    victim, go = start_victim(tmp_path, env={"TMPDIR": shared_dir, "XDG_RUNTIME_DIR": "", "HOME": str(home)})
    got = finish_victim(victim, go)
    assert got["started_s"] < 5, got
    assert got["peaks"] == "reset" and got["faults"] == [], got
    assert 195 <= got["peak"] < 1024, got
    place = home_place(home)
    assert os.path.basename(place) == socket.gethostname(), place
    for path in (os.path.dirname(place), place, os.path.join(place, "peaks")):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700, path
    assert os.listdir(os.path.join(place, "peaks")) == []       # its board went with it
    assert os.listdir(os.path.join(shared_dir, "mine")) == []   # nothing written into the other's directory


def test_when_the_home_is_open_to_others_too_exact_peaks_are_off_in_words(tmp_path, other_user, shared_dir):
    take_the_private_directory(other_user, shared_dir, "directory")
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    victim, go = start_victim(tmp_path, env={"TMPDIR": shared_dir, "XDG_RUNTIME_DIR": "", "HOME": str(home)})
    got = finish_victim(victim, go)
    assert got["peaks"] == "high-water marks", got
    (fault,) = got["faults"]
    assert "exact peaks are off" in fault and "belongs to uid" in fault and "writable by other users" in fault, got
    assert os.listdir(home) == [], got


def test_a_kernel_says_where_its_private_files_are_when_the_first_place_was_taken(tmp_path, other_user,
                                                                                   shared_dir, monkeypatch):
    """One line at ``%load_ext nbmon``; the black box is kept, in the home's place."""
    from test_postmortem import Kernel, stderr_of

    take_the_private_directory(other_user, shared_dir, "directory")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    for name, value in (("TMPDIR", shared_dir), ("HOME", str(home))):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with Kernel("taken.ipynb") as kernel:
        said = stderr_of(kernel.run("%load_ext nbmon")).splitlines()
        kernel.run("%resmon auto on")
        place = home_place(home)
        wait_until(lambda: os.listdir(os.path.join(place, "boxes")), what="the kernel's black box")
    assert said == [f"nbmon: {shared_dir}/nbmon-{os.geteuid()} belongs to uid {other_user.uid}, not to this user "
                    f"(uid {os.geteuid()}); its private files are in {place} instead"], said
    assert os.listdir(os.path.join(shared_dir, "mine")) == []


def test_a_board_whose_lock_is_held_never_hangs_the_start(tmp_path):
    """One of the user's own processes holds a board's lock and never lets
    go (stopped in a debugger, say): opening waits a second, then says so."""
    victim, go = start_victim(tmp_path, env={"TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": ""})
    from nbmon import private

    board_dir = os.path.join(str(tmp_path), f"nbmon-{os.geteuid()}", "peaks")
    os.makedirs(board_dir, mode=0o700)
    os.chmod(os.path.dirname(board_dir), 0o700)
    fd = private.open_private(os.path.join(board_dir, f"{victim.pid}-{pid_started(victim.pid)}"))
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        got = finish_victim(victim, go)
    finally:
        os.close(fd)
    assert got["started_s"] < 5, got
    assert any("stayed locked" in f for f in got["faults"]), got


# -- nothing left behind ----------------------------------------------------------------

BOARD_HOLDER = """
    import os, sys, time
    from nbmon.engine import Monitor
    mon = Monitor(interval=0.05, gpu=False, system=False, exact_peaks=True).start()
    open(sys.argv[1], "w").close()
    while not os.path.exists(sys.argv[1] + ".go"):
        time.sleep(0.01)
    if sys.argv[2] == "exit":
        sys.exit(0)          # a normal exit with a thread monitor still running
    time.sleep(120)
"""


@pytest.mark.parametrize("end", ["exit", "sigkill"])
def test_no_board_is_left_behind(tmp_path, end):
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_RUNTIME_DIR": ""}
    boards = os.path.join(str(tmp_path), f"nbmon-{os.geteuid()}", "peaks")
    ready = str(tmp_path / "ready")
    holder = subprocess.Popen([PY, "-c", textwrap.dedent(BOARD_HOLDER), ready, end], env=env)
    wait_until(lambda: os.path.exists(ready), what="the monitor to start")
    assert len(os.listdir(boards)) == 1
    if end == "sigkill":
        holder.send_signal(signal.SIGKILL)
    else:
        open(ready + ".go", "w").close()
    holder.wait(60)
    if end == "sigkill":
        assert len(os.listdir(boards)) == 1   # a killed process cannot clean up: the next one sweeps
        run_child("""
            from nbmon.engine import Monitor
            import json
            with Monitor(interval=0.05, gpu=False, system=False, exact_peaks=True) as mon:
                pass
            print(json.dumps({}))
        """, env=env)
    assert os.listdir(boards) == []


def test_children_that_die_while_being_read_leave_no_descriptor():
    """A shell starting short-lived processes as fast as it can, sampled
    every 5 ms: children found and gone between the open of their files and
    the read (before, such a child's fds stayed open for good)."""
    from helpers import fd_count
    from nbmon.engine import Monitor

    churn = subprocess.Popen(["sh", "-c", "while :; do /bin/true & /bin/true & wait; done"])
    before = fd_count()
    try:
        mon = Monitor(churn.pid, interval=0.005, gpu=False, system=False).start()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            time.sleep(0.05)
        gone = mon.sources.tree.gone
        assert mon.stop(timeout=10)
    finally:
        churn.kill()
        churn.wait()
    assert gone > 50, gone                       # many came and went under the sampler
    assert fd_count() == before                  # and not one descriptor stayed
    assert mon.faults == {}, mon.faults
