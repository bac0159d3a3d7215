"""Reliability, lifecycle: start/stop cycles, bounded stop, interpreter exit,
fork, and a watched process that exits -- on real threads, real child
processes, a real IPython shell and the real /proc.

Figures for the reliability report are printed as ``FIGURE <scenario>: ...``
lines (run with ``-s`` to see them).

Already proven elsewhere, not repeated here:
  - 50 thread-backend cycles without GPU: test_engine.py::test_start_stop_cycles_leak_no_thread_and_no_descriptor
  - a stuck source while the thread is inside it: test_engine.py::test_stop_is_bounded_with_a_stuck_source,
    test_sampler.py::test_stop_is_bounded_when_a_source_is_stuck_and_the_thread_never_writes_again
  - a thread-backend monitor on a child that exits: test_engine.py::test_run_on_a_child_that_exits_ends_by_itself
  - SystemMonitor on a child that exits (final dict, clean shutdown):
    test_seed_system_monitor.py::test_child_that_exits_gets_a_final_dict_and_the_monitor_stops
  - NVML re-initialised in a forked child (no monitor running): test_nvml.py::test_forked_child_initialises_again
"""
from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
from helpers import DEADLINE_S, StubSource, fd_count, figure, in_forked_child, nbmon_threads, wait_until

import nbmon.sources.gpus.nvml as nvml
from nbmon.sinks.consumers import SampleForwarder
from nbmon.engine import Monitor
from nbmon.sampling.sampler import STOP_GRACE_S
from nbmon.sinks.senders import CSVSender

SLACK_S = 0.5       # on top of the documented stop bound (interval + STOP_GRACE_S)
MIB = 1024 * 1024


def rss_mib() -> float:
    """Resident memory after a full collection, with the allocator's free
    pages handed back (malloc_trim), so that what is measured is memory in
    use, not what glibc's per-thread arenas happen to cache."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except AttributeError:  # not glibc
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def _helper_of(cmd: list[str], parent: int | None) -> bool:
    """Whether ``cmd`` is a sampler helper (``python -I -c BOOT PATH_JSON
    nbmon.sampling.process:helper_main PID PARENT_PID OPTIONS_JSON``, see nbmon.launch),
    started by ``parent`` if given."""
    from nbmon.launch import _BOOT

    if _BOOT not in cmd:
        return False
    args = cmd[cmd.index(_BOOT) + 1:]
    return len(args) >= 4 and args[1] == "nbmon.sampling.process:helper_main" and (parent is None or args[3] == str(parent))


def helper_running(pid: int, parent: int | None = None) -> bool:
    """Whether a sampler helper with this pid is alive (a zombie is dead: it
    only waits for its parent, or for init, to reap it)."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        cmd = p.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return _helper_of(cmd, parent)


def helpers_of(parent: int) -> list[int]:
    """Running sampler helpers started by ``parent`` (found by their command line)."""
    return [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline", "status"])
            if _helper_of(p.info["cmdline"] or [], parent) and p.info["status"] != psutil.STATUS_ZOMBIE]


# -- start/stop cycles -------------------------------------------------------------


def test_thread_backend_1000_start_stop_cycles_leak_nothing():
    m = Monitor(interval=0.005)  # GPU on: here NVML is absent and says so, elsewhere it is read
    for _ in range(50):  # warm-up: imports, NVML's one-time init, the allocator's pools
        m.start()
        assert m.stop(timeout=DEADLINE_S)
    gc.collect()
    fds, rss = fd_count(), rss_mib()
    unclean = runs_without_final_sample = 0
    for _ in range(1000):
        m.start()
        assert m.running
        unclean += not m.stop(timeout=DEADLINE_S)
        assert not m.running
        runs_without_final_sample += m.store.seq == 0  # every run ends with its final state
    gc.collect()
    leaked_threads = nbmon_threads()
    growth = rss_mib() - rss
    figure("thread-backend 1000 cycles", unclean=unclean, leaked_threads=len(leaked_threads),
           fd_delta=fd_count() - fds, rss_growth_mib=round(growth, 2),
           runs_without_final_sample=runs_without_final_sample, gpu_state=repr(m.gpu_state))
    assert unclean == 0
    assert leaked_threads == []
    assert fd_count() == fds
    assert growth <= 5.0, f"RSS grew {growth:.2f} MiB over 1000 cycles"
    assert runs_without_final_sample == 0


