"""``nbmon run -- CMD``, ``nbmon demo``, ``nbmon report``, ``nbmon compare``
(:mod:`.notebooks`), ``nbmon postmortem``, ``nbmon kernels`` and ``nbmon top``
(:mod:`.top`).

``run`` starts the command, monitors its whole process tree, prints the
summary to stderr when it ends and exits with the command's exit code
(128 + N when a signal N killed it, 127 when it cannot be found, like a
shell). Bad arguments and unwritable outputs are reported in one line with
exit code 2 before the command starts.

nbmon makes itself the subreaper of what it runs (PR_SET_CHILD_SUBREAPER),
so a process the command orphans (a daemon, ``nohup ... &``) is handed to
nbmon instead of init and stays in the tree. When the command exits while
such processes still run, the run ends there and the summary says which
are left; ``--wait-descendants`` monitors until the last one ends.
"""
from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager

from .. import options as opts
from ..postmortem import deaths
from ..postmortem.memguard import MemoryGuard, stop_text
from . import notebooks, ranks
from ..engine import Monitor
from ..format import one_line, printable
from ..options import Options, check_interval
from ..private import fallback_note
from ..sinks.senders import FORCE_HINT, SINKS, Ended, check_outputs, open_streams, outputs_given
from ..sinks.senders import arguments as sink_arguments
from ..sources.cgroup import OwnGroup
from ..launch import EXCLUDED
from ..overview import SORTS
from ..sources.tree.linux import all_thread_child_pids
from ..values import NAN, known
from ..report.summary import ResourceSummary

VERBS = ("run", "demo", "report", "compare", "postmortem", "kernels", "top")
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


class UsageError(Exception):
    pass


@contextmanager
def _refused():
    """A refusal of nbmon's own checks (ValueError, one sentence) as a usage error."""
    try:
        yield
    except ValueError as err:
        raise UsageError(str(err)) from None


def _page(monitor, path, *, title: str, overwrite: bool) -> None:
    from ..views.dashboard import write_html

    write_html(monitor, path, title=title, overwrite=overwrite)


def _say(text: str, file=None) -> None:
    """Print a line for the user (stderr by default); text from elsewhere in
    it (a rank file's host, a file name) cannot reach the terminal as escapes."""
    print(printable(text), file=sys.stderr if file is None else file)


