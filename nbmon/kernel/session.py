"""The notebook's session as the kernel holds it: a host
(:class:`~nbmon.helper.host.SessionHost`, in a helper process by default,
:mod:`nbmon.kernel.remote`; in the kernel with ``session="kernel"`` or
where no helper can start), the last cell's summary, and what the user
reads: :func:`monitor`, :func:`history` and :func:`samples` (pandas
DataFrames, imported when asked for), :func:`last_summary`.

What the kernel keeps is bounded and small: the host's handle, the last
summary, the cell hooks; the history, the samples and every widget stay
with the host. No IPython here, so scripts can read the history too.
"""
from __future__ import annotations

import dataclasses
import os
import sys

from ..launch import check_room
from ..options import Options
from ..report.summary import ResourceSummary
from .namespace import CellSizes

# Where the session runs by default: a helper process, where one can run.
DEFAULT_SESSION = "helper" if sys.platform.startswith("linux") else "kernel"   # Options.session


def options_dict(options: Options | None) -> dict | None:
    return None if options is None else {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


class Outlet:
    """What a host sends on its own, here without a notebook (a script):
    its lines go to stderr, there are no displays to update (the magics'
    outlet updates them)."""

    def update(self, display_id: str, bundle: dict) -> None:
        pass

    def show(self, display_id: str, bundle: dict) -> None:
        pass

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def stop_cell(self, number: int | None, text: str) -> None:
        pass   # no cells to stop outside a notebook


class Session:
    """``host``: where the session runs (None until :meth:`connect`)."""

    def __init__(self):
        self.host = None
        self.kernel = False     # the outputs are in a kernel's front end (not a terminal)
        self.outlet = Outlet()
        self.why_local = ""     # why the session runs in the kernel, where a helper was wanted
        self.sizes = CellSizes()   # the kernel's variables, sized at the cells' ends while a monitor asks

    @property
    def remote(self) -> bool:
        return getattr(self.host, "REMOTE", False)

    def connect(self, *, kernel: bool, outlet=None, where: str = DEFAULT_SESSION) -> dict:
        """Start the session's host (a no-op once started), its own outputs
        shown through ``outlet``; returns its hello: the post-mortem of this
        notebook's last kernel, if it died."""
        self.kernel = kernel
        self.outlet = outlet or self.outlet
        if self.host is not None:   # started from a script: the notebook's outputs from now on
            self.host.outlet = self.outlet
            return {"outputs": [], "problem": "", "note": ""}
        check_room()
        self.host = self._new_host(where)
        return self.host.hello()

    def _new_host(self, where: str):
        if where == "helper":
            from .remote import START_TIMEOUT_S, HostError, RemoteHost

            try:
                host = RemoteHost(os.getpid(), self.outlet, kernel=self.kernel)
            except OSError as err:
                self.why_local = f"its helper process could not start ({err})"
            else:
                try:
                    host.call("info", timeout=START_TIMEOUT_S)
                    return host
                except HostError as err:
                    host.bye()
                    self.why_local = f"its helper process did not start ({err})"
        from ..helper.host import SessionHost

        return SessionHost(os.getpid(), self.outlet, kernel=self.kernel)

    def host_for(self, where: str | None):
        """The host to run a monitor on: the current one, unless ``where``
        (Options.session) asks for the other place and no monitor runs yet
        (``"kernel"``: in the kernel; ``"helper"``: in a helper process)."""
        check_room()   # what starts next opens descriptors here too (pyzmq's, for a big message: it aborts without)
        host = self.host
        if host is None:
            self.connect(kernel=self.kernel, where=where or DEFAULT_SESSION)
        elif getattr(host, "gone", None):   # its helper ended (killed, out of memory) or was ended (stuck)
            why = host.gone
            self.close()
            self.host = self._new_host(where or "helper")
            self.outlet.say(f"nbmon: {why}; a new helper process watches from here (what the old one held is gone)")
        elif where is not None and (where == "helper") != self.remote and not host.info()["running"]:
            self.close()
            self.host = self._new_host(where)
        return self.host

    def hold_notes(self) -> None:
        """Notes from now on go out together at :meth:`release_notes` (:meth:`RemoteHost.hold`)."""
        if self.remote and self.host is not None:
            self.host.hold()

    def release_notes(self) -> None:
        if self.remote and self.host is not None:
            self.host.release()

    def notify(self, method: str, *args) -> None:
        """Tell the host ``method(*args)`` without waiting for it (the cell hooks)."""
        if self.remote:
            self.host.note(method, *args)
        else:
            getattr(self.host, method)(*args)

    @property
    def monitor(self):
        """The session's monitor: the Monitor itself where the session runs
        in the kernel, a :class:`RemoteMonitor` of the helper's; None before
        one was made."""
        host = self.host
        if host is None:
            return None
        if self.remote:
            return RemoteMonitor(host) if "pid" in host.info() else None
        return host.monitor

    def stop(self) -> ResourceSummary | None:
        """Stop the session's monitor (its views become their records); its run's summary, or None."""
        got = self.host.stop()["run"] if self.host is not None else None
        self.sizes.watch(False)
        return ResourceSummary.from_dict(got) if got is not None else None

    def close(self) -> None:
        host, self.host = self.host, None
        self.sizes.watch(False)
        if getattr(host, "REMOTE", False):
            host.bye()
        elif host is not None:
            host.close()


SESSION = Session()


class RemoteMonitor:
    """The notebook's monitor when it runs in the helper process: its
    figures, asked for; ``stop()`` and ``summary()`` as a Monitor's."""

    def __init__(self, host):
        self._host = host

    def _info(self) -> dict:
        return self._host.info()

    running = property(lambda self: self._info()["running"])
    interval = property(lambda self: self._info()["interval"])
    pid = property(lambda self: self._info()["pid"])
    peaks = property(lambda self: self._info()["peaks"])
    gpu_state = property(lambda self: self._info()["gpu_state"])
    gpu_count = property(lambda self: self._info()["gpu_count"])

    def summary(self) -> ResourceSummary:
        got = self._host.summary()
        return ResourceSummary.from_dict(got) if got is not None else ResourceSummary.zeroed()

    def stop(self) -> None:
        self._host.stop()

    def attach(self, sink, every_s: float = 1.0):
        raise ValueError("a sink of your own runs in the kernel, and this monitor runs in nbmon's helper "
                         "process: %resmon stop, then nbmon.monitor(consumers=[...]) runs the session in the kernel")

    def __repr__(self) -> str:
        return f"<nbmon monitor in helper process {self._host.pid}>"


def monitor(options: Options | None = None, *, consumers=(), overwrite: bool = False, **settings):
    """The notebook's monitor (the one ``%resmon`` shows), started with
    ``options`` and ``settings`` (e.g. ``interval=0.5``) if none runs yet.
    A setting named after a sink (nbmon.sinks.senders.SINKS: ``csv``, ``jsonl``)
    streams every sample to that file (an existing one is refused unless
    ``overwrite``); ``consumers`` (consumers, senders or callables) are
    attached too, either way, so a sink of your own gets the kernel's samples::

        nbmon.monitor(jsonl="kernel.jsonl")
        nbmon.monitor(consumers=[my_sender])

    Consumers of your own run in the kernel: the session then runs there
    too (``session="kernel"``), as it does when asked for by name.
    """
    from ..sinks.senders import MONITOR, anchored, check_outputs, sinks

    names = {sink.name for sink in sinks(MONITOR)}
    outputs = {name: path for name, path in settings.items() if name in names and path is not None}
    settings = {k: v for k, v in settings.items() if k not in names}
    where = settings.get("session") or ("kernel" if consumers else None)
    options = Options.of(options, **settings)   # refused before any file is made
    check_outputs(outputs, overwrite, "pass overwrite=True to replace it")
    outputs = anchored(outputs)   # the host's cwd is /
    host = SESSION.host_for(where)
    SESSION.sizes.watch(host.start(options_dict(options), outputs, overwrite)["variables"])
    handle = SESSION.monitor
    for consumer in consumers:
        handle.attach(consumer)
    return handle


def _asked(method: str, default):
    """The host's answer to ``method()``: ``default`` before any host, or,
    said in one line, when its helper cannot answer (ended, stuck)."""
    host = SESSION.host
    if host is None:
        return default
    if not SESSION.remote:
        return getattr(host, method)()
    from .remote import HostError

    try:
        return getattr(host, method)()
    except HostError as err:
        SESSION.outlet.say(f"nbmon: {err}")
        return default


def history(workers: bool = False):
    """pandas DataFrame, one row per monitored cell (the last 10,000): execution_count, label,
    start_time (UTC), duration_sec, status ('ok', 'failed', 'interrupted'),
    duration_vs_last_sec and peak_mem_vs_last_mb (against the last run of the
    same cell source in this session; NaN for a first run),
    then the ResourceSummary fields (units in their names: _mb is MiB);
    GPU columns only when some cell has a GPU figure. ``workers=True``: one
    row per cell and worker of a watched Dask cluster (:mod:`nbmon.dask`)."""
    from ..report.records import CellRecord, history_frame

    if workers:
        from .. import dask

        frame = dask.history()
    else:
        rows = _asked("history", [])
        records = []
        for row in rows:
            record = CellRecord(row["execution_count"], row["label"], row["start_time"], row["t_open"], row["status"])
            record.summary = ResourceSummary.from_dict(row["summary"])
            record.last_run = tuple(row["last_run"]) if row.get("last_run") else None
            records.append(record)
        frame = history_frame(records)
    empty = [c for c in frame.columns if "gpu" in c and frame[c].isna().all()]
    return frame.drop(columns=empty)


def samples(workers: bool = False):
    """pandas DataFrame of the current (or last) monitor's samples, indexed by
    UTC time; one column per metric, units in the names. ``workers=True``:
    every worker's samples of a watched Dask cluster, long (:mod:`nbmon.dask`)."""
    if workers:
        from .. import dask

        return dask.samples()
    import numpy as np

    from ..report.records import samples_frame

    got = _asked("samples", {"columns": []})
    t, wall, *values = (np.frombuffer(b, dtype=np.float64) for b in got.get("buffers") or [b"", b""])
    return samples_frame(t, wall, dict(zip(got["columns"], values)))


def last_summary() -> ResourceSummary | None:
    """The ResourceSummary of the last monitored cell (None before any)."""
    got = _asked("last_summary", None)
    return ResourceSummary.from_dict(got) if got is not None else None
