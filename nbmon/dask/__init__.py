"""Every worker of a Dask cluster, from the notebook.

    import nbmon.dask
    watch = nbmon.dask.watch(client)   # each worker samples itself
    ...
    nbmon.dask.unwatch()               # stops it on every worker, no thread left behind

or ``%resmon --dask client`` / ``%resmon stop`` in a notebook, which also
shows the cluster live (a watch's live view,
:class:`nbmon.views.cluster.ClusterView`, is the notebook package's: this
package imports nothing of it). Each worker samples its own process tree
(the worker and the processes its tasks start) with the local monitor's
rules -- exact peak RSS, nanosecond CPU clocks -- and only the GPUs its
``CUDA_VISIBLE_DEVICES`` lets it use; the machine is sampled once per host.
Each worker process makes one batch a second (min, max and mean of every
field), and each host sends its processes' batches together, sealed with
the watch's key, as one Dask event (less often on clusters of many hosts:
:func:`nbmon.dask.worker.host_period_s`), so that the scheduler relays a
message per host, not per worker. Workers that join later are watched
too, and ones that leave (the scheduler says so) stay in the view with a
marker.

While a cluster is watched, ``%%resmon`` also summarises the cell on every
worker, from exact spans opened and closed on the workers at the cell's
boundaries: ``nbmon.history(workers=True)`` has one row per cell and
worker (``nbmon.history()`` keeps its one row per cell, for the kernel).
``nbmon.samples(workers=True)`` is every worker's rows, long, with
``worker`` and ``host`` columns.

Needs Dask distributed (``pip install "nbmon[dask]"``) in the notebook, and
nbmon importable where the scheduler and the workers run: Dask imports
plugins there. Importing this module does not import distributed; watching does.
"""
from __future__ import annotations

import collections
import math
from contextlib import contextmanager

from ..options import Options
from ..report.render import grid_table, grid_text
from ..report.summary import PEAK_KINDS
from ..report.records import WorkerCellRecord

__all__ = ["watch", "unwatch", "watching", "history", "samples", "cell", "cell_html", "client_named",
           "workers_table", "workers_text"]

_watch = None            # the Watch of the cluster being watched (one at a time)
MAX_CELLS = 10_000       # cells history(workers=True) keeps, as nbmon.history() does
MAX_ROWS = 50_000        # and (cell, worker) rows, whole cells: some 0.75 KiB each
_cells: collections.deque = collections.deque()   # per cell, its rows: one per worker
_rows = 0


def _distributed():
    try:
        import distributed
    except ImportError:
        raise ImportError('watching a Dask cluster needs Dask distributed: pip install "nbmon[dask]"') from None
    return distributed


def watch(client, options: Options | None = None, *, every_s: float = 1.0,
          worker_max_bytes: int = 1 << 20, mirror=None, **settings):
    """Watch every worker of ``client``'s cluster; returns the Watch
    (:class:`nbmon.views.cluster.ClusterView` of it: a live view). ``options`` / ``settings`` as for a Monitor
    (``interval``, ``gpu``, ``children``, ``system``: the machine, once per
    host). ``every_s`` seconds between a worker process's batches (at least
    1; a host sends its processes' together, that often, or less often on
    clusters of many hosts); ``worker_max_bytes`` bounds the notebook's
    store of each worker (beyond 128 workers they share 128 MiB:
    :mod:`nbmon.dask.feeds`). ``mirror``: told every event too
    (:class:`nbmon.dask.client.Watch`; the session's helper draws the live
    view from it). Watching the cluster already watched returns its Watch."""
    global _watch
    distributed = _distributed()
    from .client import Watch

    if not isinstance(client, distributed.Client):
        raise ValueError(f"watch() needs a distributed.Client, got {client!r}")
    if client.status != "running":
        raise ValueError(f"the client {client!r} is not connected (status {client.status!r})")
    options = Options.of(options, **settings)
    if isinstance(every_s, bool) or not isinstance(every_s, (int, float)) \
            or not math.isfinite(every_s) or not 1.0 <= every_s <= 3600.0:
        raise ValueError(f"every_s must be a number of seconds from 1 to 3600, got {every_s!r}")
    if isinstance(worker_max_bytes, bool) or not isinstance(worker_max_bytes, int) \
            or worker_max_bytes < 1 << 18:
        raise ValueError(f"worker_max_bytes must be a whole number of bytes, at least 262144, "
                         f"got {worker_max_bytes!r}")
    if _watch is not None and _watch.running:
        if _watch.client is client:
            return _watch
        raise ValueError(f"already watching the cluster at {_watch.address}: unwatch() it first")
    _watch = Watch(client, options, every_s=float(every_s), worker_max_bytes=worker_max_bytes,
                   mirror=mirror).start()
    return _watch