def _count(text: str) -> int:
    """A positive whole number for argparse (--top)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints the usage too)
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nbmon", description="CPU, memory and GPU of a command's whole process tree.")
    sub = p.add_subparsers(dest="verb", metavar="{" + ",".join(VERBS) + "}", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run CMD under the monitor", usage="nbmon run [options] -- CMD [ARGS...]")
    for args, kwargs in (*opts.arguments(opts.CLI), *sink_arguments(opts.CLI)):
        run.add_argument(*args, **kwargs)
    run.add_argument("--quiet", action="store_true", help="do not print the summary")
    run.add_argument("--cgroup", action="store_true",
                     help="run the command in a memory cgroup of its own, for the tree's exact peak (page "
                          "cache included) without reading any process's high-water mark; the command's "
                          "cgroup changes, its memory limit stays (needs the rights to make one)")
    run.add_argument("--wait-descendants", action="store_true",
                     help="when the command exits, go on until every process it started has ended")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments, after --")
    # -- the ranks of a distributed job (nbmon/cli/ranks.py) --
    run.add_argument("--rank-dir", metavar="DIR", help="write this rank's samples to DIR/rank-<N>.jsonl, N "
                     "from RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID (torchrun, mpirun, Slurm)")
    run.add_argument("--rank", metavar="N", help="with --rank-dir: the rank, where no launcher sets one")
    report = sub.add_parser("report", help="a notebook's costliest cells, or the ranks of a distributed job",
                            usage="nbmon report NOTEBOOK.ipynb [--sort M] [--top N] [--json] [--html PATH] [--force]\n"
                                  "       nbmon report FILE_OR_GLOB... [--html PATH] [--force] [--period S]")
    report.add_argument("ranks", nargs="+", metavar="FILE_OR_GLOB",
                        help="a saved or executed notebook, or the ranks' JSON Lines files")
    report.add_argument("--html", metavar="PATH", help="write an offline page: the notebook's table, or the ranks' "
                        "timeline per metric, a trace per rank")
    report.add_argument("--force", action="store_true", help="replace the page if it exists")
    report.add_argument("--period", metavar="S", help="seconds between the lines of files without times "
                        "(SystemMonitor's sample_rate_seconds)")
    report.add_argument("--sort", choices=notebooks.SORTS, default="time",
                        help="a notebook's cells: what to sort by, largest first (time)")
    report.add_argument("--top", metavar="N", type=_count, help="a notebook's cells: only the N costliest")
    report.add_argument("--json", action="store_true", help="a notebook's cells as JSON, for scripts")
    compare = sub.add_parser("compare", help="two runs of a notebook cell by cell: the largest regressions first",
                             usage="nbmon compare OLD.ipynb NEW.ipynb [--fail-if RULE]... [--top N] [--json]")
    compare.add_argument("old", metavar="OLD.ipynb")
    compare.add_argument("new", metavar="NEW.ipynb")
    compare.add_argument("--fail-if", metavar="RULE", action="append", default=[],
                         help="exit 1 if a cell breaks RULE: METRIC>+N%% (than the old run) or METRIC>+N "
                              "(seconds, MiB, %% of a core); METRIC one of " + ", ".join(notebooks.SORTS))
    compare.add_argument("--top", metavar="N", type=_count, help="only the first N cells")
    compare.add_argument("--json", action="store_true", help="the comparison as JSON, for scripts")
    sub.add_parser("postmortem", help="the kernels of yours that died while nbmon watched them, newest first",
                   usage="nbmon postmortem")
    sorts = {"choices": tuple(SORTS), "default": "memory", "help": "what to sort by, largest first (memory)"}
    listing = sub.add_parser("kernels", help="every Jupyter kernel of yours on this host: memory, CPU, GPU, state",
                             usage="nbmon kernels [--sort memory|cpu|gpu|age] [--json]")
    listing.add_argument("--sort", **sorts)
    listing.add_argument("--json", action="store_true", help="the table as JSON, for scripts")
    live = sub.add_parser("top", help="the kernels' table, redrawn in place until q",
                          usage="nbmon top [--sort memory|cpu|gpu|age] [--once]")
    live.add_argument("--sort", **sorts)
    live.add_argument("--once", action="store_true", help="print one table and exit")
    demo = sub.add_parser("demo", help="run a short built-in workload under the monitor")
    for args, kwargs in opts.arguments(opts.CLI):
        demo.add_argument(*args, **kwargs)
    demo.add_argument("--html", metavar="PATH", help=SINKS["html"].help)
    demo.add_argument("--force", action="store_true", help="replace the page if it exists")
    return p


def run(argv: list[str], options: Options, outputs: dict[str, str] | None = None, *,
        force: bool = False, quiet: bool = False, tags: dict | None = None,
        wait_descendants: bool = False, own_cgroup: bool = False) -> int:
    """Run ``argv`` under a monitor; ``outputs`` maps names of sinks
    (nbmon.sinks.senders.SINKS) to their targets; ``tags`` are added to
    every streamed sample (a rank's). Returns the exit code nbmon exits with."""
    outputs = {k: v for k, v in (outputs or {}).items() if v is not None}
    with _refused():
        check_outputs(outputs, force, FORCE_HINT)
    refused = _cannot_run(argv)
    if refused:
        return refused
    adopted = _become_subreaper()
    # A child's ru_maxrss starts at its parent's peak (the image it forked
    # from, counted again at exec): only above ours is it the command's own.
    own_peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    group = OwnGroup.make() if own_cgroup else None
    if own_cgroup and group is None:
        _say(f"nbmon: --cgroup: {OwnGroup.why}; the peak is read from the processes' high-water marks")
    started = _start(argv, outputs, force, group)
    if isinstance(started, int):
        return started
    child, streams = started
    every_s = min(1.0, max(options.interval, 0.2))
    monitor = Monitor(child.pid, dataclasses.replace(options, adopt=options.children and adopted))
    for sender in streams:
        monitor.attach(ranks.Tagged(sender, tags) if tags else sender, every_s)
    guard_fd = _guard(monitor, child, argv) if options.memory_guard_percent is not None else None
    exit_ = _watch(child, monitor, options.interval, wait_descendants and adopted)
    if guard_fd is not None:
        os.close(guard_fd)
    summary = _with_exit_usage(monitor.summary(), exit_, monitor.store.t_start, options.children, own_peak_kb)
    if group is not None:
        summary = dataclasses.replace(summary, peak_group_mem_mb=known(group.peak_mb()))
        left_group = group.close()
        if left_group:
            _say(f"nbmon: {left_group}")
    _write_reports(outputs, Ended(summary, monitor, " ".join(argv), page=_page), force)
    _tell_end(argv, exit_, summary, monitor, quiet)
    return 128 - exit_.code if exit_.code < 0 else exit_.code


def _guard(monitor: Monitor, child: subprocess.Popen, argv: list[str]) -> int | None:
    """The memory guard over the command, as over one cell that runs from its
    start to its end: it sends the command SIGINT (as a Ctrl-C would, to it
    alone), once, and says so even with --quiet. Returns the command's pidfd
    (None where there is none), for the caller to close once it is reaped."""
    try:
        pidfd = os.pidfd_open(child.pid)   # no other process is signalled once the command is reaped
    except (AttributeError, OSError):
        pidfd = None
    running = (1, time.time(), "")

    def interrupt(_number, level) -> None:
        _say(stop_text(level, f"nbmon: sent SIGINT to {argv[0]}", "it", ""))
        try:
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, signal.SIGINT)
            elif child.returncode is None:
                os.kill(child.pid, signal.SIGINT)
        except ProcessLookupError:   # it ended meanwhile
            pass

    monitor.attach(MemoryGuard(child.pid, monitor.options.memory_guard_percent, stop=interrupt,
                               running_cell=lambda: running))
    return pidfd