def test_process_backend_50_start_stop_cycles_leak_nothing():
    me = psutil.Process()
    warm = Monitor(interval=0.01, backend="process")
    warm.start()
    assert warm.stop(timeout=DEADLINE_S)  # warm-up: imports
    assert warm.backend_used == "process", warm.backend_note
    del warm
    gc.collect()
    fds = fd_count()
    m = Monitor(interval=0.01, backend="process")
    helpers, unclean, runs_without_final_sample = [], 0, 0
    others = {c.pid for c in me.children()}  # long-lived children of the test process (a resource tracker)
    try:
        for _ in range(50):
            m.start()
            assert m.running and m.backend_used == "process"
            helper = m._sampler.proc.pid
            helpers.append(helper)
            assert {c.pid for c in me.children()} - others == {helper}
            unclean += not m.stop(timeout=DEADLINE_S)
            assert {c.pid for c in me.children()} == others  # reaped by stop(): no zombie left
            runs_without_final_sample += m.store.seq == 0
    finally:
        m.stop(timeout=DEADLINE_S)
    left = [pid for pid in helpers if helper_running(pid)]
    figure("process-backend 50 cycles", unclean=unclean, leaked_threads=len(nbmon_threads()),
           fd_delta=fd_count() - fds, helpers_left=len(left), children_left=len(me.children()) - len(others),
           runs_without_final_sample=runs_without_final_sample)
    assert unclean == 0
    assert nbmon_threads() == []
    assert fd_count() == fds  # the helper's pipes are closed by stop(), not left for the next start
    assert left == []
    assert runs_without_final_sample == 0


def test_process_backend_started_from_a_thread_that_ends_keeps_sampling():
    # PR_SET_PDEATHSIG fires when the *thread* that started the helper ends:
    # a monitor started from a worker thread must outlive that thread.
    m = Monitor(interval=0.01, backend="process", gpu=False)
    starter = threading.Thread(target=m.start, name="starter")
    starter.start()
    starter.join(DEADLINE_S)
    assert not starter.is_alive() and m.backend_used == "process"
    seq = m.store.seq
    try:
        wait_until(lambda: m.store.seq >= seq + 20, what="20 samples after the starting thread ended", timeout=10)
        assert m.running and m._sampler.proc.poll() is None
    finally:
        assert m.stop(timeout=DEADLINE_S)


@pytest.mark.parametrize("where", ["kernel", "helper"])
def test_resmon_100_cycles_in_a_real_ipython_shell(where):
    """The session in this process (kernel: its dashboards are counted here)
    or in its helper (this process keeps only the relay, and the helper's
    own memory is read from /proc)."""
    from IPython.testing import globalipapp
    from IPython.utils.capture import capture_output

    from nbmon.views.dashboard import Dashboard
    from nbmon.kernel.session import SESSION

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()  # None once anyone started it
    saved = list(ip.display_formatter.active_types)
    ip.display_formatter.active_types = list(ip.display_formatter.format_types)
    with capture_output():
        ip.run_line_magic("load_ext", "nbmon")

    def cycle():
        with capture_output() as cap:
            ip.run_line_magic("resmon", f"--interval 0.01 --session {where}")
        # The record shows at once; the chart is built on the dashboard's thread and mounts into it.
        assert 'data-nbmon-live="' in cap.outputs[0].data["text/html"]
        wait_until(lambda: SESSION.host.info()["charts"] == 1, what="the chart", timeout=30)
        with capture_output() as cap:
            ip.run_line_magic("resmon", "stop")
        assert [o for o in cap.outputs if o.update], "the chart was not replaced by its record"
        wait_until(lambda: not threads(), what="every nbmon thread to end after %resmon stop", timeout=5)

    def threads() -> list:
        """nbmon's threads here and in the helper, but the relay to it (it lives as long as nbmon is loaded)."""
        here = [t.name for t in nbmon_threads() if t.name != "nbmon-relay"]
        return here + (SESSION.host.info()["threads"] if SESSION.remote else [])

    def helper_rss() -> float:
        if not SESSION.remote:
            return 0.0
        with open(f"/proc/{SESSION.host.pid}/statm") as f:   # a heap's size, read from outside it
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB

    def live_widgets() -> int:
        return sum(isinstance(o, Dashboard) or type(o).__name__.endswith("FigureWidget")
                   for o in gc.get_objects())

    try:
        for _ in range(10):  # warm-up: plotly, the widget bundle, the allocator's pools
            cycle()
        gc.collect()
        fds, rss, objects, widgets, helper = fd_count(), rss_mib(), len(gc.get_objects()), live_widgets(), helper_rss()
        for _ in range(100):
            cycle()
        gc.collect()
        growth, object_growth = rss_mib() - rss, len(gc.get_objects()) - objects
        figure(f"%resmon 100 cycles, the session in the {where}", leaked_threads=len(threads()), fd_delta=fd_count() - fds,
               rss_growth_mib=round(growth, 2), object_growth=object_growth,
               widgets_left=live_widgets() - widgets, helper_rss_growth_mib=round(helper_rss() - helper, 2))
        assert threads() == []
        assert fd_count() == fds
        assert helper_rss() - helper <= 16.0
        # Each %resmon used to leave its chart (~0.5 MiB, ~800 objects) in memory for good.
        assert live_widgets() == widgets  # (other tests' dashboards may still be alive)
        assert object_growth < 2000
        assert growth <= 16.0, f"RSS grew {growth:.1f} MiB over 100 cycles"
    finally:
        with capture_output():
            ip.run_line_magic("unload_ext", "nbmon")
        ip.display_formatter.active_types = saved


