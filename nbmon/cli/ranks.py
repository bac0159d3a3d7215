"""The ranks of a distributed job: a JSON Lines file per rank, read back as
one DataFrame, and a report of the ranks that held the job back.

``nbmon run --rank-dir DIR -- CMD``, started by torchrun, mpirun, Slurm
or anything else that sets the usual variables (:data:`LAUNCHERS`; ``--rank
N`` when none does, e.g. plain multiprocessing), writes every sample of its
command to ``DIR/rank-<N>.jsonl`` (:func:`rank_path`), each line tagged with
``rank``, ``local_rank``, ``world_size``, ``host`` and ``launcher``.

:func:`read_ranks` merges such files -- and those of scaffold's
``SystemMonitor(rank=r)`` published through a JSON Lines sender, whose keys
are ``rank<r>.<WandB name>`` -- into one DataFrame on a common time axis;
:func:`rank_table` is one row per rank, the straggler (the rank that
finished last) and the memory outlier (the largest peak RSS) marked; ``nbmon
report`` prints it and draws an offline timeline per metric, a trace per
rank (:func:`write_report`).
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import socket

from .. import catalog
from ..format import MISSING, fmt
from ..report.render import grid_table, grid_text

# (launcher, rank variable, local rank variable, world size variable): the
# first whose rank variable is set wins (torchrun inside a Slurm step sets both).
LAUNCHERS = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("MPICH", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    ("Slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
)
TAGS = ("rank", "local_rank", "world_size", "host", "launcher")
_NOT_METRICS = frozenset(TAGS) | {"time", "elapsed_s"}
_NAMED = re.compile(r"rank-?(\d+)")
_PREFIXED = re.compile(r"rank(\d+)\.(.+)")


def _whole(name: str, text) -> int:
    value = str(text).strip()
    if not value.isdigit():
        raise ValueError(f"{name}={text!r} is not a rank (a whole number, 0 or more)")
    return int(value)


def rank_of(environ=None, given=None) -> dict | None:
    """``{rank, local_rank, world_size, launcher}`` from ``given`` (``--rank``)
    or the first launcher variable set in ``environ`` (default: this
    process's); None when there is none. A value that is not a whole number
    is a ValueError naming it."""
    if given is not None:
        return {"rank": _whole("--rank", given), "local_rank": None, "world_size": None, "launcher": "--rank"}
    environ = os.environ if environ is None else environ
    for launcher, rank, local, size in LAUNCHERS:
        if rank in environ:
            return {"rank": _whole(rank, environ[rank]),
                    "local_rank": _whole(local, environ[local]) if local in environ else None,
                    "world_size": _whole(size, environ[size]) if size in environ else None,
                    "launcher": launcher}
    return None


def rank_path(directory: str, rank: int) -> str:
    """``directory/rank-<rank>.jsonl`` (zero-padded, so names sort by rank)."""
    return os.path.join(directory, f"rank-{rank:05d}.jsonl")


def run_tags(rank_dir: str | None, rank, outputs: dict, environ=None) -> dict | None:
    """For ``nbmon run --rank-dir``: sets ``outputs["jsonl"]`` to this rank's
    file and returns the tags its lines carry; None without ``--rank-dir``.
    ValueError (one sentence) for bad input; nothing is created here."""
    if rank_dir is None:
        if rank is not None:
            raise ValueError("--rank needs --rank-dir (where the rank's file goes)")
        return None
    if not os.path.isdir(rank_dir):
        raise ValueError(f"--rank-dir {rank_dir!r} is not a directory")
    if outputs.get("jsonl") is not None:
        raise ValueError("--rank-dir writes the rank's JSON Lines file itself: leave out --jsonl")
    info = rank_of(environ, rank)
    if info is None:
        names = ", ".join(rank for _, rank, _, _ in LAUNCHERS)
        raise ValueError(f"--rank-dir: no rank in the environment ({names}); give --rank N")
    outputs["jsonl"] = rank_path(rank_dir, info["rank"])
    return {**info, "host": socket.gethostname()}


class Tagged:
    """A file sender (:mod:`nbmon.sinks.senders`) whose every event gets ``tags`` added."""

    def __init__(self, sender, tags: dict):
        self.sender, self.tags = sender, dict(tags)

    def publish(self, event, **kwargs) -> None:
        self.publish_many([event])

    def publish_many(self, events) -> None:
        self.sender.publish_many([{**self.tags, **event} for event in events])

    def close(self) -> None:
        self.sender.close()


# -- reading -------------------------------------------------------------------------

def _wandb_names() -> tuple[dict[str, str], list[tuple[re.Pattern, str]]]:
    """scaffold's WandB keys -> catalog columns: plain keys, and device key patterns."""
    plain, devices = {}, []
    for metric in catalog.METRICS:
        if metric.wandb is None:
            continue
        key = metric.wandb[0]
        if metric.source == catalog.DEVICE:
            devices.append((re.compile(re.escape(key).replace(r"\{i\}", r"(\d+)")), metric.name))
        else:
            plain[key] = metric.name
    return plain, devices


def _column(key: str, plain, devices) -> str:
    if key in plain:
        return plain[key]
    for pattern, name in devices:
        match = pattern.fullmatch(key)
        if match:
            return catalog.device_column(int(match.group(1)), name)
    return key


def files_of(paths) -> list[str]:
    """The files named by ``paths``: a path or glob, or a list of them;
    ValueError naming a pattern that matches nothing."""
    patterns = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not patterns:
        raise ValueError("no rank files given")
    files: list[str] = []
    for pattern in map(os.fspath, patterns):
        found = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else \
            ([pattern] if os.path.isfile(pattern) else [])
        if not found:
            raise ValueError(f"no file matches {pattern!r}")
        files += [f for f in found if f not in files]
    return files


def _records(path: str):
    """(rank, host, wall or NaN, {column: value}) for every rank in every line of ``path``."""
    plain, devices = _wandb_names()
    named = _NAMED.search(os.path.basename(path))
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: not JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}, line {number}: not a JSON object")
            wall = obj.get("time")
            wall = float(wall) if isinstance(wall, (int, float)) and not isinstance(wall, bool) else math.nan
            host = obj.get("host") if isinstance(obj.get("host"), str) else None
            prefixed: dict[int, dict] = {}
            for key, value in obj.items():
                match = _PREFIXED.fullmatch(key)
                if match:  # SystemMonitor(rank=r): rank<r>.<WandB name>
                    prefixed.setdefault(int(match.group(1)), {})[_column(match.group(2), plain, devices)] = value
            if prefixed:
                for rank, values in prefixed.items():
                    yield rank, host, wall, values
                continue
            rank = obj.get("rank")
            if rank is None:
                if named is None:
                    raise ValueError(f"{path}, line {number}: no rank, in the line nor in the file's name")
                rank = named.group(1)
            if isinstance(rank, float) and rank.is_integer():  # JSON Lines senders write numbers as floats
                rank = int(rank)
            yield _whole(f"{path}: rank", rank), host, wall, \
                {k: v for k, v in obj.items() if k not in _NOT_METRICS}


