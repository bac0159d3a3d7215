"""nbmon.dask on real Dask clusters (LocalCluster / SpecCluster with worker
processes on this machine): what each worker reports, checked against what
the tasks measured of themselves (/proc/<pid>/status, thread CPU time)."""
from __future__ import annotations

import functools
import math
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest
from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

import nbmon
import nbmon.dask
from helpers import FrontEnd, wait_until
from nbmon.dask.client import Watch
from nbmon.dask import feeds as dask_feeds
from nbmon.kernel.session import SESSION
from nbmon.dask.wire import Encoder, pack, seal
from nbmon.dask.worker import MAX_EVENTS_PER_S, MAX_PERIOD_S, host_period_s, roster_name
from nbmon.engine import Monitor
from nbmon.sources.tree import ProcessTree
from nbmon.views.cluster import BANDS, COMPACT_AT, ClusterView, held
from nbmon.views.frames import MAX_FRAME_BYTES
from nbmon.options import Options
from nbmon.report.records import CellRecord

MIB = 1 << 20


def vm_kb(field: str, pid="self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


# -- tasks (run on the workers) -----------------------------------------------------

def allocate(mib: int) -> dict:
    """Touch ``mib`` MiB and free them; the process's own account of it."""
    t0 = time.time()
    before = vm_kb("VmRSS") / 1024
    block = b"\x01" * (mib * MIB)
    during = vm_kb("VmRSS") / 1024
    del block
    return {"t0": t0, "t1": time.time(), "grew_mb": during - before, "held_mb": during}


def burn(seconds: float) -> dict:
    t0, c0 = time.time(), time.thread_time()
    while time.thread_time() - c0 < seconds:
        pass
    return {"t0": t0, "t1": time.time(), "cpu_s": time.thread_time() - c0}


def child_holding(mib: int, seconds: float) -> dict:
    """Start a child that holds ``mib`` MiB for ``seconds``; its own RSS while it holds them."""
    code = f"import sys, time\nb = b'1' * ({mib} * {MIB})\nprint('ready', flush=True)\ntime.sleep({seconds})"
    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    rss_mb = vm_kb("VmRSS", child.pid) / 1024
    child.wait(60)
    return {"t0": t0, "t1": time.time(), "child_rss_mb": rss_mb}


def fork_sleeper() -> int:
    """A forked child that outlives its worker (a task's own fork, say)."""
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    return pid


def nbmon_thread_names() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nbmon-")]


# -- fixtures ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        yield client


@pytest.fixture
def watched(cluster):
    watch = nbmon.dask.watch(cluster)
    try:
        assert watch.ready(10), "the workers' first batches did not arrive"
        yield watch
    finally:
        nbmon.dask.unwatch()


def rows(feed, columns, after: float = -math.inf):
    t, wall, values = feed.store.series(columns)
    keep = wall >= after
    return {c: v[keep] for c, v in values.items()}


def settle(watch, wall: float) -> None:
    """Wait for every live worker's batches up to ``wall`` plus the exact
    peak's cadence (the high-water mark is read every second)."""
    wait_until(lambda: all(f.store.latest()["wall"] >= wall + 1.2 for f in watch.collector.workers()
                           if f.state == "live"), timeout=20, what="batches after the task")


def just_before(feed, column: str, before: float) -> float:
    """The worker's ``column`` in its last batch before ``before`` (a worker's
    RSS may still settle after it starts: not the whole past)."""
    t, wall, values = feed.store.series([column])
    return float(values[column][wall < before][-1])


# -- what each worker reports ------------------------------------------------------------

def test_pinned_allocation_shows_on_that_worker_only(cluster, watched):
    a, b = watched.registered
    feeds = watched.collector.feeds
    done = cluster.submit(allocate, 300, workers=[a], pure=False).result()
    settle(watched, done["t1"])
    assert done["grew_mb"] > 290
    peak_a = np.nanmax(rows(feeds[a], ["max_proc_rss_peak_mb"], done["t0"])["max_proc_rss_peak_mb"])
    grown_b = np.nanmax(rows(feeds[b], ["max_proc_rss_peak_mb"], done["t0"])["max_proc_rss_peak_mb"]) \
        - just_before(feeds[b], "proc_rss_mb", done["t0"])
    # The allocation lasted a fraction of a second: only the kernel's
    # high-water mark (read on the worker, never reset) is sure to have it.
    assert peak_a >= 0.95 * done["held_mb"], (peak_a, done)
    # b's own memory may still be settling early in its life: not by the 300 MiB, though
    assert grown_b < done["grew_mb"] / 2, grown_b
    assert feeds[a].about["peaks"] == "high-water marks"
    assert feeds[a].host == feeds[b].host == os.uname().nodename
    assert watched.collector.unread == 0   # every batch came after its worker's header, and fitted it


def test_a_tasks_subprocess_is_counted_in_its_workers_tree(cluster, watched):
    a, b = watched.registered
    feeds = watched.collector.feeds
    done = cluster.submit(child_holding, 200, 2.0, workers=[a], pure=False).result()
    settle(watched, done["t1"])
    during = rows(feeds[a], ["max_proc_count", "max_proc_rss_mb"], done["t0"])
    assert np.nanmax(during["max_proc_count"]) >= 2
    grown = np.nanmax(during["max_proc_rss_mb"]) - just_before(feeds[a], "proc_rss_mb", done["t0"])
    assert done["child_rss_mb"] >= 200, done   # the child's own bytes, whatever its interpreter's size
    assert grown >= 0.9 * done["child_rss_mb"], (grown, done)
    assert np.nanmax(rows(feeds[b], ["max_proc_count"], done["t0"])["max_proc_count"]) == 1


def test_the_machine_is_sampled_by_one_worker_per_host(watched):
    feeds = watched.collector.workers()
    reporters = [f for f in feeds if f.about["machine"]]
    assert len(reporters) == 1
    with open("/proc/meminfo") as f:
        total_mb = float(f.readline().split()[1]) / 1024
    (reporter,) = reporters
    (other,) = [f for f in feeds if f is not reporter]
    assert rows(reporter, ["sys_mem_total_mb"])["sys_mem_total_mb"][-1] == pytest.approx(total_mb)
    assert np.isnan(rows(other, ["sys_mem_total_mb"])["sys_mem_total_mb"]).all()


def test_unwatch_leaves_no_nbmon_thread_on_any_worker(cluster):
    watch = nbmon.dask.watch(cluster)
    assert watch.ready(10)
    running = cluster.run(nbmon_thread_names)
    assert all(set(names) >= {"nbmon-sampler", "nbmon-consumers"} for names in running.values()), running
    assert nbmon.dask.unwatch() == {}
    assert cluster.run(nbmon_thread_names) == {w: [] for w in running}
    assert nbmon.dask.watching() is None
    plugins = cluster.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins))
    assert watch.topic not in plugins