def _cannot_run(argv: list[str]) -> int:
    """The shell's exit code for a command that cannot start (said in one
    line), 0 when it may."""
    if not argv:
        raise UsageError("missing command: nbmon run [options] -- CMD [ARGS...]")
    # A path that exists but cannot run is 126 (Popen says why), as in a shell, not "not found".
    if shutil.which(argv[0]) is None and not (os.sep in argv[0] and os.path.exists(argv[0])):
        _say(f"nbmon: command not found: {argv[0]}")
        return 127
    # A path that cannot run is refused before the outputs are opened: --force would truncate them.
    if os.sep in argv[0] and (os.path.isdir(argv[0]) or not os.access(argv[0], os.X_OK)):
        _say(f"nbmon: cannot run {argv[0]}: {os.strerror(errno.EACCES)}")
        return 126
    return 0


def _start(argv: list[str], outputs: dict[str, str], force: bool, group):
    """(the command's process, its streams' senders), or the exit code when
    it cannot start; then no stream is left open, no output file made."""
    streams = []
    try:
        with _refused():
            streams = open_streams(outputs, force, FORCE_HINT)
        return subprocess.Popen(argv, preexec_fn=group.enter if group else None), streams
    except (OSError, UsageError) as err:  # an output, or the command: not a binary, ...
        if streams:
            streams.discard()
        if group is not None:
            group.close()
        if isinstance(err, UsageError):
            raise
        _say(f"nbmon: cannot run {argv[0]}: {err.strerror}")
        return 126


def _watch(child: subprocess.Popen, monitor: Monitor, interval: float, descendants: bool) -> "_Exit":
    """Monitor ``child`` until it (and with ``descendants`` what it left) ends."""
    # Like a shell waiting for its job: Ctrl-C goes to the command (same
    # process group), nbmon stays to report; SIGTERM is passed on.
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        monitor.start()
        return _wait(child, descendants)
    finally:
        with warnings.catch_warnings():  # faults are listed below, once
            warnings.simplefilter("ignore", RuntimeWarning)
            monitor.stop(timeout=max(1.0, interval + 0.1))
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def _write_reports(outputs: dict[str, str], ended: Ended, force: bool) -> None:
    for name, path in outputs.items():
        if SINKS[name].write is None:
            continue
        try:
            # Not replaced without --force: a file that appeared while the command ran is not ours.
            SINKS[name].write(path, ended, force)
        except FileExistsError:
            _say(f"nbmon: error: {path} appeared while the command ran; not replaced (add --force to replace it)")
        except OSError as err:  # the disk filled, the directory went
            _say(f"nbmon: error: cannot write {path}: {err.strerror or err}")