# -- bounded stop ---------------------------------------------------------------------


def Sleepy(release: threading.Event, stuck_on: int | None = 3) -> StubSource:
    """A source whose ``stuck_on``-th call (and every call once
    ``stick_from_now`` is set) sleeps 10 s, cut short by ``release``; its
    value is the call's number, so a row from the stuck call is recognisable."""
    return StubSource("sleepy", ("sleepy_call",), behave=lambda call: {"sleepy_call": float(call)},
                      stuck_on=stuck_on, release=release, caller_safe=False)


class BlockingCSV(CSVSender):
    """A real CSV file sender whose first write blocks until released."""

    def __init__(self, path, release: threading.Event):
        super().__init__(path)
        self.release = release
        self.entered = threading.Event()
        self.writes_by_thread: dict[int, int] = {}

    def publish_many(self, events):
        me = threading.get_ident()
        self.writes_by_thread[me] = self.writes_by_thread.get(me, 0) + 1
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(10)
        super().publish_many(events)


@pytest.mark.allow_stuck_thread
def test_stop_is_bounded_with_a_stuck_sender_and_source_and_a_restart_cannot_revive_the_old_thread(tmp_path):
    release = threading.Event()
    sleepy = Sleepy(release)
    sender = BlockingCSV(tmp_path / "out.csv", release)
    m = Monitor(interval=0.02, gpu=False, system=False, extra_sources=[sleepy],
                consumers=[SampleForwarder(sender, every_s=0.01)])
    try:
        m.start()
        assert sleepy.entered.wait(DEADLINE_S) and sender.entered.wait(DEADLINE_S)
        old_store, old_sampler = m.store, m._sampler._thread
        old_sender = m._consumer_thread.thread
        seq = old_store.seq
        t0 = time.monotonic()
        clean = m.stop()
        took = time.monotonic() - t0
        figure("stop with stuck sender+source", took_s=round(took, 3), bound_s=m.interval + STOP_GRACE_S,
               clean=clean)
        assert clean is False  # a stuck thread was left behind, and said so
        assert took <= m.interval + STOP_GRACE_S + SLACK_S
        assert not m.running and old_sampler.is_alive() and old_sender.is_alive()

        m.start()  # a new run while the old threads are still stuck
        new_store = m.store
        assert new_store is not old_store
        wait_until(lambda: new_store.seq >= 5, what="the new run to sample")
        release.set()  # the old threads wake up now
        wait_until(lambda: not old_sampler.is_alive() and not old_sender.is_alive(),
                   what="the old threads to end")
        lines = sender.lines_written
        wait_until(lambda: sender.lines_written > lines, what="the new run to keep writing (its file still open)")
        assert m.stop(timeout=DEADLINE_S) is True
    finally:
        release.set()
        m.stop(timeout=DEADLINE_S)

    # The old sampler thread: its stuck call was its last, and nothing reached either store.
    old_calls = sleepy.calls_by_thread[old_sampler.ident]
    assert old_calls[-1] == sleepy.stuck_on
    assert old_store.seq == seq
    for store in (old_store, new_store):
        _, _, cols = store.series(["sleepy_call"])
        assert float(sleepy.stuck_on) not in cols["sleepy_call"].tolist()
    # The old consumer thread: only its stuck write; it did not feed the new
    # run nor close the file the new run was using.
    assert sender.writes_by_thread[old_sender.ident] == 1
    walls = set(new_store.rows_since(0)[1].tolist())
    text = (tmp_path / "out.csv").read_text()
    assert text.endswith("\n")
    times = [float(line.split(",", 1)[0]) for line in text.splitlines()[1:]]
    figure("stuck-sender restart", new_run_samples=len(walls),
           new_run_rows_in_file=len(walls & set(times)), duplicated=len(times) - len(set(times)))
    assert walls <= set(times) and len(times) == len(set(times))