def test_a_notebook_that_goes_away_leaves_nothing_running(cluster):
    notebook = Client(cluster.scheduler.address, set_as_default=False)
    watch = Watch(notebook, Options()).start()
    assert watch.ready(10)
    assert all(cluster.run(nbmon_thread_names).values())
    notebook.close()   # no unwatch: as when the kernel is killed
    wait_until(lambda: not any(cluster.run(nbmon_thread_names).values()), timeout=20,
               what="the workers to stop sampling")
    worker_plugins, plugins = cluster.run_on_scheduler(
        lambda dask_scheduler: (list(dask_scheduler.worker_plugins), list(dask_scheduler.plugins)))
    assert watch.topic not in worker_plugins and roster_name(watch.topic) not in plugins


def test_magics_summarise_the_cell_on_each_worker_and_stop_everywhere(ip, cluster):
    a, b = sorted(cluster.scheduler_info()["workers"])
    ip.user_ns["rm_client"] = cluster
    ip.user_ns["rm_workers"] = (a, b)
    with capture_output():
        ip.run_line_magic("resmon", "--dask rm_client")
    watch = nbmon.dask.watching()
    # The view is the session's helper's, drawn from the events the kernel passes on.
    assert watch is not None and SESSION.host.info()["cluster_views"] == 1
    wait_until(lambda: SESSION.host.info()["cluster_workers"] == [a, b], timeout=10,
               what="both workers' batches in the helper's copy")
    code = ("rm_done = rm_client.submit(__import__('test_dask_cluster').burn, 1.0, workers=[rm_workers[0]],"
            " pure=False).result()\n"
            "rm_big = rm_client.submit(__import__('test_dask_cluster').allocate, 300, workers=[rm_workers[0]],"
            " pure=False).result()\n")
    cells_before = len(nbmon.history(workers=True))
    with capture_output() as out:
        ip.run_cell_magic("resmon", "--label pinned", code)
    assert any("nbmon-workers" in o.data.get("text/html", "") for o in out.outputs)
    frame = nbmon.history(workers=True).iloc[cells_before:]
    assert sorted(frame["worker"]) == [a, b]
    assert set(frame["label"]) == {"pinned"} and set(frame["status"]) == {"ok"}
    assert set(frame["host"]) == {os.uname().nodename}
    on_a, on_b = frame.set_index("worker").loc[a], frame.set_index("worker").loc[b]
    burned, big = ip.user_ns["rm_done"], ip.user_ns["rm_big"]
    assert on_a["cpu_time_sec"] >= 0.9 * burned["cpu_s"], (on_a["cpu_time_sec"], burned)
    assert on_b["cpu_time_sec"] < 0.5 * burned["cpu_s"], on_b["cpu_time_sec"]
    # Each worker's own baseline differs: against what the task's process saw of itself.
    assert on_a["peak_rss_mb"] >= 0.95 * big["held_mb"] and on_b["peak_rss_mb"] < big["held_mb"] - 200, \
        (on_a["peak_rss_mb"], on_b["peak_rss_mb"], big)
    assert bool(on_a["peak_rss_exact"]) is True
    kernel = nbmon.history()
    assert kernel.iloc[-1]["label"] == "pinned" and len(kernel[kernel["label"] == "pinned"]) == 1
    samples = nbmon.samples(workers=True)
    assert {"worker", "host", "elapsed_s", "proc_cpu_percent", "max_proc_rss_mb"} <= set(samples.columns)
    assert set(samples["worker"]) == {a, b}
    # The batch with the cell's end (and its exact peak) is on its way: at most a period.
    wait_until(lambda: nbmon.samples(workers=True).groupby("worker")["max_proc_rss_peak_mb"].max()[a]
               >= 0.95 * big["held_mb"], timeout=10, what="the batch with the peak")
    with capture_output():
        ip.run_line_magic("resmon", "stop")
    assert nbmon.dask.watching() is None
    assert cluster.run(nbmon_thread_names) == {a: [], b: []}
    assert SESSION.host.info()["cluster_views"] == 0 and SESSION.host.info()["cluster_workers"] == []


