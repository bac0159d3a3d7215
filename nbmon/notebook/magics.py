"""``%resmon`` / ``%%resmon``: the IPython face of nbmon.

The only module that imports IPython. Widgets are created and displayed on
the main thread; background threads only set traits.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import re
import sys
import threading
import uuid

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import HTML, display

from .. import dask as nbmon_dask, options as opts, senders
from ..engine import StartError
from ..format import printable
from ..options import DEFAULT_WINDOW_S, MAGIC, Options, check_interval
from . import kernel_watch
from .session import SESSION, cell_record, one_line

SUBCOMMANDS = ("start", "stop", "status", "summary", "auto")
# The live dashboard runs for long: a helper process keeps its timeline whole
# while C code holds the GIL (benchmarks/RESULTS.md, gaps). %%resmon and auto
# mode start a thread-backend monitor when none runs: a helper's start-up
# (~0.3 s) per cell would cost more than it saves, and a cell's summary is
# exact either way (cumulative CPU clocks, the kernel's peak RSS).
DEFAULT_BACKEND = "process" if sys.platform.startswith("linux") else "thread"


def _seconds(text: str | None, name: str, default: float, *, zero_ok: bool = False) -> float:
    if text is None:
        return default
    if zero_ok:  # --threshold 0 means every cell; intervals and windows must stay positive
        try:
            if float(text) == 0:
                return 0.0
        except ValueError:
            pass  # check_interval names the bad value
    try:
        return check_interval(text, name)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _prompt_number(shell) -> int:
    """The prompt number of the running cell: IPython's result of the cell
    knows it (``shell.execution_count`` is ahead by one in some versions and
    front ends); the count itself outside a cell."""
    result = getattr(shell.displayhook, "exec_result", None)
    count = getattr(result, "execution_count", None)
    return count if count is not None else shell.execution_count


def _user_traceback(shell, err: BaseException) -> None:
    """Make IPython show ``err`` from the cell's own frames on, without the
    magic's call and nbmon's frames above them. The exception object itself
    is the cell's, unchanged but for this hook, which IPython asks for first
    when it shows a traceback."""
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next

    def render():
        return shell.InteractiveTB.structured_traceback(type(err), err, tb, tb_offset=0)

    try:
        err._render_traceback_ = render
    except (AttributeError, TypeError):  # an exception type without a __dict__: its full traceback
        pass


def _cannot_start(err: StartError) -> None:
    print(err, file=sys.stderr)   # one sentence; the cell goes on


def _unquote(text: str) -> str:
    # parse_argstring splits non-POSIX style and keeps quotes: --label "a b" arrives as '"a b"'.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _from_table(calls):
    """A decorator giving a magic the ``add_argument`` calls of a table
    (nbmon.options's, nbmon.senders's), in order."""
    def decorate(func):
        for args, kwargs in reversed(calls):
            func = argument(*args, **kwargs)(func)
        return func
    return decorate


def _only(flags: list[str], where: str) -> None:
    """Refuse ``flags`` given where they do not apply."""
    if flags:
        raise UsageError(f"{', '.join(flags)} only appl{'ies' if len(flags) == 1 else 'y'} to {where}")


@magics_class
class ResmonMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.dashboards: list = []   # (Dashboard, display handles of its table and picture)
        self.cluster_views: list = []   # nbmon.notebook.cluster.ClusterView, displayed
        self.cells: list[dict] = []   # cell executions while a dashboard shows: its bands
        self.auto_threshold_s: float | None = None
        self._auto_started_monitor = False
        self._auto_cell = None

    @magic_arguments()
    @argument("subcommand", nargs="?", default="start",
              help="line magic: start (default), stop, status, summary, or auto on|off")
    @argument("value", nargs="?", help="on or off, for auto")
    @_from_table(opts.arguments(MAGIC))
    @argument("--window", metavar="S", help=f"seconds shown by the live dashboard (default {DEFAULT_WINDOW_S:g})")
    @argument("--threshold", metavar="S", help="auto mode: only summarise cells longer than this (default 1)")
    @argument("--dask", metavar="CLIENT", help="%%resmon start: watch every worker of the "
              "distributed.Client named CLIENT in the notebook (see nbmon.dask)")
    @argument("--label", default="", help="cell magic: a name for this cell in nbmon.history()")
    @argument("--quiet", action="store_true", help="cell magic: no live meter and no summary output")
    @argument("-o", "--output", action="store_true",
              help="cell magic: return the ResourceSummary (like %%timeit -o) instead of the cell's value")
    @_from_table(senders.arguments(MAGIC))   # %resmon start: files it streams the samples to
    @line_cell_magic
    def resmon(self, line: str = "", cell: str | None = None):
        """Monitor the kernel's CPU, memory and GPU.

        %resmon [start]   start monitoring (if not running) and show a live dashboard
        %resmon stop      stop; the dashboards freeze into a static record
        %resmon status    what is running, faults, GPU state
        %resmon summary   the ResourceSummary since start
        %resmon auto on   summarise every cell over --threshold seconds (auto off to stop)
        %%resmon          run the cell and show its ResourceSummary
        """
        args = parse_argstring(self.resmon, line)
        args.label = _unquote(args.label)
        try:
            options = Options.from_arguments(args)
        except ValueError as err:
            raise UsageError(str(err)) from None
        outputs = {name: _unquote(path) for name, path in senders.outputs_given(args, MAGIC).items()}
        streamed = [senders.SINKS[name].flag for name in outputs]
        if cell is not None:
            if args.subcommand != "start" or args.value:
                raise UsageError(f"%%resmon takes options only, not {args.subcommand!r}")
            _only(streamed, "%resmon start")
            return self._run_cell(cell, options, args)
        _only([name for name, given in (("--label", args.label), ("--quiet", args.quiet), ("-o", args.output))
               if given], "a %%resmon cell")
        if args.dask and args.subcommand != "start":
            raise UsageError(f"--dask only applies to %resmon start, not {args.subcommand!r}")
        if args.subcommand not in SUBCOMMANDS:
            raise UsageError(f"unknown %resmon subcommand {args.subcommand!r}; "
                             f"use one of: {', '.join(SUBCOMMANDS)}")
        if args.subcommand != "start":
            _only(streamed, "%resmon start")
        if args.subcommand == "auto":
            return self._auto(args.value, _seconds(args.threshold, "--threshold", 1.0, zero_ok=True), options)
        if args.value:
            raise UsageError(f"%resmon {args.subcommand} takes no value, got {args.value!r}")
        if args.subcommand == "start":
            return self._start_line(args, options, outputs)
        if args.subcommand == "stop":
            return self.stop()
        if args.subcommand == "status":
            print(self.status())
            return None
        return SESSION.monitor.summary() if SESSION.monitor else None

    # -- line magic ------------------------------------------------------
    def _start_line(self, args, options: Options, outputs: dict[str, str]) -> None:
        """``%resmon [start]``: the live chart of the kernel's monitor (or of
        a Dask cluster), every sample streamed to ``outputs``."""
        window = _seconds(args.window, "--window", DEFAULT_WINDOW_S)
        if window < options.interval:
            raise UsageError(f"--window ({window:g} s) must be at least --interval ({options.interval:g} s)")
        if args.dask:
            _only([senders.SINKS[name].flag for name in outputs], "the kernel's monitor, not to --dask")
            return self._watch_cluster(args.dask, options, window)
        try:
            senders.check_outputs(outputs, args.force, senders.FORCE_HINT)   # refused before anything starts
        except ValueError as err:
            raise UsageError(str(err)) from None
        if not hasattr(args, "backend"):
            options = Options.of(options, backend=DEFAULT_BACKEND)
        try:
            self._start(options, window, interval_given=hasattr(args, "interval"))
        except StartError as err:
            return _cannot_start(err)
        try:
            streams = senders.open_streams(outputs, args.force, senders.FORCE_HINT)
        except ValueError as err:   # made meanwhile, or the disk went
            raise UsageError(str(err)) from None
        for stream in streams:
            SESSION.monitor.attach(stream)
        return None

    def _start(self, options: Options, window: float, interval_given: bool) -> None:
        from . import dashboard as live

        monitor = SESSION.monitor
        if monitor is not None and monitor.running and interval_given and options.interval != monitor.interval:
            print(f"nbmon: already sampling every {monitor.interval:g} s; "
                  f"%resmon stop first to change the interval")
        # The record shows at once, before the sampler starts (a helper process
        # takes a few hundred ms); the dashboard's thread re-sends it with the
        # first figures, and builds the widget (plotly may still be
        # importing), which mounts itself into the record.
        monitor, made = SESSION.ensure_monitor(options, start=False)
        dashboard = live.Dashboard(monitor, window_s=window, cells=self.cells, build=False, start=False)
        handle = display(dashboard, display_id=True)
        picture = display(dashboard.picture(), display_id=True)   # the timeline: an output of its own
        # A terminal prints every display update anew, from whichever thread
        # sends it: there the record is shown once, and replaced at stop only.
        if getattr(self.shell, "kernel", None) is not None:
            dashboard.handle, dashboard.picture_handle = handle, picture
        self._push_bundle()
        if made:
            warmed_up()   # %load_ext and %resmon in one cell: the run starts after nbmon's own imports
            monitor.start()
        dashboard.start()
        if not self.dashboards:
            self.shell.events.register("pre_run_cell", self._cell_started)
            self.shell.events.register("post_run_cell", self._cell_finished)
        self.dashboards.append((dashboard, handle, picture))

    def _cell_started(self, info) -> None:
        monitor = SESSION.monitor
        if monitor is None:
            return
        from .dashboard import keep_cells

        now = monitor.clock()
        keep_cells(self.cells, now, max(d.window_s for d, *_ in self.dashboards))
        self.cells.append({"id": uuid.uuid4().hex[:12], "n": self.shell.execution_count,
                           "label": kernel_watch.first_line(info.raw_cell), "t0": now, "t1": None})

    def _cell_finished(self, result) -> None:
        monitor = SESSION.monitor
        if self.cells and self.cells[-1]["t1"] is None and monitor is not None:
            cell = self.cells[-1]
            cell["t1"] = monitor.clock()
            cell["n"] = result.execution_count if result.execution_count is not None else cell["n"]
            labelled = [r for r in SESSION.records[-1:] if r.label and r.t_open >= cell["t0"]]
            if labelled:
                cell["label"] = labelled[0].label
        for dashboard, *_ in self.dashboards:
            dashboard.cell_ended()

    def stop(self) -> None:
        """Stop monitoring; each dashboard is replaced by its static record."""
        self._auto("off", quiet=True)
        summary = SESSION.stop()
        self._unwatch_cluster()
        for dashboard, handle, picture in self.dashboards:
            # close(), not just freeze(): the static record replaces the chart,
            # and an open widget would stay in ipywidgets' registry for good.
            final = dashboard.close()
            if handle is not None:
                handle.update(final.table())
                picture.update(final.picture())
        if self.dashboards:
            self.shell.events.unregister("pre_run_cell", self._cell_started)
            self.shell.events.unregister("post_run_cell", self._cell_finished)
        self.dashboards.clear()
        self.cells.clear()
        if summary is not None:
            display(summary)

    # -- a Dask cluster (nbmon.dask) -------------------------------------
    def _watch_cluster(self, name: str, options: Options, window: float) -> None:
        try:
            watch = nbmon_dask.watch(nbmon_dask.client_named(self.shell.user_ns, name), options)
        except (ValueError, RuntimeError, ImportError) as err:
            raise UsageError(str(err)) from None
        from .cluster import ClusterView

        watch.ready()
        view = ClusterView(watch, window_s=window, start=False)
        view.handle = display(view, display_id=True)
        view.picture_handle = display(view.picture(), display_id=True)   # the timeline: an output of its own
        self._push_bundle()
        self.cluster_views.append(view)
        view.start()

    def _push_bundle(self) -> None:
        """In a kernel, plotly's bundle to the page now: it imports it (~1 s)
        while the run starts and the chart is built."""
        if getattr(self.shell, "kernel", None) is not None:
            from .live import push_bundle

            push_bundle()

    def _unwatch_cluster(self) -> None:
        left = nbmon_dask.unwatch()
        for view in self.cluster_views:
            final = view.close()
            view.handle.update(final.table())
            view.picture_handle.update(final.picture())
        self.cluster_views.clear()
        for worker, threads in left.items():
            print(printable(f"nbmon: still running on worker {worker}: {', '.join(threads)}"))

    def status(self) -> str:
        monitor = SESSION.monitor
        if monitor is None:
            return "nbmon: not started (%resmon to start)"
        lines = [f"nbmon: {'running' if monitor.running else 'stopped'}, every {monitor.interval:g} s, "
                 f"{monitor.store.seq if monitor.store is not None else 0} samples, pid {monitor.pid}",
                 f"peaks: {monitor.peaks}",
                 f"GPU: {monitor.gpu_state}",
                 f"auto: {'on' if self.auto_threshold_s is not None else 'off'}",
                 f"cells in history: {len(SESSION.records)}"]
        for fault in monitor.faults.values():   # errors in their own words: from anywhere
            lines.append(printable(f"fault: {fault.source} failed {fault.count} time(s), first: {fault.first_error}"))
        return "\n".join(lines)

    # -- cell magic ------------------------------------------------------
    def _run_cell(self, cell: str, options: Options, args):
        from .meter import Meter, MeterFeed

        shell = self.shell
        number = _prompt_number(shell)
        record = handle = None
        try:
            with SESSION.cell(options, label=args.label, execution_count=number,
                              keep_running=self.auto_threshold_s is not None) as record, \
                    nbmon_dask.cell(record):
                feed = None
                if not args.quiet:
                    meter = Meter(label=args.label or f"cell {number}")
                    handle = display(meter, display_id=True)
                    feed = MeterFeed(meter, SESSION.monitor)
                try:
                    value = self._run_users_cell(cell, number)
                except BaseException as err:
                    record.ended_with(err)   # before the Dask hook's exit copies the status
                    raise
                finally:
                    if feed is not None:
                        feed.finish("done" if record.status == "ok" else record.status)
                        feed.meter.close()
        except StartError as err:
            if record is not None:   # the cell's own
                raise
            _cannot_start(err)
        finally:
            # Shown on failure too; the exception then propagates unchanged.
            if record is not None and record.summary is not None:
                self._show_cell(record, handle, args.quiet)
        if record is None:   # no monitor could start: the cell runs all the same, unwatched
            value = self._run_users_cell(cell, number)
            return None if args.output else value
        return record.summary if args.output else value

    def _show_cell(self, record, handle, quiet) -> None:
        if quiet:
            return
        shown = cell_record(record, SESSION.monitor)
        table = dataclasses.replace(shown, html=shown.html + nbmon_dask.cell_html(record)).table()
        if handle is not None:
            handle.update(table)  # the static record replaces the live meter in the saved notebook
        else:
            display(table)
        if shown.timeline is not None:
            display(shown.picture())

    def _run_users_cell(self, cell: str, number: int):
        """:meth:`_execute`; what the cell raises is shown from its own frames on."""
        try:
            return self._execute(cell, number)
        except BaseException as err:
            if not isinstance(err, KeyboardInterrupt):
                _user_traceback(self.shell, err)
            raise

    def _execute(self, cell: str, number: int):
        """Run the cell in the user namespace; return its last expression's value."""
        shell = self.shell
        # Registered with the compiler's line cache so that tracebacks show the cell's own
        # lines ("Cell In[n]", n its prompt number), not a bare "<resmon-cell>"; the leading
        # newline stands for the %%resmon line, so line numbers match the notebook cell.
        source = "\n" + shell.transform_cell(cell)
        filename = shell.compile.cache(source, number)
        tree = shell.compile.ast_parse(source, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        ns = shell.user_ns
        exec(shell.compile(tree, filename, "exec"), ns)
        if last is not None:
            return eval(shell.compile(ast.Expression(last.value), filename, "eval"), ns)
        return None

    # -- auto mode -------------------------------------------------------
    def _auto(self, value: str | None, threshold: float = 1.0, options: Options | None = None,
              quiet: bool = False) -> None:
        events = self.shell.events
        if value == "on":
            try:
                _, started = SESSION.ensure_monitor(options)
            except StartError as err:
                return _cannot_start(err)
            if self.auto_threshold_s is None:
                events.register("pre_run_cell", self._pre_run_cell)
                events.register("post_run_cell", self._post_run_cell)
            self.auto_threshold_s = threshold
            self._auto_started_monitor = self._auto_started_monitor or started
            if not quiet:
                print(f"nbmon: auto on, summarising cells longer than {threshold:g} s")
        elif value == "off":
            if self.auto_threshold_s is not None:
                events.unregister("pre_run_cell", self._pre_run_cell)
                events.unregister("post_run_cell", self._post_run_cell)
                self.auto_threshold_s = None
                if self._auto_cell is not None:
                    # This cell's post_run hook is gone: close its span here, or it stays open for good.
                    cell, self._auto_cell = self._auto_cell, None
                    cell.__exit__(None, None, None)
                if self._auto_started_monitor and not self.dashboards:
                    SESSION.stop()  # auto on started it, nothing else shows it
                self._auto_started_monitor = False
                if not quiet:
                    print("nbmon: auto off")
        elif value is None:
            raise UsageError("%resmon auto needs on or off")
        else:
            raise UsageError(f"%resmon auto takes on or off, got {value!r}")

    def _pre_run_cell(self, info) -> None:
        if info.raw_cell.lstrip().startswith("%%resmon"):
            self._auto_cell = None  # the cell magic summarises it already
            return
        # Cells shorter than the threshold are neither shown nor kept in the history.
        self._auto_cell = SESSION.cell(execution_count=self.shell.execution_count, keep_running=True,
                                       min_duration_s=self.auto_threshold_s or 0.0)
        try:
            self._auto_record = self._auto_cell.__enter__()
        except StartError as err:   # (its monitor had stopped)
            self._auto_cell = None
            _cannot_start(err)

    def _post_run_cell(self, result) -> None:
        if self._auto_cell is None:
            return
        cell, record = self._auto_cell, self._auto_record
        self._auto_cell = None
        record.ended_with(result.error_in_exec or result.error_before_exec)
        if result.execution_count is not None:
            record.execution_count = result.execution_count
        cell.__exit__(None, None, None)
        summary = record.summary
        if summary.duration_sec >= (self.auto_threshold_s or 0.0) and not math.isnan(summary.duration_sec):
            display(HTML(f'<div class="nbmon-oneline" style="font:12px system-ui;'
                         f'color:var(--jp-ui-font-color2, #555)">{one_line(record)}</div>'))

    def close(self) -> None:
        self._auto("off", quiet=True)
        if (SESSION.monitor is not None and SESSION.monitor.running) or self.dashboards or self.cluster_views:
            self.stop()


_loaded: dict[int, ResmonMagics] = {}


def load(ipython) -> None:
    if id(ipython) in _loaded:
        return
    magics = ResmonMagics(ipython)
    ipython.register_magics(magics)
    _loaded[id(ipython)] = magics
    kernel_watch.install(ipython, display)  # the post-mortem of this notebook's last kernel, if it died
    # The first plotly FigureWidget costs imports (~0.2 s): paid now, in the
    # background, not when %resmon is typed; and before the next cell runs,
    # so that nbmon's start-up is in no cell's figures (nor slows one down).
    from . import dashboard

    if not dashboard.ready():
        _warming.append(threading.Thread(target=_warm, args=(dashboard,), name="nbmon-warmup", daemon=True))
        _warming[-1].start()

        def warmed(info=None) -> None:
            # %resmon shows its record at once and waits itself, before its run starts
            if not _RESMON_START.match(getattr(info, "raw_cell", "") or ""):
                warmed_up()
            ipython.events.unregister("pre_run_cell", warmed)

        ipython.events.register("pre_run_cell", warmed)


_warming: list[threading.Thread] = []   # the warm-up started by load(), while it may run
_RESMON_START = re.compile(r"\s*%resmon(\s+start\b|\s+-|\s*$)", re.M)
WARM_WAIT_S = 30.0   # a cell waits at most this long for it (an import that hangs never hangs a cell)


def warmed_up() -> None:
    """Wait (bounded) until the warm-up has ended."""
    while _warming:
        _warming[0].join(WARM_WAIT_S)
        _warming.pop(0)


def _warm(dashboard) -> None:
    try:
        dashboard.warm()
    except Exception:  # %resmon will say why, on the main thread
        pass


def unload(ipython) -> None:
    magics = _loaded.pop(id(ipython), None)
    if magics is not None:
        magics.close()
        kernel_watch.uninstall(ipython)
        ipython.magics_manager.magics["line"].pop("resmon", None)
        ipython.magics_manager.magics["cell"].pop("resmon", None)