def _tell_end(argv: list[str], exit_: "_Exit", summary: ResourceSummary, monitor: Monitor, quiet: bool) -> None:
    code, left = exit_.code, _left_running(exit_)
    if not quiet:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        _say(f"\nnbmon: {' '.join(argv)} {how}\n{summary}")
    if left:  # said even with --quiet: the figures stop short of them
        _say(f"nbmon: {len(left)} process(es) the command started still run (pid {', '.join(map(str, left))}); "
             f"the figures end when the command did (--wait-descendants to follow them to the end)")
    for fault in monitor.faults.values():  # errors (an output that failed) even with --quiet
        _say(f"nbmon: {fault.source} failed {fault.count} time(s): {fault.first_error}")


def _become_subreaper() -> bool:
    """Make this process the reaper of the command's orphans (Linux 3.4+)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


class _Exit:
    """How the command ended, as the kernel accounted for it when it was reaped."""

    def __init__(self):
        self.code = 0
        self.t = NAN              # monotonic time the command (or the last descendant) ended
        self.cpu_s = 0.0          # CPU of every process reaped: the command's whole waited tree
        self.peak_kb = 0          # the largest single process's peak RSS (ru_maxrss)

    def add(self, usage) -> None:
        """The kernel's account of one process just reaped."""
        self.cpu_s += usage.ru_utime + usage.ru_stime
        self.peak_kb = max(self.peak_kb, usage.ru_maxrss)
        self.t = time.monotonic()


def _wait(child: subprocess.Popen, descendants: bool) -> _Exit:
    """Reap the command, and the orphans handed to us meanwhile (wait4: the
    kernel's own account of each, covering even a command shorter than one
    interval); with ``descendants``, until none is left."""
    exit_ = _Exit()
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:  # nothing left to wait for
            break
        exit_.add(usage)
        if pid == child.pid:
            child.returncode = exit_.code = os.waitstatus_to_exitcode(status)
            if not descendants:
                break
    return exit_


def _left_running(exit_: _Exit) -> list[int]:
    """What the command left running when it exited. nbmon is the subreaper:
    every process the command left behind hangs below one of nbmon's own
    children, so those are the answer, once the ones that already ended are
    reaped (their accounts join ``exit_``)."""
    while True:
        try:
            pid, _status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:  # none ended: the rest still run
            break
        exit_.add(usage)
    left, queue = [], [os.getpid()]
    while queue:  # each of them, and what runs below it
        try:
            children = [pid for pid in all_thread_child_pids(queue.pop()) if pid not in EXCLUDED]
        except OSError:  # gone meanwhile, or no /proc (not Linux)
            continue
        left += children
        queue += children
    return left