def test_bad_input_is_one_sentence_and_changes_nothing(ip, cluster):
    with pytest.raises(ValueError, match=r"needs a distributed.Client, got 'tcp://x'"):
        nbmon.dask.watch("tcp://x")
    with pytest.raises(ValueError, match=r"every_s must be .* got 0.5"):
        nbmon.dask.watch(cluster, every_s=0.5)
    with pytest.raises(ValueError, match=r"interval must be a positive number of seconds, got -1"):
        nbmon.dask.watch(cluster, interval=-1)
    ip.user_ns["rm_three"] = 3
    for line, message in (("--dask rm_nope", "no variable 'rm_nope' in the notebook"),
                          ("--dask rm_three", "'rm_three' is a int, not a distributed.Client"),
                          ("stop --dask rm_three", "--dask only applies to %resmon start, not 'stop'")):
        with pytest.raises(UsageError, match=message):
            ip.run_line_magic("resmon", line)
    assert nbmon.dask.watching() is None
    assert cluster.run(nbmon_thread_names) == {w: [] for w in cluster.scheduler_info()["workers"]}


# -- workers that leave and join ------------------------------------------------------

def test_a_killed_worker_is_marked_gone_and_new_workers_appear(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        watch = nbmon.dask.watch(client)
        view = orphan = None
        try:
            assert watch.ready(10)
            view = ClusterView(watch, start=False)
            seen = FrontEnd(view)
            assert view.refresh()
            reporter = next(f for f in watch.collector.workers() if f.about["machine"])
            survivor = next(f for f in watch.collector.workers() if f is not reporter)
            pid = client.run(os.getpid, workers=[reporter.address])[reporter.address]
            orphan = client.submit(fork_sleeper, workers=[reporter.address], pure=False).result()
            record = CellRecord(7, "kill", start_time=time.time(), t_open=time.monotonic())
            with nbmon.dask.cell(record):   # a cell during which the worker dies
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda: reporter.state == "gone", timeout=20, what="the scheduler to see the worker go")
                time.sleep(0.5)   # the survivor's span: several samples at 10 Hz
            spans = {r.worker: r for r in record.workers}
            assert spans[reporter.address].status == "no answer"
            assert spans[reporter.address].summary.num_samples == 0
            assert spans[survivor.address].status == "ok" and spans[survivor.address].summary.num_samples > 5
            assert view.refresh(force=True) and view.errors == 0
            seen.read()
            gone = [s for s in seen.streams if s.get("trace", {}).get("name") == f"{reporter.name} (left)"]
            assert len(gone) == len(view.rows)
            x, y = seen.points["gone memory"]   # a marker where its trace ends
            assert x.tolist() == [reporter.store.latest()["t"]] and y[0] > 0
            # The host is still sampled: another worker (the survivor, or the killed
            # one's replacement, whichever takes the lock first) takes the machine over.
            # (Its forked child, alive, must not keep the host's lock.)
            wait_until(lambda: [f for f in watch.collector.workers() if f.state == "live" and f.about.get("machine")],
                       timeout=15, what="the machine to be taken over")
            os.kill(orphan, 0)   # still alive (raises if not)
            # The nanny restarts the killed worker (a new address), and one more is added.
            lc.scale(3)
            wait_until(lambda: len([f for f in watch.collector.workers()
                                    if f.state == "live" and f.store is not None]) == 3,
                       timeout=60, what="the restarted and the added workers' first batches")
            assert view.refresh() and view.errors == 0
            seen.read()
            live = [f for f in watch.collector.workers() if f.state == "live"]
            for feed in live:
                assert len(seen.points[f"{feed.address} cpu"][0]) >= 1, feed.address
            assert "3 workers · 1 left" in seen.title
            assert sum(f.about["machine"] for f in live) == 1
        finally:
            if orphan is not None:
                os.kill(orphan, signal.SIGKILL)
            if view is not None:
                view.close()
            assert nbmon.dask.unwatch() == {}


