"""``%resmon`` / ``%%resmon``: the IPython face of nbmon.

The only module that imports IPython. It drives the session's host
(:mod:`nbmon.kernel.session`: in a helper process by default) in plain
data, and displays what it answers: mimebundles, by display id where the
host updates them later.
"""
from __future__ import annotations

import argparse
import ast
import collections
import functools
import hashlib
import io
import itertools
import math
import os
import sys
import threading
import time
import tokenize
import traceback
from typing import NamedTuple

import IPython
from IPython.core.error import UsageError
from IPython.core.inputtransformer2 import leading_indent
from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display, update_display

from .. import options as opts
from ..sinks import senders
from ..format import printable
from ..options import DEFAULT_WINDOW_S, MAGIC, Options, check_interval
from ..report.summary import ResourceSummary
from ..launch import resident_mb
from . import guard
from .session import SESSION, options_dict

SUBCOMMANDS = ("start", "stop", "status", "summary", "auto", "kernels")
LABEL_CHARS = 60


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


# IPython 9.8 advances the shell's count before ``pre_run_cell`` (it did so
# after the cell before); 9.8's run_cell_async is where it changed.
_COUNT_AHEAD_IN_PRE_RUN = IPython.version_info >= (9, 8)


def prompt_number(shell, cell: ExecutionInfo | ExecutionResult | None = None) -> int | None:
    """The prompt number of the running cell ("In [n]"): the one every hook,
    record and band uses. ``cell`` is what IPython gave the hook:
    ``pre_run_cell``'s ExecutionInfo, ``post_run_cell``'s ExecutionResult
    (which knows it; None for a cell kept out of the history). Without one,
    from inside a cell's code: IPython's result of the running cell, else
    the shell's count."""
    if isinstance(cell, ExecutionResult):
        return cell.execution_count
    count = shell.execution_count
    if isinstance(cell, ExecutionInfo):
        advanced = _COUNT_AHEAD_IN_PRE_RUN and cell.store_history and not cell.silent
        return count - 1 if advanced else count
    result = getattr(shell.displayhook, "exec_result", None)
    number = getattr(result, "execution_count", None)
    return number if number is not None else count


def _post_run_follows(shell) -> bool:
    """Whether IPython runs ``post_run_cell`` after the code running now: a
    cell's (not a silent one's, nor a direct ``run_cell_magic`` call's)."""
    result = getattr(shell.displayhook, "exec_result", None)
    return result is not None and not getattr(getattr(result, "info", None), "silent", True)


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


class _ShownFailure(Exception):
    """The cell failed and its error is shown already: the magic returns."""


def _show_syntax_error(shell, err: SyntaxError, cell_file: str) -> bool:
    """Show ``err`` as IPython shows a cell's SyntaxError (its showtraceback
    reads no ``_render_traceback_`` for one, and would list the magic's call):
    from the cell's own frames on, none for one in the cell's text; the cell
    is marked failed as IPython marks it. False outside a cell's run."""
    result = getattr(shell.displayhook, "exec_result", None)
    if result is None:
        return False
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != cell_file:
        tb = tb.tb_next
    stb = shell.SyntaxTB.structured_traceback(type(err), err, traceback.extract_tb(tb))
    sys.last_type, sys.last_value, sys.last_traceback = type(err), err, tb
    shell._showtraceback(type(err), err, stb)   # what showsyntaxerror ends with
    result.error_in_exec = err
    return True


def _hidden_by_semicolon(source: str, last: ast.stmt) -> bool:
    """Whether a ';' follows the cell's last statement ``last`` (comments and
    blank lines aside): only what follows it is read, however long the cell."""
    lines = source.splitlines(keepends=True)
    end = lines[last.end_lineno - 1].encode()[last.end_col_offset:].decode()   # offsets count UTF-8 bytes
    after = end.lstrip(" \t") + "".join(lines[last.end_lineno:])   # no indent to read
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(after).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    ignored = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    return next((t.string for t in tokens if t.type not in ignored), None) == ";"