def read_ranks(paths, *, period_s: float | None = None):
    """One DataFrame of the ranks' samples: UTC ``time`` index, ``elapsed_s``
    since the job's first sample (whichever rank took it), ``rank``,
    ``host``, then the metric columns (catalog names; SystemMonitor's WandB
    keys are mapped back to them, others kept as they are).

    ``paths``: a file, a glob, or a list of them. Lines without a time
    (SystemMonitor's) are placed ``period_s`` apart from the job's start, and
    need it (its ``sample_rate_seconds``)."""
    import numpy as np
    import pandas as pd

    rows, untimed = [], []
    for path in files_of(paths):
        count: dict[int, int] = {}
        for rank, host, wall, values in _records(path):
            n = count[rank] = count.get(rank, -1) + 1
            if wall != wall:
                untimed.append(path)
            rows.append({"_wall": wall, "_n": n, "rank": rank, "host": host,
                         **{k: v for k, v in values.items() if isinstance(v, (int, float)) or v is None}})
    if untimed and period_s is None:
        raise ValueError(f"{untimed[0]} has lines without a time: pass period_s, the seconds "
                         f"between them (SystemMonitor's sample_rate_seconds)")
    frame = pd.DataFrame(rows)
    if frame.empty:
        raise ValueError(f"no samples in {', '.join(files_of(paths))}")
    wall = frame.pop("_wall").astype(float)
    n = frame.pop("_n").astype(float)
    start = np.nanmin(wall.to_numpy()) if wall.notna().any() else 0.0
    frame.insert(0, "elapsed_s", np.where(wall.notna(), wall - start, n * (period_s or 0.0)))
    order = {m: k for k, m in enumerate(catalog.METRICS)}
    metrics = sorted((c for c in frame.columns if c not in ("elapsed_s", "rank", "host")),
                     key=lambda c: (order.get(catalog.metric_of(c), len(order)), c))
    frame = frame[["elapsed_s", "rank", "host", *metrics]]
    frame[metrics] = frame[metrics].astype(float)
    frame.index = pd.DatetimeIndex(pd.to_datetime(wall, unit="s", utc=True), name="time")
    return frame.sort_values(["elapsed_s", "rank"], kind="stable")