# -- what the scheduler relays, and what the notebook takes -------------------------

def private_dirs(tmp_path, *names) -> list[str]:
    """A private directory per simulated host (XDG_RUNTIME_DIR: its own host lock)."""
    made = []
    for name in names:
        (tmp_path / name).mkdir(mode=0o700)
        made.append(str(tmp_path / name))
    return made


def test_each_host_sends_one_batch_a_period_for_all_its_workers(tmp_path):
    """Four worker processes on two simulated hosts: the scheduler relays
    one event per host and period (before: one per worker), each worker
    still gets a row a period, and one worker per host reports its machine."""
    hosts = private_dirs(tmp_path, "a", "b")
    workers = {f"{host}-{k}": {"cls": Nanny, "options": {"nthreads": 1, "env": {"XDG_RUNTIME_DIR": hosts[i]}}}
               for i, host in enumerate("ab") for k in range(2)}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    with SpecCluster(workers=workers, scheduler=scheduler) as sc, Client(sc, set_as_default=False) as client:
        watch = nbmon.dask.watch(client, gpu=False)
        try:
            assert watch.ready(20)
            feeds = watch.collector.workers()
            wait_until(lambda: sum(bool(f.about.get("machine")) for f in feeds) == 2, timeout=20,
                       what="a machine reporter on each host")
            t0, rows = time.time(), {f.address: f.store.seq for f in feeds}
            time.sleep(6.0)
            # A worker's events carry its address (the scheduler adds it); the scheduler's own do not.
            relayed = [m for t, m in client.get_events(watch.topic) if t >= t0 and "worker" in m]
            assert len(relayed) <= 2 * (6 + 1), len(relayed)   # a host a period (before: 24, a worker a period)
            assert len({m["worker"] for m in relayed}) == 2    # each host's lock holder
            assert all(f.store.seq - rows[f.address] >= 3 for f in feeds), \
                {f.address: f.store.seq - rows[f.address] for f in feeds}
            assert watch.collector.unread == 0 and watch.collector.errors == 0
        finally:
            assert nbmon.dask.unwatch() == {}


@pytest.mark.parametrize("layout", [[1] * 1000, [8] * 125, [32] * 31 + [8], [250] * 4, [1] * 128, [4] * 3,
                                    [1] * 4096])