def _unquote(text: str) -> str:
    # parse_argstring splits non-POSIX style and keeps quotes: --label "a b" arrives as '"a b"'.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _from_table(calls):
    """A decorator giving a magic the ``add_argument`` calls of a table
    (nbmon.options's, nbmon.sinks.senders's), in order."""
    def decorate(func):
        for args, kwargs in reversed(calls):
            func = argument(*args, **kwargs)(func)
        return func
    return decorate


def _only(flags: list[str], where: str) -> None:
    """Refuse ``flags`` given where they do not apply."""
    if flags:
        raise UsageError(f"{', '.join(flags)} only appl{'ies' if len(flags) == 1 else 'y'} to {where}")


def first_line(source: str, chars: int | None = LABEL_CHARS) -> str:
    """A cell's label: its first line that is not blank, at most ``chars`` long (None: whole)."""
    return next((line.strip() for line in (source or "").splitlines() if line.strip()), "")[:chars]


def source_digest(source: str) -> str:
    """A cell's source as the memory guard remembers it (the same text, the same digest)."""
    return hashlib.blake2b(source.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


class _ClusterMirror:
    """A Dask watch's events passed on to the session's host, which draws its
    live view (:meth:`nbmon.helper.host.SessionHost.cluster_begin`)."""

    def begin(self, watch) -> None:
        collector = watch.collector
        SESSION.host.cluster_begin(watch.key.hex(), collector.t0, collector.expected, collector.max_bytes,
                                   watch.every_s)

    def event(self, msg, arrived: float) -> None:
        from ..dask.wire import as_text

        envelope = as_text(msg)
        if envelope is not None:   # what is no envelope the kernel's collector refuses, and counts
            SESSION.notify("cluster_event", envelope, arrived)


def _show(bundle: dict, display_id: str | bool | None = None):
    """Display a host's mimebundle (with ``display_id``: one a later update replaces)."""
    return display(bundle["data"], raw=True, metadata=bundle["metadata"], display_id=display_id)


def _show_finals(views: list[dict]) -> None:
    """Each stopped live view's final outputs (its static record) in place of its live ones, by display id."""
    for view in views:
        for bundle, display_id in zip((view["table"], view["picture"]), view["ids"]):
            update_display(bundle["data"], raw=True, metadata=bundle["metadata"], display_id=display_id)


# The place of a record's timeline, kept while the cell's end is measured: empty.
PENDING = {"data": {"text/plain": "", "text/html": ""}, "metadata": {}}


class _Outlet:
    """What the session's host sends on its own, shown here: a display
    updated by its id, a line in the running cell (ipykernel sends a
    thread's output to the cell that runs now; stderr, so that it reads as a
    warning).

    A cell's meter is shown from the host's thread and replaced by its
    record from the cell's: whichever comes first, the record stays (a
    meter still on its way when its record is shown is dropped)."""

    ENDED_KEPT = 64   # meters ended before they showed: a bounded memory of them

    def __init__(self):
        self._lock = threading.Lock()
        self._shown: set[str] = set()
        self._ended: collections.deque[str] = collections.deque(maxlen=self.ENDED_KEPT)

    def update(self, display_id: str, bundle: dict) -> None:
        update_display(bundle["data"], raw=True, metadata=bundle["metadata"], display_id=display_id)

    def show(self, display_id: str, bundle: dict) -> None:
        with self._lock:
            if display_id in self._ended:
                self._ended.remove(display_id)
                return
            _show(bundle, display_id)
            self._shown.add(display_id)

    def showing(self, display_id: str | None) -> bool:
        """Whether the display ``display_id`` is shown (not on its way, not replaced)."""
        with self._lock:
            return display_id in self._shown

    def replace(self, display_id: str, bundle: dict) -> None:
        """Show ``bundle`` in place of the display ``display_id`` the host
        showed or is showing (its own output if that one never shows)."""
        with self._lock:
            if display_id in self._shown:
                self._shown.discard(display_id)
                update_display(bundle["data"], raw=True, display_id=display_id)
                return
            self._ended.append(display_id)
        _show(bundle)

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def stop_cell(self, number: int | None, text: str) -> None:
        guard.stop(number, text)


def _own_chart_output() -> bool:
    """Whether the live chart needs an output of its own: a front end that
    renders each output in its own frame, with a widget manager that makes
    models only for widget-view outputs (Colab; elsewhere
    NBMON_CHART_OUTPUT=widget asks for it)."""
    return "google.colab" in sys.modules or os.environ.get("NBMON_CHART_OUTPUT") == "widget"


def _cell_options_only(args, streamed: list[str]) -> None:
    """UsageError unless a ``%%resmon`` line gives options only (no subcommand, no file to stream to)."""
    if args.subcommand != "start" or args.value:
        raise UsageError(f"%%resmon takes options only, not {args.subcommand!r}")
    _only(streamed, "%resmon start")


def _said(err: Exception) -> None:
    """An nbmon error never reaches the user's cell: one line, and the cell runs on."""
    text = str(err)
    print(printable(text if text.startswith("nbmon") else f"nbmon: {text}"), file=sys.stderr, flush=True)


def _is_resmon_cell(source: str) -> bool:
    """Whether the cell is a ``%%resmon`` cell: the magic opens (and sends) its notes, not auto mode."""
    return source.lstrip().startswith("%%resmon")


@magics_class
class ResmonMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.auto_threshold_s: float | None = None
        self._noted: _NotedCell | None = None   # the cell the hooks watch now
        self._quiet_line: tuple | None = None   # (its first line, parsed) as transformed, for pre_run_cell
        self._tokens = itertools.count()      # the kernel's names for cells it opens by a note
        self._monitor_known = False           # a cell's answer said the monitor runs: quiet cells need no answer
        self._closing: tuple | None = None   # a %%resmon cell's close, for its post_run_cell

    @magic_arguments()
    @argument("subcommand", nargs="?", default="start",
              help="line magic: start (default), stop, status, summary, kernels, or auto on|off")
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
        %resmon kernels   every Jupyter kernel of yours on this host, live: memory, CPU, GPU, state
        %%resmon          run the cell and show its ResourceSummary
        """
        args, options = _parsed(line)
        where = getattr(args, "session", None)   # given: the session runs there
        outputs = {name: _unquote(path) for name, path in senders.outputs_given(args, MAGIC).items()}
        streamed = [senders.SINKS[name].flag for name in outputs]
        if cell is not None:
            _cell_options_only(args, streamed)
            self._say_guard_kept(args, options)
            try:
                return self._run_cell(cell, options, where, args)
            except _ShownFailure:
                return None
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
            return self._auto(args.value, _seconds(args.threshold, "--threshold", 1.0, zero_ok=True),
                              options, where)
        if args.value:
            raise UsageError(f"%resmon {args.subcommand} takes no value, got {args.value!r}")
        if args.subcommand == "start":
            return self._start_line(args, options, where, outputs)
        if args.subcommand == "stop":
            return self.stop()
        if args.subcommand == "status":
            print(self.status())
            return None
        if args.subcommand == "kernels":
            return self._kernels(where)
        try:
            got = SESSION.host.summary() if SESSION.host is not None else None
        except Exception as err:  # noqa: BLE001
            _said(err)
            return None
        return ResourceSummary.from_dict(got) if got is not None else None

    # -- line magic ------------------------------------------------------
    def _start_line(self, args, options: Options, where: str | None, outputs: dict[str, str]) -> None:
        """``%resmon [start]``: the live chart of the kernel's monitor (or of
        a Dask cluster), every sample streamed to ``outputs``."""
        window = _seconds(args.window, "--window", DEFAULT_WINDOW_S)
        if window < options.interval:
            raise UsageError(f"--window ({window:g} s) must be at least --interval ({options.interval:g} s)")
        if args.dask:
            _only([senders.SINKS[name].flag for name in outputs], "the kernel's monitor, not to --dask")
            return self._watch_cluster(args.dask, options, window, where)
        try:
            senders.check_outputs(outputs, args.force, senders.FORCE_HINT)   # refused before anything starts
        except ValueError as err:
            raise UsageError(str(err)) from None
        outputs = senders.anchored(outputs)   # the kernel's cwd, not the host's
        try:
            host = SESSION.host_for(where)
            info = host.info()
            if info["running"] and hasattr(args, "interval") and options.interval != info["interval"]:
                print(f"nbmon: already sampling every {info['interval']:g} s; "
                      f"%resmon stop first to change the interval")
            if info["running"] and hasattr(args, "variables") and options.variables != info["variables"]:
                print(f"nbmon: already running with the variables {'' if info['variables'] else 'not '}sized; "
                      f"%resmon stop first to change it")
            # The record shows at once, before the sampler starts (its first
            # figures and the chart follow from the host).
            view = host.view_open(options_dict(options), window, own_output=_own_chart_output())
            SESSION.sizes.watch(view["variables"])
            for key, display_id in zip(("table", "picture", "chart"), view["ids"]):
                _show(view[key], display_id)
            host.view_start()
            if outputs:
                host.start(options_dict(options), outputs, args.force)
        except Exception as err:  # noqa: BLE001 - HostError, or the streams' refusal
            _said(err)

    def _kernels(self, where: str | None) -> None:
        """``%resmon kernels``: the table of every kernel of this user, live where the page has widgets."""
        try:
            got = SESSION.host_for(where).kernels_view()
        except Exception as err:  # noqa: BLE001 - HostError
            _said(err)
            return
        _show(got["record"], got["id"])

    def stop(self, summary: bool = True) -> None:
        """Stop monitoring; each dashboard is replaced by its static record,
        and the run's summary is shown (unless not ``summary``)."""
        self._monitor_known = False
        self._auto("off", quiet=True)
        self._unwatch_cluster()
        if SESSION.host is None:
            return
        SESSION.sizes.watch(False)
        try:
            got = SESSION.host.stop()
        except Exception as err:  # noqa: BLE001
            _said(err)
            return
        _show_finals(got["views"])
        if summary and got["summary"] is not None:
            _show(got["summary"])

    # -- the cells, for the host: the black box names the running one, the
    # dashboards band it, the monitor samples at its pace while it runs ----
    def _cell_started(self, info) -> None:
        if SESSION.host is None:
            return
        SESSION.hold_notes()   # its notes in one write: a %%resmon cell's with its open, in the magic
        magic_follows = False
        try:
            magic_follows = self._start_cell(info)
        finally:
            if not magic_follows:
                SESSION.release_notes()

    def _start_cell(self, info) -> bool:
        """The cell's start told to the host; whether the ``%%resmon`` magic follows (it sends the notes held)."""
        source = info.raw_cell or ""
        number = prompt_number(self.shell, info)
        guard.cell_runs(number)
        quiet, self._quiet_line = self._quiet_line, None
        stripped = quiet is not None and quiet[0].strip() == first_line(source, None)
        SESSION.notify("cell_started", number, first_line(source), source_digest(source))
        if self._noted is not None:
            pass   # a run_cell inside the cell (%%capture's) is part of it
        elif stripped:
            args, options = quiet[1]
            self._say_guard_kept(args, options)
            self._open_noted(info, number, None, options, args.label)
        elif self.auto_threshold_s is not None and not _is_resmon_cell(source):
            # Cells shorter than the threshold are neither shown nor kept in the history; the
            # kernel waits for no answer at either end of one (only a longer one's line).
            self._open_noted(info, number, self.auto_threshold_s)
        SESSION.sizes.cell_started(self.shell)
        return _is_resmon_cell(source) and not stripped

    def _say_guard_kept(self, args, options: Options) -> None:
        """A cell's ``--memory-guard off`` joins auto mode's running monitor, whose guard stays on."""
        if self.auto_threshold_s is not None and hasattr(args, "memory_guard_percent") \
                and options.memory_guard_percent is None:
            print("nbmon: --memory-guard off does not apply: auto mode's monitor is already running with its "
                  "memory guard (%resmon auto off first)")

    def _open_noted(self, info, number: int | None, line_after_s: float | None, options: Options | None = None,
                    label: str = "") -> None:
        token = f"{'cell' if line_after_s is None else 'auto'}-{next(self._tokens)}"
        try:
            SESSION.notify("cell_open_note", token, number, line_after_s or 0.0, resident_mb(),
                           options_dict(options), label)
        except Exception as err:  # noqa: BLE001
            _said(err)
        else:
            self._noted = _NotedCell(token, info, line_after_s, time.perf_counter())

    def _strip_quiet_line(self, lines: list[str]) -> list[str]:
        """An input transformer (IPython's first, cleanup stage, which runs
        before pre_run_cell): a quiet ``%%resmon`` cell that would open and
        close by notes (:meth:`_quiet_note`) runs as the cell it wraps,
        watched from the cell hooks as auto mode watches: IPython's own path
        for its outputs and its errors, at auto mode's cost, not a cell
        magic's. Its line is left blank, so that line numbers keep."""
        if not lines or not lines[0].startswith("%%resmon"):
            return lines
        head = lines[0].split(None, 1)
        self._quiet_line = None
        try:
            parsed = _quiet_line_parsed(head[1] if len(head) > 1 else "") if head[0] == "%%resmon" else None
            if parsed is None or not self._quiet_note(parsed[0], getattr(parsed[0], "session", None)):
                return lines
        except Exception:  # noqa: BLE001 - the magic runs, and says what is wrong
            return lines
        self._quiet_line = (lines[0], parsed)
        body = leading_indent(lines[1:])   # what IPython's cleanup does to a cell, to the one wrapped
        return body if body and body[0].startswith("%%") else ["\n", *body]   # a cell magic's line stays first

    _strip_quiet_line.has_side_effects = True   # IPython's check_complete leaves it out

    def _close_pending(self) -> None:
        if self._closing is not None:
            closing, self._closing = self._closing, None
            self._close_cell(*closing)

    def _cell_finished(self, result) -> None:
        SESSION.hold_notes()   # its notes in one write
        try:
            self._finish_cell(result)
        finally:
            SESSION.release_notes()

    def _finish_cell(self, result) -> None:
        self._close_pending()
        if SESSION.host is None:
            return
        variables = SESSION.sizes.cell_ended(self.shell)   # None if the cell's own %%resmon sent them
        SESSION.sizes.cell_finished()
        noted = self._noted
        if noted is not None and getattr(result, "info", None) is noted.info:
            self._noted = None
            error = result.error_in_exec or result.error_before_exec
            status = "ok" if error is None else "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            number = prompt_number(self.shell, result)
            try:
                if noted.line_after_s is None or time.perf_counter() - noted.t0 < noted.line_after_s:
                    SESSION.notify("cell_close_note", noted.token, status, number, variables)
                    closed = {}
                else:
                    closed = SESSION.host.cell_close(noted.token, status, show="line", number=number, variables=variables)
            except Exception as err:  # noqa: BLE001
                _said(err)
            else:
                variables = None   # the cell's close brought them
                if closed.get("line"):
                    display({"text/html": f'<div class="nbmon-oneline" style="font:12px system-ui;'
                                          f'color:var(--jp-ui-font-color2, #555)">{_escape(closed["line"])}</div>',
                             "text/plain": closed["line"], **closed["data"]}, raw=True)
        SESSION.notify("cell_finished", prompt_number(self.shell, result), variables)

    # -- a Dask cluster (nbmon.dask) -------------------------------------
    def _watch_cluster(self, name: str, options: Options, window: float, where: str | None) -> None:
        """Watch a Dask cluster through the notebook's client (here); its live view is the session's host's."""
        from .. import dask as nbmon_dask

        try:
            host = SESSION.host_for(where)
            watch = nbmon_dask.watch(nbmon_dask.client_named(self.shell.user_ns, name), options,
                                     mirror=_ClusterMirror())
        except (ValueError, RuntimeError, ImportError) as err:
            raise UsageError(str(err)) from None
        watch.ready()
        try:
            view = host.cluster_view(window)
            for key, display_id in zip(("table", "picture"), view["ids"]):
                _show(view[key], display_id)
            host.cluster_view_start()
        except Exception as err:  # noqa: BLE001 - HostError: the watch runs on, without its view
            _said(err)

    def _unwatch_cluster(self) -> None:
        nbmon_dask = sys.modules.get("nbmon.dask")
        if nbmon_dask is None:
            return
        left = nbmon_dask.unwatch()
        try:
            got = SESSION.host.cluster_end() if SESSION.host is not None else {"views": []}
        except Exception as err:  # noqa: BLE001
            _said(err)
        else:
            _show_finals(got["views"])
        for worker, threads in left.items():
            print(printable(f"nbmon: still running on worker {worker}: {', '.join(threads)}"))

    def status(self) -> str:
        if SESSION.host is None:
            return "nbmon: not started (%resmon to start)"
        try:
            return printable(SESSION.host.status(self.auto_threshold_s is not None))
        except Exception as err:  # noqa: BLE001
            return printable(f"nbmon: {err}")

    # -- cell magic ------------------------------------------------------
    def _run_cell(self, cell: str, options: Options, where: str | None, args):
        shell = self.shell
        self._close_pending()   # a cell that runs the magic more than once
        number = prompt_number(shell)
        try:
            noted = self._quiet_note(args, where)
            # A quiet cell's notes start nothing: no host_for(), which checks for room to start one.
            host = SESSION.host if noted else SESSION.host_for(where)
            if noted:
                opened = {"token": f"cell-{next(self._tokens)}", "meter_id": None, "start_time": time.time(),
                          "t_open": math.nan, "noted": True}
                SESSION.notify("cell_open_note", opened["token"], number, 0.0, resident_mb(), options_dict(options),
                               args.label)
            else:
                opened = host.cell_open(options_dict(options), label=args.label, number=number,
                                        meter=not args.quiet)
                self._monitor_known = True
                SESSION.sizes.watch(opened["variables"])
        except Exception as err:  # noqa: BLE001 - the cell runs unmonitored
            SESSION.release_notes()
            _said(err)
            value = self._run_users_cell(cell, number)
            return None if args.output else value
        SESSION.release_notes()   # the cell's start and its open, in one write
        SESSION.sizes.ready(shell)   # what the cell changes: the namespace before it, if not known
        dask_cell, record = _dask_cell(opened, args.label, number)
        status, summary = "ok", None
        try:
            with dask_cell:
                try:
                    value = self._run_users_cell(cell, number)
                except BaseException as err:
                    status = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
                    if record is not None:
                        record.ended_with(err)   # before the Dask hook's exit copies the status
                    raise
        finally:
            # Shown on failure too; the exception then propagates unchanged. What IPython
            # runs after the cell's code (post_execute: matplotlib's inline figures) is
            # the cell's too: in a cell, its record closes in post_run_cell (-o needs it now).
            if args.output or not _post_run_follows(shell):
                summary = self._close_cell(host, opened, status, args, record)
            else:
                # Its meter (shown) becomes the record's table there; the timeline's place
                # is kept beside it, before the cell's value that IPython shows next (empty,
                # no taller than nothing, if the record is a line).
                shown = not args.quiet and SESSION.outlet.showing(opened["meter_id"])
                slot = _show(PENDING, display_id=True).display_id if shown else None
                self._closing = (host, opened, status, args, record, slot)
        return summary if args.output else value

    def _quiet_note(self, args, where: str | None) -> bool:
        """Whether a ``%%resmon`` cell opens and closes by notes, the kernel
        waiting for no answer: a quiet one (nothing shown, nothing returned,
        no Dask cluster watched) once an answer said the monitor runs in a
        helper that still answers."""
        nbmon_dask = sys.modules.get("nbmon.dask")
        return (args.quiet and not args.output and where is None and self._monitor_known and SESSION.remote
                and not SESSION.host.gone and (nbmon_dask is None or nbmon_dask.watching() is None))

    def _close_cell(self, host, opened: dict, status: str, args, record, slot: str | None = None):
        """The cell's end: its record shown (in place of its meter, if one
        showed), its summary returned for ``-o``."""
        extra = ""
        if record is not None:
            from ..dask import cell_html

            extra = cell_html(record)
        show = "record" if not args.quiet else "summary" if args.output else ""
        variables = SESSION.sizes.cell_ended(self.shell)
        if opened.get("noted"):
            try:
                SESSION.notify("cell_close_note", opened["token"], status, None, variables)
            except Exception as err:  # noqa: BLE001
                _said(err)
            return None
        try:
            closed = host.cell_close(opened["token"], status, show=show, extra_html=extra, variables=variables)
        except Exception as err:  # noqa: BLE001
            _said(err)
            return None
        if show == "record":
            if closed["meter_shown"]:   # the record replaces the live meter
                SESSION.outlet.replace(opened["meter_id"], closed["table"])
            else:
                _show(closed["table"])
            picture = closed.get("picture")
            if picture is not None and slot is not None:
                update_display(picture["data"], raw=True, metadata=picture["metadata"], display_id=slot)
            elif picture is not None:
                _show(picture)
        return ResourceSummary.from_dict(closed["summary"]) if "summary" in closed else None

    def _run_users_cell(self, cell: str, number: int):
        """:meth:`_execute`; what the cell raises is shown from its own frames
        on (a SyntaxError here, then :class:`_ShownFailure`)."""
        shell = self.shell
        # Registered with the compiler's line cache so that tracebacks show the cell's own
        # lines ("Cell In[n]", n its prompt number), not a bare "<resmon-cell>"; the leading
        # newline stands for the %%resmon line, so line numbers match the notebook cell.
        source = "\n" + shell.transform_cell(cell)
        filename = shell.compile.cache(source, number)
        try:
            return self._execute(source, filename)
        except SyntaxError as err:
            if _show_syntax_error(shell, err, filename):
                raise _ShownFailure from err
            raise
        except BaseException as err:
            if not isinstance(err, KeyboardInterrupt):
                _user_traceback(shell, err)
            raise

    def _execute(self, source: str, filename: str):
        """Run the cell's ``source`` in the user namespace; return its last expression's value."""
        shell = self.shell
        tree = shell.compile.ast_parse(source, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        ns = shell.user_ns
        exec(shell.compile(tree, filename, "exec"), ns)
        if last is None:
            return None
        value = eval(shell.compile(ast.Expression(last.value), filename, "eval"), ns)
        # A trailing ';' hides the value, and keeps it out of Out and _, as IPython does.
        return None if _hidden_by_semicolon(source, last) else value

    # -- auto mode -------------------------------------------------------
    def _auto(self, value: str | None, threshold: float = 1.0, options: Options | None = None,
              where: str | None = None, quiet: bool = False) -> None:
        if value == "on":
            self.auto_threshold_s = threshold
            try:
                SESSION.sizes.watch(SESSION.host_for(where).start(options_dict(options), owner="auto")["variables"])
            except Exception as err:  # noqa: BLE001
                self.auto_threshold_s = None
                _said(err)
                return
            if not quiet:
                print(f"nbmon: auto on, summarising cells longer than {threshold:g} s")
        elif value == "off":
            if self.auto_threshold_s is not None:
                self.auto_threshold_s = None
                noted = self._noted
                if noted is not None and noted.line_after_s is not None and SESSION.host is not None:
                    # Its span closes now, before auto mode's monitor stops, not in its post_run hook.
                    self._noted = None
                    try:
                        SESSION.host.cell_close(noted.token)
                    except Exception as err:  # noqa: BLE001
                        _said(err)
                if SESSION.host is not None:
                    try:
                        SESSION.sizes.watch(SESSION.host.stop_auto())
                    except Exception as err:  # noqa: BLE001
                        _said(err)
                if not quiet:
                    print("nbmon: auto off")
        elif value is None:
            raise UsageError("%resmon auto needs on or off")
        else:
            raise UsageError(f"%resmon auto takes on or off, got {value!r}")

    def close(self) -> None:
        self._auto("off", quiet=True)
        self.stop(summary=False)


def _escape(text: str) -> str:
    import html

    return html.escape(text, quote=False)


def _parsed(line: str) -> tuple[argparse.Namespace, Options]:
    """The magic's ``line`` parsed, and the options it gives; UsageError naming what is wrong."""
    args = parse_argstring(ResmonMagics.resmon, line)
    args.label = _unquote(args.label)
    try:
        return args, Options.from_arguments(args)
    except ValueError as err:
        raise UsageError(str(err)) from None


@functools.lru_cache(maxsize=16)   # ipykernel transforms a cell twice; a notebook has few such lines
def _quiet_line_parsed(line: str) -> tuple[argparse.Namespace, Options] | None:
    """A ``%%resmon`` line's :func:`_parsed`, where it asks for a quiet cell
    (nothing shown nor returned) and gives options only; else None. Read, never changed."""
    try:
        args, options = _parsed(line)
        _cell_options_only(args, [senders.SINKS[name].flag for name in senders.outputs_given(args, MAGIC)])
    except UsageError:
        return None
    return (args, options) if args.quiet and not args.output else None


class _NotedCell(NamedTuple):
    """A cell the hooks open and close by notes: auto mode's, or a quiet ``%%resmon`` one."""

    token: str
    info: ExecutionInfo         # pre_run_cell's: the cell's own post_run_cell closes it, not a nested run_cell's
    line_after_s: float | None  # auto mode's threshold: a longer cell shows its line; None: nothing shown
    t0: float                   # time.perf_counter() at its start


class _NoCell:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _dask_cell(opened: dict, label: str, number: int):
    """The cell's spans on every worker of a watched Dask cluster, and the
    kernel's record of it they are kept with (nothing when none is watched)."""
    nbmon_dask = sys.modules.get("nbmon.dask")
    if nbmon_dask is None or nbmon_dask.watching() is None:
        return _NoCell(), None
    from ..report.records import CellRecord

    record = CellRecord(number, label, start_time=opened["start_time"], t_open=opened["t_open"])
    return nbmon_dask.cell(record), record


_loaded: dict[int, ResmonMagics] = {}


def load(ipython) -> None:
    if id(ipython) in _loaded:
        return
    try:
        hello = SESSION.connect(kernel=getattr(ipython, "kernel", None) is not None, outlet=_Outlet())
    except Exception as err:  # noqa: BLE001 - never let nbmon stop the kernel: its magics say why again
        _said(err)
        hello = {"outputs": [], "problem": "", "note": ""}
    magics = ResmonMagics(ipython)
    ipython.register_magics(magics)
    ipython.events.register("pre_run_cell", magics._cell_started)
    ipython.events.register("post_execute", guard.cell_ran)
    ipython.events.register("post_run_cell", magics._cell_finished)
    ipython.input_transformers_cleanup.append(magics._strip_quiet_line)
    _loaded[id(ipython)] = magics
    if SESSION.why_local:
        _said(f"{SESSION.why_local}; the session runs in the kernel")
    if hello["problem"]:
        _said(f"no post-mortem: {hello['problem']}")
    elif hello["note"]:   # the first private place was taken: which one is used
        _said(hello["note"])
    for bundle in hello["outputs"]:   # the post-mortem of this notebook's last kernel, if it died
        _show(bundle)


def unload(ipython) -> None:
    magics = _loaded.pop(id(ipython), None)
    if magics is not None:
        magics.close()
        ipython.events.unregister("pre_run_cell", magics._cell_started)
        ipython.events.unregister("post_execute", guard.cell_ran)
        ipython.events.unregister("post_run_cell", magics._cell_finished)
        ipython.input_transformers_cleanup.remove(magics._strip_quiet_line)
        ipython.magics_manager.magics["line"].pop("resmon", None)
        ipython.magics_manager.magics["cell"].pop("resmon", None)
    if not _loaded:
        SESSION.close()