def rank_table(frame):
    """One row per rank (indexed by rank): host, start_s and end_s on the
    job's time axis, duration_s, peak_rss_mb (the exact peak where there is
    one), mean_cpu_percent, cpu_time_s, peak_gpu_mem_mb, samples, and
    ``straggler`` / ``largest`` flags on the rank that finished last and the
    one with the largest peak RSS."""
    import numpy as np
    import pandas as pd

    def peak(part, *columns):
        known = [part[c].max() for c in columns if c in part and part[c].notna().any()]
        return max(known) if known else np.nan

    rows = {}
    for rank, part in frame.groupby("rank", sort=True):
        rows[rank] = {"host": part["host"].dropna().iloc[0] if part["host"].notna().any() else None,
                      "start_s": part["elapsed_s"].min(), "end_s": part["elapsed_s"].max(),
                      "peak_rss_mb": peak(part, "proc_rss_peak_mb", "proc_rss_mb"),
                      "mean_cpu_percent": part["proc_cpu_percent"].mean() if "proc_cpu_percent" in part else np.nan,
                      "cpu_time_s": peak(part, "proc_cpu_time_s"),
                      "peak_gpu_mem_mb": peak(part, "gpu_mem_used_mb"), "samples": len(part)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "rank"
    table.insert(3, "duration_s", table["end_s"] - table["start_s"])
    table["straggler"] = table.index == table["end_s"].idxmax()
    table["largest"] = table.index == table["peak_rss_mb"].idxmax() if table["peak_rss_mb"].notna().any() else False
    return table


_COLUMNS = (("host", "host", None), ("end", "end_s", "s"), ("duration", "duration_s", "s"),
            ("peak RSS", "peak_rss_mb", "MiB"), ("CPU mean", "mean_cpu_percent", "%"),
            ("CPU time", "cpu_time_s", "s"), ("GPU mem peak", "peak_gpu_mem_mb", "MiB"))
HEADER = ["rank"] + [name for name, _, _ in _COLUMNS]


def ranked(table, most: int = 10):
    """(title, short name, rows of text): the ``most`` slowest ranks (last to
    finish) and the ``most`` largest (peak RSS), each row :data:`HEADER`'s cells."""
    for title, short, by in (("Slowest ranks (last to finish)", "slowest", "end_s"),
                             ("Largest ranks (peak RSS)", "largest", "peak_rss_mb")):
        top = table.sort_values(by, ascending=False).head(most)
        yield title, short, [[str(rank)] + [(row[c] or MISSING) if unit is None else fmt(row[c], unit)
                                            for _, c, unit in _COLUMNS] for rank, row in top.iterrows()]


def verdict(table) -> list[str]:
    """The straggler and the memory outlier, in words, against the median rank."""
    lines = []
    for flag, column, unit, what in (("straggler", "end_s", "s", "finished last"),
                                     ("largest", "peak_rss_mb", "MiB", "used the most memory")):
        hit = table.index[table[flag]]
        if len(hit):
            rank, value, median = hit[0], table.at[hit[0], column], table[column].median()
            lines.append(f"rank {rank} {what}: {fmt(value, unit)} (median rank {fmt(median, unit)})"
                         + (f" on {table.at[rank, 'host']}" if table.at[rank, "host"] else ""))
    return lines


def text_report(table, most: int = 10) -> str:
    """The ranks as text: the verdict, then the slowest and the largest."""
    out = [f"nbmon: {len(table)} ranks on {table['host'].nunique()} host(s)", *verdict(table)]
    for title, _, rows in ranked(table, most):
        out += ["", grid_text(title, HEADER, rows)]
    return "\n".join(out)


def write_report(frame, path, *, title: str = "ranks", overwrite: bool = False, most: int = 10) -> str:
    """An offline HTML page: the verdict, the slowest and the largest ranks,
    and a timeline per metric with a trace per rank. Returns ``path``."""
    import html

    from ..views.pages import ranks_figure, write_page

    table = rank_table(frame)
    flagged = {flag: table.index[table[flag]] for flag in ("straggler", "largest")}
    parts = [f'<div class="nbmon-ranks" data-straggler="{"".join(map(str, flagged["straggler"][:1]))}" '
             f'data-largest="{"".join(map(str, flagged["largest"][:1]))}" style="font:13px system-ui,sans-serif">'
             + "".join(f"<p style='margin:2px 0'>{html.escape(line)}</p>" for line in verdict(table))]
    parts += [grid_table(heading, HEADER, rows, cls=f"nbmon-ranks-{short}") for heading, short, rows in ranked(table, most)]
    return write_page(path, title, "".join(parts) + "</div>", ranks_figure(frame), overwrite=overwrite)