def test_the_whole_cluster_sends_the_scheduler_a_bounded_number_of_batches(layout):
    """However the workers sit on hosts (``layout``: workers per host), the
    hosts' batches reach the scheduler at most MAX_EVENTS_PER_S a second,
    unless each already waits MAX_PERIOD_S; the periods from Dask's own
    heartbeat intervals."""
    from distributed.scheduler import heartbeat_interval

    beat_s = heartbeat_interval(sum(layout))
    rate = sum(1.0 / host_period_s(1.0, beat_s, workers) for workers in layout)
    assert rate <= max(MAX_EVENTS_PER_S, len(layout) / MAX_PERIOD_S) * 1.0001, rate


def test_a_worker_leaves_only_when_the_scheduler_says_so():
    """Issue 32: any client's ``{'left': address}`` on the topic marked a
    live worker gone. Now only the scheduler's own worker-removal hook
    (the watch's roster, sealed) does: another client's word, and the
    watch's own events replayed, change nothing."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as client:
        watch = nbmon.dask.watch(client, gpu=False)
        try:
            assert watch.ready(10)
            a, b = watch.registered
            with Client(lc.scheduler_address, set_as_default=False) as other:
                replayed = [msg for _, msg in other.get_events(watch.topic)]   # any client may read them
                for msg in [{"left": a}, {"left": b}, *replayed]:
                    other.log_event(watch.topic, msg)
                wait_until(lambda: watch.collector.unread >= 2 + len(replayed), timeout=20,
                           what=lambda: f"{watch.collector.unread} events ignored")
            feeds = watch.collector.feeds
            assert feeds[a].state == feeds[b].state == "live", (feeds[a].state, feeds[b].state)
            assert set(feeds) == {a, b}
            client.retire_workers([b])   # the scheduler removes it
            wait_until(lambda: feeds[b].state == "gone", timeout=20, what="the scheduler's word on b")
            assert feeds[a].state == "live"
        finally:
            assert nbmon.dask.unwatch() == {}


def test_a_workers_clock_ahead_is_bounded_to_its_batches_arrival(monkeypatch):
    """Issue 32: a batch timed up to 299 s ahead was drawn in the future. A
    worker (in this process) whose clock runs 299 s ahead: its rows stand at
    their arrival, never later, and so does the view's x axis."""
    import nbmon.dask.worker

    monkeypatch.setattr(nbmon.dask.worker, "Monitor", functools.partial(Monitor, wall=lambda: time.time() + 299.0))
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as lc, \
            Client(lc, set_as_default=False) as client:
        watch = nbmon.dask.watch(client, system=False, gpu=False)
        try:
            feed = wait_until(lambda: next((f for f in watch.collector.workers() if f.store and len(f.store) >= 3),
                                           None), timeout=20, what="three batches")
            arrived = time.time()
            t, wall, _ = feed.store.series([])
            assert (wall <= arrived).all() and (t <= arrived - watch.collector.t0).all(), (wall - arrived, t)
            view = ClusterView(watch, start=False)
            seen = FrontEnd(view)
            assert view.refresh(force=True)
            assert max(seen.read().points["total cpu"][0]) <= time.time() - watch.collector.t0
            view.close()
        finally:
            assert nbmon.dask.unwatch() == {}


def test_figures_no_worker_can_report_are_refused(monkeypatch):
    """Issue 32: values of 3e38 were taken. A worker (in this process) whose
    source reports 3e38 MiB: its batches are refused, not a row of it is
    kept, and the view says why."""
    sample = ProcessTree.sample
    monkeypatch.setattr(ProcessTree, "sample", lambda self, now: {**sample(self, now), "proc_rss_mb": 3e38})
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as lc, \
            Client(lc, set_as_default=False) as client:
        watch = nbmon.dask.watch(client, system=False, gpu=False)
        try:
            wait_until(lambda: watch.collector.unread >= 2, timeout=20, what="two batches refused")
            assert "values no worker can report" in watch.collector.reason
            assert not [f for f in watch.collector.workers() if f.store is not None]   # not a row taken
            view = ClusterView(watch, start=False)
            view.refresh(force=True)
            assert "the last: a batch with values no worker can report" in " ".join(
                note["text"] for note in view.widget._nbmon["layout"]["annotations"])
            view.close()
        finally:
            assert nbmon.dask.unwatch() == {}