def unwatch() -> dict[str, list[str]]:
    """Stop watching: every worker stops sampling. Returns ``{worker: [nbmon
    threads still alive there]}`` for any worker that has some (empty: all clean)."""
    return _watch.stop() if _watch is not None else {}


def watching():
    """The Watch of the cluster being watched, or None."""
    return _watch if _watch is not None and _watch.running else None


def client_named(namespace: dict, name: str):
    """The ``distributed.Client`` called ``name`` in ``namespace`` (the notebook's),
    or ValueError saying what is there instead."""
    if name not in namespace:
        raise ValueError(f"no variable {name!r} in the notebook: --dask takes the name of a distributed.Client")
    client = namespace[name]
    if not isinstance(client, _distributed().Client):
        raise ValueError(f"{name!r} is a {type(client).__name__}, not a distributed.Client")
    return client


@contextmanager
def cell(record):
    """Around a monitored cell (``record``: its nbmon.report.records.CellRecord): exact
    spans on every worker of the watched cluster; nothing when none is
    watched. Adds one record per worker to :func:`history` and lists them in
    ``record.workers``."""
    watched = watching()
    if watched is None:
        yield
        return
    token, opened = watched.open_spans()
    try:
        yield
    finally:
        rows = watched.close_spans(token, opened)
        record.workers = tuple(WorkerCellRecord.on(record, r["worker"], r["host"], r["summary"]) for r in rows)
        _keep(record.workers)


def _keep(rows) -> None:
    """Add a cell's rows to the history, the oldest cells going first beyond
    MAX_CELLS cells or MAX_ROWS rows (the newest cell stays, whatever its size)."""
    global _rows
    _cells.append(rows)
    _rows += len(rows)
    while len(_cells) > 1 and (len(_cells) > MAX_CELLS or _rows > MAX_ROWS):
        _rows -= len(_cells.popleft())


def cell_html(record) -> str:
    """The per-worker table of a cell made under :func:`cell` ("" if none)."""
    if not record.workers:
        return ""
    return workers_table("nbmon · the cell on each worker",
                         [(r.worker, r.host, r.summary if r.status != "no answer" else None) for r in record.workers])


def workers_table(title: str, workers) -> str:
    """A table of ``workers`` ((worker, host, ResourceSummary or None: no
    answer) each): a row per worker, a column per row its summary's record
    has (``ResourceSummary.rows()``, the duration left out: the same for
    every worker), how exact a peak is beside its figure."""
    return grid_table(title, *_worker_grid(workers), cls="nbmon-workers")


def workers_text(title: str, workers) -> str:
    """:func:`workers_table` as plain text."""
    return grid_text(title, *_worker_grid(workers))


def _worker_grid(workers) -> tuple[list[str], list[list[str]]]:
    shown = [{} if summary is None else dict(_kind_beside(summary.rows())) for _, _, summary in workers]
    titles = list(dict.fromkeys(t for rows in shown for t in rows if t != "Duration")) or ["figures"]
    body = [[worker, host, *([rows.get(t, "") for t in titles] if rows else
                             ["no answer", *[""] * (len(titles) - 1)])]
            for (worker, host, _), rows in zip(workers, shown)]
    return ["worker", "host", *titles], body


def _kind_beside(rows):
    """'Peak memory (exact)', '300 MiB' -> 'Peak memory', '300 MiB (exact)':
    one column whatever each worker's peak is."""
    for title, text in rows:
        kind = next((k for k in PEAK_KINDS if title.endswith(f" ({k})")), None)
        yield (title.removesuffix(f" ({kind})"), f"{text} ({kind})") if kind else (title, text)


def history():
    """One row per (monitored cell, worker), for the last 10,000 cells and
    at most 50,000 rows (the oldest cells go first): the columns of
    ``nbmon.history()`` with ``worker`` and ``host`` after ``status``; a
    worker that did not answer at the cell's end has status 'no answer' and
    no figures."""
    from ..report.records import history_frame

    rows = [row for cell_rows in _cells for row in cell_rows]
    frame = history_frame(rows)
    frame.insert(5, "worker", [r.worker for r in rows])
    frame.insert(6, "host", [r.host for r in rows])
    return frame


def samples():
    """Every row of every worker of the watched (or last watched) cluster:
    see :meth:`nbmon.dask.feeds.Collector.samples_frame`."""
    from .feeds import Collector

    return (_watch.collector if _watch is not None else Collector(b"")).samples_frame()
