"""Every metric nbmon measures, declared once.

A metric's name is its column everywhere -- the store, ``samples()``, the
CSV and JSON Lines headers -- and ends in its unit (``_mb`` is MiB,
``_percent``, ``_s``, ``_bytes``, ``_bytes_per_s``, ``_w``, ``_mhz``,
``_c``; a count has no suffix). Sources return values keyed by these
names; everything that shows or publishes a metric (the summary, the live
chart's rows, the meter, scaffold's WandB keys) reads it from here.

Adding a metric: one entry in ``METRICS``, and the source named in its
``source`` returns a value under its name. Per-GPU metrics (``DEVICE``) are
named without the device: the column of device ``i`` is ``gpu<i>_<name>``
(:func:`device_column`).

A third party extends nbmon without editing it, through entry points
(:func:`plugins`): ``nbmon.metrics`` (a module with ``METRICS``, its
entries, and ``source(pid, options)``, the source that reads them),
``nbmon.gpus`` (a GPU vendor, :mod:`nbmon.sources.gpus`) and ``nbmon.sinks``
(a :class:`~nbmon.sinks.senders.Sink`). nbmon's own metrics, vendors and
sinks have the same form.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

# kinds
GAUGE = "gauge"        # a level at the sample's time (RSS, temperature)
COUNTER = "counter"    # cumulative since a fixed origin (CPU seconds, bytes read)
RATE = "rate"          # per second (or %) over the interval before the sample

# how one window (a cell, a run) is summarised: statistics of store.Stats.value
PEAK, MEAN, LAST, DELTA = "max", "mean", "last", "delta"
# How a one-line record labels each statistic (a growth by its sign).
LINE_WORDS = {PEAK: "peak", MEAN: "mean", LAST: "now", DELTA: ""}

# sources
TREE = "tree"          # the watched process and its descendants
MACHINE = "machine"    # the whole machine
CGROUP = "cgroup"      # the container (cgroup) the watched process runs in
GPU = "gpu"            # all GPUs together (totals of DEVICE metrics)
DEVICE = "device"      # one GPU

UNIT_SUFFIX = {"%": "_percent", "MiB": "_mb", "s": "_s", "B": "_bytes", "B/s": "_bytes_per_s",
               "W": "_w", "MHz": "_mhz", "°C": "_c", "CPUs": "_cpus", "": ""}


@dataclass(frozen=True, slots=True)
class Shown:
    """One row of a record (a cell's, a run's summary) showing a metric.

    ``rank`` orders the rows; ``stat`` is the statistic shown (default: the
    metric's ``summary``), or two joined by " / "; ``form`` is "value",
    "peak" (the metric's peak, how exact it is in the title, and the most
    it can have been), "of" (the value, then "of" ``other``'s: a usage and
    its limit; ``alone`` titles ``other`` shown alone) or "split" (the
    growth of the metric and of the ``other`` ones, named by their
    ``short``). ``when`` it is shown: "known" (a value), "nonzero",
    "above" (in a tree of more than one process, at least ``ABOVE_SHARE``
    times ``other``'s and ``ABOVE_MB`` more) or "moved" (one of the ``other`` ones moved by ``MOVED_MB``)."""

    title: str
    rank: int
    stat: str | tuple[str, str] = ""
    form: str = "value"
    other: str | tuple[str, ...] | None = None
    when: str = "known"
    alone: str = ""


ABOVE_SHARE, ABOVE_MB = 1.05, 16.0   # an RSS sum worth showing beside the memory: shared pages
MOVED_MB = 8.0                       # a growth worth splitting: page cache or shared memory moved


@dataclass(frozen=True, slots=True)
class Metric:
    """One measured quantity. ``chart`` names the live chart row it is drawn
    in (None: not charted); ``wandb`` is its key and statistic in scaffold's
    SystemMonitor (``{i}`` is the device index); a GPU total is the ``total``
    ("sum" or "mean") of the DEVICE metric ``of`` over the devices.

    What a record shows of it: ``record`` (its rows, :class:`Shown`);
    ``peak`` names the column of its peak within each interval (a peak is
    read from there), ``bound`` the column of that peak's upper end;
    ``short`` is its name in a headline ("CPU 3 % · Memory 120 MiB"), where
    the ``meter`` metrics that have one are shown; ``line`` the statistics a
    cell's one-line record gives of it, each labelled (:data:`LINE_WORDS`;
    empty: its ``summary``)."""

    name: str
    unit: str
    label: str
    kind: str
    summary: str
    source: str
    chart: str | None = None
    meter: bool = False
    wandb: tuple[str, str] | None = None
    total: str | None = None
    of: str | None = None
    record: tuple[Shown, ...] = ()
    peak: str | None = None
    bound: str | None = None
    short: str = ""
    line: tuple[str, ...] = ()


METRICS_GROUP, GPUS_GROUP, SINKS_GROUP = "nbmon.metrics", "nbmon.gpus", "nbmon.sinks"
_PLUGINS: dict[str, list] = {}


def installed_path() -> list[str]:
    """sys.path without the current directory (``''``, or it by name):
    where installed packages are, not what lies in the directory a notebook
    was opened in (someone else's, maybe)."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = None
    return [p for p in sys.path if p and os.path.realpath(p) != cwd]


def _entry_points(group: str) -> list:
    """The entry points in ``group`` of the installed distributions (a
    ``*.dist-info`` planted in the current directory is none), each once."""
    from importlib.metadata import distributions   # a kernel has it already; elsewhere ~20 ms, once

    points = {(point.name, point.value): point for dist in distributions(path=installed_path())
              for point in dist.entry_points if point.group == group}
    return sorted(points.values(), key=lambda point: point.name)


def plugins(group: str) -> list:
    """What the installed distributions' entry points in ``group`` name,
    loaded once per process, in entry-point name order. One that cannot be
    loaded is said in one line on stderr and left out: a broken plugin
    never stops nbmon."""
    if group not in _PLUGINS:
        loaded = []
        for point in _entry_points(group):
            try:
                loaded.append(point.load())
            except Exception as err:   # whatever a third party's import raises
                print(f"nbmon: plugin {point.name!r} of {group} ({point.value}) cannot be loaded "
                      f"({type(err).__name__}: {err}); nbmon goes on without it", file=sys.stderr)
        _PLUGINS[group] = loaded
    return _PLUGINS[group]


def plugin_imports() -> tuple[str, ...]:
    """The top-level packages of every plugin: nbmon's helper processes
    import them from where this process finds them."""
    groups = (METRICS_GROUP, GPUS_GROUP, SINKS_GROUP)
    return tuple(dict.fromkeys(point.value.split(":")[0].split(".")[0].strip()
                               for group in groups for point in _entry_points(group)))


BUILT_IN: tuple[Metric, ...] = (
    # -- the process tree ------------------------------------------------------
    Metric("proc_cpu_percent", "%", "CPU, process tree (100 = one core)", RATE, MEAN, TREE,
           chart="cpu", meter=True, short="CPU", record=(Shown("CPU mean / peak", 90, (MEAN, PEAK)),)),
    Metric("proc_cpu_norm_percent", "%", "CPU, process tree (100 = every CPU)", RATE, MEAN, TREE),
    Metric("proc_cpu_time_s", "s", "CPU time, process tree", COUNTER, DELTA, TREE,
           record=(Shown("CPU time", 100),)),
    Metric("proc_pss_mb", "MiB", "memory, process tree (PSS: shared pages counted once)", GAUGE, PEAK,
           TREE, chart="memory", meter=True, short="Memory", peak="proc_pss_peak_mb",
           bound="proc_pss_peak_bound_mb", line=(LAST, DELTA, PEAK),
           record=(Shown("Peak memory", 20, form="peak"), Shown("Memory growth", 30, DELTA),
                   Shown("Mean memory", 40, MEAN))),
    Metric("proc_pss_peak_mb", "MiB", "peak memory, process tree", GAUGE, PEAK, TREE),
    Metric("proc_pss_peak_bound_mb", "MiB", "peak memory at most, process tree", GAUGE, PEAK, TREE),
    Metric("proc_rss_mb", "MiB", "RSS sum, process tree (shared pages counted in each process)", GAUGE,
           PEAK, TREE, wandb=("proc.memory.rssMB", MEAN), peak="proc_rss_peak_mb",
           record=(Shown("Peak RSS sum (shared pages in each process)", 50, when="above", other="proc_pss_mb"),)),
    Metric("proc_rss_peak_mb", "MiB", "peak RSS sum, process tree", GAUGE, PEAK, TREE),
    Metric("proc_rss_anon_mb", "MiB", "anonymous RSS, process tree", GAUGE, LAST, TREE, short="anon",
           record=(Shown("RSS growth by kind", 60, DELTA, form="split", when="moved",
                         other=("proc_rss_file_mb", "proc_rss_shmem_mb")),)),
    Metric("proc_rss_file_mb", "MiB", "file-backed RSS (mapped files' page cache), process tree", GAUGE,
           LAST, TREE, short="page cache"),
    Metric("proc_rss_shmem_mb", "MiB", "shared-memory RSS (/dev/shm, tmpfs), process tree", GAUGE, LAST,
           TREE, short="shared memory"),
    Metric("proc_threads", "", "threads, process tree", GAUGE, LAST, TREE,
           wandb=("proc.cpu.threads", LAST)),
    Metric("proc_count", "", "processes in the tree", GAUGE, PEAK, TREE),
    Metric("proc_read_bytes", "B", "storage read, process tree", COUNTER, DELTA, TREE),
    Metric("proc_write_bytes", "B", "storage written, process tree", COUNTER, DELTA, TREE),
    # -- the machine -----------------------------------------------------------
    Metric("sys_cpu_percent", "%", "CPU, machine (100 = every CPU)", RATE, MEAN, MACHINE,
           chart="cpu", wandb=("cpu", MEAN)),
    Metric("sys_mem_used_mb", "MiB", "memory used, machine", GAUGE, PEAK, MACHINE, chart="memory"),
    Metric("sys_mem_available_mb", "MiB", "memory available, machine", GAUGE, LAST, MACHINE,
           wandb=("proc.memory.availableMB", MEAN)),
    Metric("sys_mem_total_mb", "MiB", "memory, machine", GAUGE, LAST, MACHINE, meter=True),
    Metric("sys_mem_percent", "%", "memory used, machine", GAUGE, MEAN, MACHINE,
           wandb=("memory", MEAN)),
    Metric("sys_swap_used_mb", "MiB", "swap used, machine", GAUGE, PEAK, MACHINE),
    Metric("sys_disk_used_percent", "%", "disk used", GAUGE, LAST, MACHINE, wandb=("disk", LAST)),
    Metric("sys_disk_read_bytes", "B", "disk read since boot", COUNTER, DELTA, MACHINE),
    Metric("sys_disk_write_bytes", "B", "disk written since boot", COUNTER, DELTA, MACHINE),
    Metric("sys_disk_read_bytes_per_s", "B/s", "disk read rate", RATE, MEAN, MACHINE),
    Metric("sys_disk_write_bytes_per_s", "B/s", "disk write rate", RATE, MEAN, MACHINE),
    Metric("sys_net_sent_bytes", "B", "network sent since boot", COUNTER, DELTA, MACHINE),
    Metric("sys_net_recv_bytes", "B", "network received since boot", COUNTER, DELTA, MACHINE),
    Metric("sys_net_sent_bytes_per_s", "B/s", "network send rate", RATE, MEAN, MACHINE),
    Metric("sys_net_recv_bytes_per_s", "B/s", "network receive rate", RATE, MEAN, MACHINE),
    Metric("sys_load1", "", "load average, 1 min", GAUGE, MEAN, MACHINE),
    # -- the container (cgroup) ------------------------------------------------
    Metric("cgroup_mem_used_mb", "MiB", "memory used, container", GAUGE, PEAK, CGROUP,
           record=(Shown("Container memory peak / limit", 70, form="of", other="cgroup_mem_limit_mb",
                         alone="Memory limit (container)"),)),
    Metric("cgroup_mem_limit_mb", "MiB", "memory limit, container", GAUGE, LAST, CGROUP, chart="memory"),
    Metric("cgroup_oom_kills", "", "OOM kills, container", COUNTER, DELTA, CGROUP,
           record=(Shown("OOM kills (container)", 80, when="nonzero"),)),
    Metric("cgroup_cpu_limit_cpus", "CPUs", "CPU quota, container", GAUGE, LAST, CGROUP),
    # -- one GPU (column gpu<i>_<name>) ----------------------------------------
    Metric("util_percent", "%", "utilisation", RATE, MEAN, DEVICE, chart="gpu_util",
           wandb=("gpu.{i}.gpu", MEAN)),
    Metric("mem_util_percent", "%", "memory bandwidth utilisation", RATE, MEAN, DEVICE,
           wandb=("gpu.{i}.memory", MEAN)),
    Metric("mem_used_mb", "MiB", "memory used", GAUGE, PEAK, DEVICE, chart="gpu_memory"),
    Metric("mem_total_mb", "MiB", "memory", GAUGE, LAST, DEVICE),
    Metric("temp_c", "°C", "temperature", GAUGE, PEAK, DEVICE, wandb=("gpu.{i}.temp", MEAN)),
    Metric("fan_percent", "%", "fan speed", GAUGE, MEAN, DEVICE),
    Metric("power_w", "W", "power", GAUGE, MEAN, DEVICE, wandb=("gpu.{i}.powerWatts", MEAN)),
    Metric("power_limit_w", "W", "power limit", GAUGE, LAST, DEVICE),
    Metric("sm_clock_mhz", "MHz", "SM clock", GAUGE, MEAN, DEVICE),
    Metric("mem_clock_mhz", "MHz", "memory clock", GAUGE, MEAN, DEVICE),
    Metric("proc_mem_mb", "MiB", "memory used by the process tree", GAUGE, PEAK, DEVICE),
    Metric("proc_util_percent", "%", "SM utilisation by the process tree", RATE, MEAN, DEVICE),
    # -- all GPUs together -----------------------------------------------------
    Metric("gpu_util_percent", "%", "GPU utilisation (mean over GPUs)", RATE, MEAN, GPU,
           meter=True, total="mean", of="util_percent", short="GPU", record=(Shown("GPU util mean", 110),)),
    Metric("gpu_mem_used_mb", "MiB", "GPU memory used (all GPUs)", GAUGE, PEAK, GPU,
           meter=True, total="sum", of="mem_used_mb", short="GPU mem",
           record=(Shown("GPU memory peak (all GPUs)", 120),)),
    Metric("gpu_proc_mem_mb", "MiB", "GPU memory of the process tree (all GPUs)", GAUGE, PEAK, GPU,
           total="sum", of="proc_mem_mb", record=(Shown("GPU memory peak (this tree)", 130),)),
    Metric("gpu_proc_util_percent", "%", "GPU utilisation of the process tree (100 = one GPU)", RATE, MEAN, GPU,
           total="sum", of="proc_util_percent"),
    Metric("gpu_power_w", "W", "GPU power (all GPUs)", GAUGE, MEAN, GPU, total="sum", of="power_w",
           record=(Shown("GPU power mean", 140),)),
    Metric("gpu_sm_clock_mhz", "MHz", "GPU SM clock (mean over GPUs)", GAUGE, MEAN, GPU,
           total="mean", of="sm_clock_mhz"),
)
# A plugin's module may import this one: its metrics join once Metric exists.
METRICS: tuple[Metric, ...] = BUILT_IN + tuple(metric for plugin in plugins(METRICS_GROUP)
                                               for metric in plugin.METRICS)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def recorded() -> list[tuple[Metric, Shown]]:
    """Every row a record may show, in order."""
    return sorted(((m, shown) for m in METRICS for shown in m.record), key=lambda pair: pair[1].rank)


# The tree's levels that move with the kernel's own resident pages: where a
# cell's first sample comes late, its start is these corrected by how far
# the kernel's RSS moved meanwhile (engine.Monitor.window).
WITH_KERNEL_RSS = ("proc_pss_mb", "proc_rss_mb", "proc_rss_anon_mb")


def line_stats(metric: Metric) -> tuple[str, ...]:
    """The statistics of ``metric`` a one-line record gives, in order."""
    return metric.line or (metric.summary,)


def headlines() -> tuple[Metric, ...]:
    """The metrics of a headline, in catalog order: the meter's, by their short names."""
    return tuple(m for m in METRICS if m.meter and m.short)


def figure_key(stat: str, name: str) -> str:
    """The name of a window's statistic of a metric ('max_proc_pss_mb'), as
    summaries, history() and the workers' batches name it."""
    return f"{stat}_{name}"
_DEVICE_COLUMN = re.compile(r"gpu(\d+)_(.+)")


def names(source: str) -> tuple[str, ...]:
    """The names of one source's metrics, in catalog order."""
    return tuple(m.name for m in METRICS if m.source == source)


def device_column(index: int, name: str) -> str:
    """The column of DEVICE metric ``name`` for GPU ``index``: gpu<index>_<name>."""
    return f"gpu{index}_{name}"


def split_device_column(column: str) -> tuple[int, str] | None:
    """(index, metric name) of a per-GPU column, None for any other column."""
    match = _DEVICE_COLUMN.fullmatch(column)
    if match is None or BY_NAME.get(match.group(2), None) is None \
            or BY_NAME[match.group(2)].source != DEVICE:
        return None
    return int(match.group(1)), match.group(2)


def metric_of(column: str) -> Metric | None:
    """The metric a store column holds (per-GPU columns included); None for a
    column no catalog entry declares (an extra source's)."""
    found = BY_NAME.get(column)
    if found is not None and found.source != DEVICE:
        return found
    device = split_device_column(column)
    return BY_NAME[device[1]] if device else None


def unit_of(column: str) -> str:
    metric = metric_of(column)
    return metric.unit if metric else ""