def bad_batches(columns, wall: float) -> list[tuple[str, dict]]:
    """(what, a process batch): what a broken worker, or someone else, might
    send (the wire's form; ``columns`` are a worker's)."""
    encoder = Encoder(columns, ident="bad")
    rows = np.ones((len(columns), 4))
    workers = {"tcp://fake:1": {"name": "fake"}}
    header = encoder.header({"host": "nowhere", "pid": 1, "machine": False, "period_s": 1.0}, workers)

    def batch(**changes):
        encoder.seq = 0   # each the first of its process
        msg = dict(encoder.encode(np.linspace(wall - 1, wall, 4), rows), h=header)
        msg.update(changes)
        return msg

    return [
        ("a worker address that is a number", batch(h={**header, "workers": {12345: {}}})),
        ("no process", batch(i=None)),
        ("a number that is text", batch(s="1")),
        ("t = 1e300", batch(t=[1e300, 1e300])),
        ("t = -1e300", batch(t=[-1e300, -1e300])),
        ("t = NaN", batch(t=[float("nan"), float("nan")])),
        ("t = text", batch(t="soon")),
        ("an 8 MiB array", batch(g=b"\0" * (8 << 20))),
        ("a short array", batch(g=b"\0" * 12)),
        ("arrays as text", batch(g="abc", c="def")),
        ("infinite values", dict(batch(), g=np.full(3 * 12, np.inf, dtype="<f4").tobytes())),
        ("values of 3e38", dict(batch(), g=np.full(3 * 12, 3e38, dtype="<f4").tobytes())),
        ("negative values", dict(batch(), g=np.full(3 * 12, -1.0, dtype="<f4").tobytes())),
        ("a header of columns nbmon does not have", batch(h={**header, "cols": ["x" * 1000]})),
        ("a header of 5,000 columns", batch(h={**header, "cols": ["proc_rss_mb"] * 5000})),
        ("no header", {k: v for k, v in batch().items() if k != "h"}),
    ]


def test_what_the_key_sealed_is_checked_all_the_same():
    """A host batch sealed with the watch's key (a worker with a bug, or a
    clock off by more than five minutes): each bad process batch in it is
    refused on its own, the good one beside it is taken, nothing raises."""
    watch = Watch(None, Options())
    columns = nbmon.catalog.names(nbmon.catalog.TREE)
    assert len(columns) == 15 and sum(map(nbmon.dask.wire.is_counter, columns)) == 3   # 12 gauges, 3 per row
    now = time.time()
    bad = bad_batches(columns, now)
    good = Encoder(columns, ident="good")
    msg = dict(good.encode(np.linspace(now - 1, now, 4), np.ones((len(columns), 4))),
               h=good.header({"host": "here", "pid": 2, "period_s": 1.0}, {"tcp://good:1": {"name": "good"}}))
    watch.collector.handle(seal(watch.key, {"p": [pack(m) for _, m in bad] + [b"\x81", pack(msg)], "period_s": 1.0}),
                           arrived=now)
    assert watch.collector.unread == len(bad) + 1 and watch.collector.errors == 0
    assert list(watch.collector.feeds) == ["tcp://good:1"]
    assert watch.collector.feeds["tcp://good:1"].store.seq == 1


def test_the_notebook_holds_its_share_per_worker_and_room_for_new_ones(monkeypatch):
    """The workers' stores: 1 MiB each on small clusters, the 128 MiB shared
    beyond (a watch started on 1,000 workers: 128 KiB each); at MAX_WORKERS
    the workers that left first make room for new ones."""
    small, large = Watch(None, Options()), Watch(None, Options())
    synthetic_batches(small, 4, 1)
    assert all(0.99 <= f.store.nbytes / dask_feeds.DEFAULT_WORKER_MAX_BYTES <= 1 for f in small.collector.workers())
    large.collector.expected = 1000
    synthetic_batches(large, 1000, 1)
    sizes = [f.store.nbytes for f in large.collector.workers()]
    assert len(sizes) == 1000 and max(sizes) <= dask_feeds.STORES_BYTES // 1000 and sum(sizes) <= dask_feeds.STORES_BYTES

    monkeypatch.setattr(dask_feeds, "MAX_WORKERS", 6)
    watch = Watch(None, Options())
    synthetic_batches(watch, 6, 2)
    for said, k in enumerate((4, 1), start=1):   # two leave (the scheduler's word)
        watch.collector.handle(seal(watch.key, {"r": said, "left": f"tcp://10.0.0.{k}:4000"}))
    synthetic_batches(watch, 9, 2)   # three more come: two take the room of those that left, the last finds none
    assert sorted(watch.collector.feeds) == [f"tcp://10.0.{k // 8}.{k % 8}:4000" for k in (0, 2, 3, 5, 6, 7)]
    assert watch.collector.unread == 2 and watch.collector.errors == 0   # the last one's two batches