def _with_exit_usage(summary: ResourceSummary, exit_: _Exit, t_start: float, children: bool,
                     own_peak_kb: int) -> ResourceSummary:
    """The summary up to the command's very end: its duration to the exit
    (the last sample may be up to an interval before it), its CPU time from
    the kernel's accounts when they hold more than the samples saw (they
    cover what ran after the last sample), and no peak below the largest
    single process's (ru_maxrss, when it is above ``own_peak_kb``)."""
    duration = max(summary.duration_sec, exit_.t - t_start)
    cpu_s = summary.cpu_time_sec or 0.0
    peak_mb = exit_.peak_kb / 1024.0
    changes = {}
    # The accounts include the reaped descendants, which children=False leaves out.
    if children:
        cpu_s = max(cpu_s, exit_.cpu_s)
        if exit_.peak_kb > own_peak_kb and peak_mb > summary.peak_rss_mb:
            changes["peak_rss_mb"] = peak_mb
        # The tree's memory was at least what its largest process had at its peak.
        if exit_.peak_kb > own_peak_kb and summary.peak_mem_mb is not None and peak_mb > summary.peak_mem_mb:
            changes["peak_mem_mb"] = peak_mb
    if summary.peak_rss_mb == 0.0 and "peak_rss_mb" not in changes:
        changes["peak_rss_exact"] = False  # gone before its first reading: no process runs in 0 bytes
    mean = cpu_s / duration * 100.0 if duration > 0 else summary.mean_cpu_percent
    # The busiest interval cannot have been below the mean (a command shorter than one interval).
    peak = None if mean is None else max(summary.peak_cpu_percent or 0.0, mean)
    changes.update(duration_sec=duration, cpu_time_sec=cpu_s, mean_cpu_percent=mean, peak_cpu_percent=peak)
    return dataclasses.replace(summary, **changes)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        # argparse would say "the following arguments are required: verb" or
        # "argument verb: invalid choice": name the subcommand as the magics do.
        if not args:
            raise UsageError(f"missing subcommand; use one of: {', '.join(VERBS)}")
        if args[0] not in VERBS and not args[0].startswith("-"):
            raise UsageError(f"unknown subcommand {args[0]!r}; use one of: {', '.join(VERBS)}")
        ns = _parser().parse_args(args)
        if ns.verb == "postmortem":
            return _postmortem()
        if ns.verb == "report":
            return _report(ns)
        if ns.verb == "compare":
            with _refused():
                return notebooks.compare(ns.old, ns.new, ns.fail_if, ns.top, ns.json)
        if ns.verb in ("kernels", "top"):
            from . import top

            return top.kernels(ns.sort, ns.json) if ns.verb == "kernels" else top.top(ns.sort, ns.once)
        with _refused():
            options = Options.from_arguments(ns)
        if not hasattr(ns, "memory_guard_percent"):   # a command is interrupted only where asked
            options = Options.of(options, memory_guard_percent=None)
        if ns.verb == "demo":
            return run([sys.executable, "-m", "nbmon.cli.demo"], options, {"html": ns.html}, force=ns.force)
        command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
        outputs = outputs_given(ns, opts.CLI)
        with _refused():
            tags = ranks.run_tags(ns.rank_dir, ns.rank, outputs)
        return run(command, options, outputs, force=ns.force, quiet=ns.quiet, tags=tags,
                   wait_descendants=ns.wait_descendants, own_cgroup=ns.cgroup)
    except UsageError as err:
        _say(f"nbmon: error: {err}")
        return 2


def _postmortem() -> int:
    """``nbmon postmortem``: each kernel of this user's that died while nbmon
    watched it (its black box is kept a week), newest first; what in the
    boxes' directory is not a box is named on stderr."""
    found, scan = deaths.deaths()
    if scan.problem:
        print(f"nbmon: {scan.problem}", file=sys.stderr)
        return 1
    if fallback_note():
        print(fallback_note(), file=sys.stderr)
    for death in found:
        print(f"{death}\n")
    if not found:
        print(f"nbmon: no kernel of yours died while nbmon watched it in the last "
              f"{deaths.KEEP_S / 86400:g} days")
    for path, why in scan.skipped:
        print(one_line(f"nbmon: skipped {path}: {why}"), file=sys.stderr)
    if scan.unread:
        print(one_line(f"nbmon: {len(scan.unread)} older entries of {scan.directory} not read "
                       f"(the newest {deaths.MAX_ENTRIES} are)"), file=sys.stderr)
    return 0


def _report(ns) -> int:
    """``nbmon report``: a notebook's table, or the ranks' table, on stdout,
    and the page with --html."""
    with _refused():
        check_outputs({"html": ns.html} if ns.html else {}, ns.force, FORCE_HINT)
        if len(ns.ranks) == 1 and notebooks.is_notebook_file(ns.ranks[0]):
            return notebooks.report(ns.ranks[0], ns.sort, ns.top, ns.json, ns.html, ns.force)
    try:
        period_s = None if ns.period is None else check_interval(ns.period, "--period")
        frame = ranks.read_ranks(ns.ranks, period_s=period_s)
    except (ValueError, OSError) as err:
        raise UsageError(str(err)) from None
    _say(ranks.text_report(ranks.rank_table(frame)), sys.stdout)
    if ns.html:
        try:
            ranks.write_report(frame, ns.html, title=" ".join(ns.ranks), overwrite=ns.force)
        except FileExistsError:
            raise UsageError(f"{ns.html!r} appeared meanwhile; not replaced (add --force to replace it)") from None
        except OSError as err:
            raise UsageError(f"cannot write {ns.html!r}: {err.strerror or err}") from None
        _say(f"nbmon: wrote {ns.html}", sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