@pytest.mark.allow_stuck_thread
def test_stop_is_bounded_when_a_source_sticks_while_the_sampler_waits():
    # The run's final sample used to be read by stop()'s caller: a source that
    # got stuck between two ticks then held stop() for its whole sleep.
    release = threading.Event()
    sleepy = Sleepy(release, stuck_on=None)
    m = Monitor(interval=0.5, gpu=False, system=False, extra_sources=[sleepy])
    try:
        m.start()
        seq = m.store.seq
        wait_until(lambda: m.store.seq > seq, what="a sample")
        sleepy.stick_from_now.set()  # the thread is waiting for its next tick now
        thread = m._sampler._thread
        t0 = time.monotonic()
        clean = m.stop()
        took = time.monotonic() - t0
        figure("stop with a source stuck between ticks", took_s=round(took, 3), bound_s=0.6, clean=clean)
        assert clean is False and took <= m.interval + STOP_GRACE_S + SLACK_S
        seq = m.store.seq
    finally:
        release.set()
    wait_until(lambda: not thread.is_alive(), what="the abandoned thread to end")
    assert m.store.seq == seq  # its late final sample was not stored
    assert threading.get_ident() not in sleepy.calls_by_thread  # the caller never read a source


# -- interpreter exit -------------------------------------------------------------------

EXIT_SCRIPTS = {
    "thread": """
        from nbmon.engine import Monitor
        m = Monitor(interval=0.01).start()
        while m.store.seq < 5:
            pass
    """,
    "stuck-source": """
        import threading, time
        from nbmon.engine import Monitor
        entered = threading.Event()
        class Stuck:
            name, fields = "stuck", ("stuck_value",)
            def start(self, now): pass
            def close(self): pass
            def sample(self, now):
                entered.set()
                time.sleep(60)
                return {"stuck_value": 1.0}
        m = Monitor(interval=0.01, extra_sources=[Stuck()]).start()
        assert entered.wait(20)
    """,
    "process": """
        import time
        from nbmon.engine import Monitor
        m = Monitor(interval=0.01, backend="process").start()
        assert m.backend_used == "process", m.backend_note
        print(m._sampler.proc.pid, flush=True)
        deadline = time.monotonic() + 20
        while m.store.seq < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    """,
    "with-consumer": """
        import sys
        from nbmon.engine import Monitor
        from nbmon.sinks.consumers import SampleForwarder
        from nbmon.sinks.senders import CSVSender
        m = Monitor(interval=0.01, consumers=[SampleForwarder(CSVSender(sys.argv[1]), every_s=0.01)]).start()
        while m.store.seq < 5:
            pass
    """,
}


@pytest.mark.parametrize("kind", list(EXIT_SCRIPTS))
def test_interpreter_exit_with_a_running_monitor_never_blocks(kind, tmp_path):
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(EXIT_SCRIPTS[kind]), str(tmp_path / "o.csv")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - t0
    left = []
    if kind == "process":
        helper = int(out.split()[0])
        # No PR_SET_PDEATHSIG: the helper ends on its stdin's EOF / its parent's exit.
        wait_until(lambda: not helper_running(helper, parent=proc.pid), what="the helper to end", timeout=10)
        left = helpers_of(proc.pid)
    figure(f"interpreter exit ({kind})", exit_code=proc.returncode, took_s=round(took, 2),
           stderr_bytes=len(err), helpers_left=len(left))
    assert proc.returncode == 0, err
    assert err == ""  # no traceback, no warning
    assert took < 20, f"exit took {took:.1f} s"
    assert left == []