# -- the view at any size ----------------------------------------------------------

_encoders: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # watch -> {worker: its process's Encoder}


def synthetic_batches(watch, workers: int, seconds: int, every_s: float = 1.0) -> None:
    """Feed ``watch`` the batches ``workers`` workers (a process each, 8 per
    host) would send over ``seconds``: real wire format, sealed with the
    watch's key, numbered on from the last call's."""
    columns = nbmon.catalog.names(nbmon.catalog.TREE)
    encoders = _encoders.setdefault(watch, {})
    rng = np.random.default_rng(1)
    start = watch.collector.t0
    for k in range(workers):
        encoder = encoders.setdefault(k, Encoder(columns, ident=f"process{k}"))
        header = encoder.header({"host": f"host{k // 8}", "pid": 1000 + k, "machine": False,
                                 "peaks": "high-water marks", "gpu": "off", "period_s": every_s},
                                {f"tcp://10.0.{k // 8}.{k % 8}:4000": {"name": f"w{k}", "limit_mb": 200.0,
                                                                       "spill": 0.7, "pause": 0.8}})
        for s in range(seconds):
            wall = start + s * every_s + np.linspace(0.1, every_s, 10)
            samples = rng.random((len(columns), 10)) * 100 + k
            msg = encoder.encode(wall, samples)
            if msg["s"] == 0:
                msg["h"] = header
            watch.collector.handle(seal(watch.key, {"p": [pack(msg)], "period_s": every_s}), arrived=wall[-1])


def test_frames_stay_within_64_kib_and_large_clusters_are_compact():
    watch = Watch(None, Options())
    synthetic_batches(watch, 12, 60)
    small = ClusterView(watch, window_s=600, start=False)
    views = [small]
    seen = {small: FrontEnd(small)}
    try:
        assert small.refresh() and not small.compact and len(seen[small].workers()) == 12
        assert 0 < small.last_frame_bytes <= MAX_FRAME_BYTES
        assert all(len(seen[small].read().points[f"tcp://10.0.0.{k}:4000 cpu"][0]) == 60 for k in range(8))
        # RSS (up to ~100 MiB here) is past half of each threshold: they are drawn
        assert {shape["label"]["text"] for shape in seen[small].layout["shapes"]} == {
            "memory limit 200 MiB", "spill 70.0 % 140 MiB", "pause 80.0 % 160 MiB"}
        synthetic_batches(watch, 1, 61)   # a batch more of one worker: only it is sent
        assert small.refresh()
        sent = seen[small].comm.customs("nbmon:append")[-1][0]["groups"]
        assert [g["ids"] for g in sent if not g["replace"]] == [[f"tcp://10.0.0.0:4000 {row.key}" for row in small.rows]]
        synthetic_batches(watch, COMPACT_AT + 36, 60)   # the 12 again, and 88 more
        views.append(ClusterView(watch, window_s=600, start=False))   # made compact
        seen[views[1]] = FrontEnd(views[1])
        assert small.refresh() and small.compact      # turned compact
        for view in views:
            assert view.refresh(force=True) and view.compact and not seen[view].workers()
            assert "compact view (100 workers" in seen[view].layout["legend"]["title"]["text"]
            assert len(seen[view].streams) == len(BANDS) * len(view.rows) + len(view.rows) + 1   # + totals, hosts
            assert 0 < view.last_frame_bytes <= MAX_FRAME_BYTES
        for view in views:
            assert not view.refresh() and view.skipped == 1   # nothing new: nothing sent
        watch.collector.handle(seal(watch.key, {"r": 1, "left": "tcp://10.0.0.1:4000"}))   # the scheduler's word
        watch.collector.handle({"something": "else"})   # someone else's event on the topic
        assert watch.collector.unread == 1
        for view in views:
            assert view.refresh() and view.errors == 0
            assert "99 workers · 1 left" in seen[view].read().title
            assert "1 event(s) on the topic ignored" in seen[view].layout["annotations"][0]["text"]
        # the memory column's total: every worker's batch peak (the most of 10 uniform draws), summed
        assert np.nanmax(seen[small].points["total memory"][1]) == \
            pytest.approx(sum(100 * 10 / 11 + k for k in range(100)), rel=0.05)
    finally:
        for view in views:
            view.close()