KILLED_KERNEL = """
    import subprocess, sys, time
    from nbmon.engine import Monitor
    m = Monitor(interval=0.01, backend="process", gpu=False).start()
    assert m.backend_used == "process", m.backend_note
    keep = []
    if sys.argv[1] == "pipe-held":  # another process holds the helper's stdin: no EOF when we die
        keep.append(subprocess.Popen(["sleep", "60"], pass_fds=[m._sampler.proc.stdin.fileno()]))
    print(m._sampler.proc.pid, " ".join(str(p.pid) for p in keep), flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("how", ["plain", "pipe-held"])
def test_a_killed_kernel_takes_its_helper_along(how):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_KERNEL), how],
                            stdout=subprocess.PIPE, text=True)
    others = []
    try:
        pids = proc.stdout.readline().split()
        assert pids, "the kernel did not start its helper"
        helper, others = int(pids[0]), [int(p) for p in pids[1:]]
        assert helper_running(helper, parent=proc.pid)
        proc.kill()  # SIGKILL: no atexit, no stop()
        proc.wait(20)
        t0 = time.monotonic()
        wait_until(lambda: not helper_running(helper), what="the helper to end after its kernel was killed", timeout=10)
        figure(f"kernel SIGKILLed ({how})", helper_gone_after_s=round(time.monotonic() - t0, 2))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        for pid in others:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


# -- fork ------------------------------------------------------------------------------


def _proc_fds_of(pid: int) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"/proc/{pid}/"):
            out.append(target)
    return out


def test_fork_while_sampling_the_child_starts_clean_and_can_monitor():
    parent = os.getpid()
    m = Monitor(interval=0.005).start()
    try:
        wait_until(lambda: m.store.seq >= 5, what="samples before the fork")
        assert _proc_fds_of(parent)  # the parent's sources keep /proc files open

        def child():
            names = [t.name for t in threading.enumerate() if t.name.startswith("nbmon-")]
            result = {"threads": names, "running": m.running, "inherited_proc_fds": _proc_fds_of(parent)}
            mine = Monitor(interval=0.005).start()
            deadline = time.monotonic() + 20
            while mine.store.seq < 5 and time.monotonic() < deadline:
                time.sleep(0.005)
            result.update(samples=mine.store.seq, clean=mine.stop(timeout=20), pid=mine.pid == os.getpid(),
                          restart_old=m.start().running and m.stop(timeout=20))
            return result

        answer = in_forked_child(child, timeout=DEADLINE_S)
        figure("fork while sampling", child_threads=len(answer["threads"]), child_running=answer["running"],
               child_samples=answer["samples"], inherited_proc_fds=len(answer["inherited_proc_fds"]))
        assert answer["threads"] == [] and answer["running"] is False
        assert answer["inherited_proc_fds"] == []  # the parent's /proc descriptors were dropped in the child
        assert answer["samples"] >= 5 and answer["clean"] and answer["pid"]
        assert answer["restart_old"]  # the parent's monitor object starts anew in the child
        seq = m.store.seq
        wait_until(lambda: m.store.seq >= seq + 5, what="the parent to keep sampling")
    finally:
        assert m.stop(timeout=DEADLINE_S)


def test_fork_while_the_helper_process_samples_the_parent_still_stops_it_cleanly():
    # The child's copies of the helper's pipes used to keep its stdin open:
    # the parent's stop() then waited out its bound and killed the helper.
    m = Monitor(interval=0.01, backend="process", gpu=False).start()
    assert m.backend_used == "process"
    helper = m._sampler.proc.pid
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child lives until the parent has stopped its monitor
        try:
            os.close(go_w)
            os.read(go_r, 1)
        finally:
            os._exit(0 if not m.running else 1)
    os.close(go_r)
    try:
        wait_until(lambda: m.store.seq >= 5, what="samples after the fork")
        t0 = time.monotonic()
        clean = m.stop(timeout=5)
        took = time.monotonic() - t0
        figure("fork with process backend", parent_stop_clean=clean, took_s=round(took, 3))
        assert clean is True
        assert not helper_running(helper)
    finally:
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _task(n: int) -> tuple[int, int, bool]:
    # Runs in a forked pool worker: nbmon works there too.
    m = Monitor(interval=0.005, gpu=False).start()
    m.sample_now()
    clean = m.stop(timeout=20)
    return n * n, m.store.seq, clean


def test_fork_pool_while_sampling_every_5_ms_does_not_deadlock():
    m = Monitor(interval=0.005).start()
    try:
        wait_until(lambda: m.store.seq >= 5, what="samples before the pool")
        ctx = multiprocessing.get_context("fork")
        t0 = time.monotonic()
        with ctx.Pool(4) as pool:
            results = pool.map_async(_task, range(20)).get(timeout=60)  # a deadlock fails here
        took = time.monotonic() - t0
        figure("fork pool while sampling", tasks=len(results), took_s=round(took, 2),
               tasks_failed=sum(not clean or seq < 1 for _, seq, clean in results))
        assert [r[0] for r in results] == [n * n for n in range(20)]
        assert all(clean and seq >= 1 for _, seq, clean in results)
        seq = m.store.seq
        wait_until(lambda: m.store.seq >= seq + 5, what="the parent to keep sampling")
    finally:
        assert m.stop(timeout=DEADLINE_S)


DEVICE = dict(name="FakeGPU-A", util_gpu=37, util_mem=12, mem_total=80 << 30, mem_used=1536 << 20,
              temp=55, power_mw=123_456, power_limit_mw=700_000, sm_clock=1980, mem_clock=2619)


def test_nvml_is_initialised_again_in_a_child_forked_while_sampling(fake_gpu):
    fake_gpu.set(devices=[DEVICE])
    m = Monitor(interval=0.005).start()
    try:
        assert m.gpu_state == "ok" and m.gpu_count == 1
        wait_until(lambda: m.store.seq >= 5, what="GPU samples before the fork")
        parent = os.getpid()
        assert nvml._init_pid == parent

        def child():
            before = nvml._init_pid
            ok = nvml.init()
            mine = Monitor(interval=0.005).start()
            gpus = mine.gpu_count  # while it runs: a stopped run has closed its devices
            deadline = time.monotonic() + 20
            while mine.store.seq < 3 and time.monotonic() < deadline:
                time.sleep(0.005)
            clean = mine.stop(timeout=20)
            util = mine.summary().mean_gpu_util
            return {"before": before, "init": ok, "init_pid": nvml._init_pid, "pid": os.getpid(),
                    "devices": nvml._device_count, "monitor_gpus": gpus, "clean": clean,
                    "util": util}

        answer = in_forked_child(child, timeout=DEADLINE_S)
        figure("nvml in a forked child", init_pid_is_child=answer["init_pid"] == answer["pid"],
               devices=answer["devices"])
        assert answer["before"] is None  # reset at fork: the parent's NVML state is not the child's
        assert answer["init"] is True and answer["init_pid"] == answer["pid"] != parent
        assert answer["devices"] == 1 and answer["monitor_gpus"] == 1 and answer["clean"]
        assert answer["util"] == pytest.approx(37.0)
        assert nvml._init_pid == parent  # the parent is untouched
        seq = m.store.seq
        wait_until(lambda: m.store.seq >= seq + 3, what="the parent to keep sampling its GPU")
    finally:
        assert m.stop(timeout=DEADLINE_S)


# -- the watched process exits ------------------------------------------------------------


def test_process_backend_run_on_a_child_that_exits_ends_by_itself():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    m = Monitor(pid=p.pid, interval=0.02, backend="process", gpu=False)
    try:
        m.start()
        assert m.backend_used == "process"
        helper = m._sampler.proc.pid
        wait_until(lambda: m.store.seq >= 3, what="3 samples")
        p.stdin.close()  # it exits; nobody reaps it yet
        wait_until(lambda: not m.running, what="the run to end when its process exited")
        s = m.summary()
        figure("watched pid exits (process backend)", samples=s.num_samples, faults=len(m.faults))
        assert s.num_samples >= 3 and s.num_samples == m.store.seq
        assert s.peak_rss_mb > 0 and s.duration_sec > 0
        assert m.stop(timeout=DEADLINE_S) is True
        assert m.summary() == s and m.faults == {}
        assert not helper_running(helper) and nbmon_threads() == []
    finally:
        m.stop(timeout=DEADLINE_S)
        p.wait()


@pytest.mark.parametrize("code", [
    # children that come and go while the command runs
    "import subprocess, sys, time\n"
    "for _ in range(5):\n"
    "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.05)'])\n"
    "time.sleep(0.2)",
    # the command exits while its child still runs
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5)'])",
], ids=["children-exit", "root-exits-first"])
def test_nbmon_run_with_children_that_exit_prints_a_summary_and_no_traceback(tmp_path, code):
    done = subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--interval", "0.02", "--",
                           sys.executable, "-c", code],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    figure("nbmon run, children exit", exit_code=done.returncode,
           traceback="Traceback" in done.stderr, summary="Peak memory" in done.stderr)
    assert done.returncode == 0, done.stderr
    assert "Peak memory" in done.stderr and "Samples" in done.stderr
    assert "Traceback" not in done.stderr and "failed" not in done.stderr