@pytest.mark.parametrize("seed", range(40))
def test_held_is_each_series_latest_value_at_or_before_each_edge(seed):
    """The grid's lookup (one search for every worker): at each edge, each
    series' value at its latest time at or before the edge, NaN when there
    is none or it is older than the staleness; ties in time, empty series."""
    rng = np.random.default_rng(seed)
    series = []
    for _ in range(rng.integers(0, 6)):
        t = np.sort(rng.choice(np.arange(0.0, 30.0, 0.5), rng.integers(0, 20)))
        series.append((np.repeat(t, 2) if seed % 3 == 0 else t, rng.random(len(t) * (2 if seed % 3 == 0 else 1))))
    edges = np.sort(rng.uniform(-5, 35, rng.integers(1, 40)))
    stale_s = (1.0, 3.0, math.inf)[seed % 3]
    got = held(series, edges, stale_s)
    assert got.shape == (len(series), len(edges))
    for (t, v), row in zip(series, got):
        for edge, value in zip(edges, row):
            before = np.flatnonzero(t <= edge)
            if not before.size or edge - t[before[-1]] > stale_s:
                assert math.isnan(value)
            else:
                assert value == v[before[-1]]


def test_refreshes_at_most_four_times_a_second_while_batches_pour_in():
    watch = Watch(None, Options())
    synthetic_batches(watch, 4, 5)
    with pytest.raises(ValueError, match="refresh_hz must be at most 4, got 10"):
        ClusterView(watch, refresh_hz=10)
    watch.running = True   # the refresher keeps going while the watch runs
    view = ClusterView(watch)
    try:
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            synthetic_batches(watch, 1, 1)
            time.sleep(0.01)
        refreshes = view.refreshes
        assert 3 <= refreshes <= 4 * 1.5 + 1, refreshes
    finally:
        watch.running = False
        view.close()


# -- GPUs: each worker its own ---------------------------------------------------------

def test_each_worker_reports_only_the_gpu_it_may_use(fake_gpu, fake_nvml_lib):
    devices = [{"util_gpu": 11, "mem_total": 16 << 30, "mem_used": 1 << 30, "uuid": "GPU-aaaa0000-0000"},
               {"util_gpu": 77, "mem_total": 16 << 30, "mem_used": 5 << 30, "uuid": "GPU-bbbb1111-1111"}]
    fake_gpu.set(devices=devices)
    env = {"NBMON_NVML_LIBRARY": fake_nvml_lib, **fake_gpu.env}
    workers = {name: {"cls": Nanny, "options": {"nthreads": 1, "env": {**env, "CUDA_VISIBLE_DEVICES": visible}}}
               for name, visible in (("by-index", "0"), ("by-uuid", "GPU-bbbb1111"))}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    with SpecCluster(workers=workers, scheduler=scheduler) as sc, Client(sc, set_as_default=False) as client:
        watch = nbmon.dask.watch(client, system=False)
        try:
            assert watch.ready(15)
            by_name = {f.name: f for f in watch.collector.workers()}
            first, second = by_name["by-index"], by_name["by-uuid"]
            assert [c for c in first.decoder.columns if c.startswith("gpu0_")] and \
                not [c for c in first.decoder.columns if c.startswith("gpu1_")]
            assert [c for c in second.decoder.columns if c.startswith("gpu1_")] and \
                not [c for c in second.decoder.columns if c.startswith("gpu0_")]
            assert rows(first, ["gpu_util_percent"])["gpu_util_percent"][-1] == 11
            assert rows(second, ["max_gpu1_mem_used_mb"])["max_gpu1_mem_used_mb"][-1] == 5 * 1024
            view = ClusterView(watch, start=False)
            seen = FrontEnd(view)
            assert [row.key for row in view.rows] == ["cpu", "memory", "gpu_util", "gpu_memory"]
            assert view.refresh()
            gpu_memory = seen.read().points["total gpu_memory"][1]   # each device once: 1 + 5 GiB
            assert np.nanmax(gpu_memory) == 6 * 1024
            view.close()
        finally:
            assert nbmon.dask.unwatch() == {}
