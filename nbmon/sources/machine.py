"""Whole-machine figures: CPU, memory, swap, disk, network, load.

CPU and memory are read every sample (on Linux from /proc/stat and
/proc/meminfo through kept-open descriptors). Disk, network and load are
read on a cadence (``slow_every_s``, default 1 s, and at span boundaries);
rates are per second over that cadence, and the samples between two reads
carry NaN for them rather than an older value stamped with a newer time.
"""
from __future__ import annotations

import math
import os
import sys

from .. import catalog
from ..options import SLOW_EVERY_S
from ..values import MIB, NAN
from .procfs import ProcFile

SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors, whatever the device's own size
COUNTERS = ("sys_disk_read_bytes", "sys_disk_write_bytes", "sys_net_sent_bytes", "sys_net_recv_bytes")


class Machine:
    """Samples machine-wide figures. Call :meth:`start` to prime the CPU
    baseline, so that the first sample's CPU % is already meaningful.
    Disk use is of the file system holding ``disk_path``; network counts
    every interface but loopback."""

    name = "machine"
    caller_safe = True  # reads /proc and /sys only: cannot get stuck

    def __init__(self, *, disk_path: str = "/", slow_every_s: float = SLOW_EVERY_S,
                 use_proc: bool | None = None):
        if use_proc is None:
            use_proc = sys.platform.startswith("linux") and os.path.exists("/proc/meminfo")
        self.use_proc = use_proc
        self.fields = catalog.names(catalog.MACHINE)
        self.disk_path = disk_path
        self.slow_every_s = slow_every_s
        self._stat = self._meminfo = self._diskstats = self._net = None
        self._disks: frozenset[bytes] = frozenset()
        self._cpu_busy = self._cpu_total = NAN
        self._cpu_percent = NAN
        self._slow: dict[str, float] = {}
        self._unread: dict[str, float] = {}
        self._read_slow_next = False
        self._last_slow_t = -math.inf
        self._last_counters: tuple[float, ...] | None = None

    def start(self, now: float) -> None:
        if self.use_proc:
            self._stat = ProcFile("/proc/stat")
            self._meminfo = ProcFile("/proc/meminfo")
            self._diskstats = _optional("/proc/diskstats")
            self._net = _optional("/proc/net/dev")
            try:  # whole disks, not partitions (as psutil counts them)
                self._disks = frozenset(name.encode() for name in os.listdir("/sys/block"))
            except OSError:
                self._disks = frozenset()
        self._cpu_busy, self._cpu_total = self._cpu_times()
        # A sample before the first tick shows the average since boot, as
        # vmstat's first line does, rather than nothing.
        self._cpu_percent = self._cpu_busy / self._cpu_total * 100.0 if self._cpu_total > 0 else NAN
        self._refresh_slow(now)
        self._unread = dict.fromkeys(self._slow, NAN)

    def _cpu_times(self) -> tuple[float, float]:
        if self.use_proc:
            line = self._stat.read(256).split(b"\n", 1)[0]
            ticks = [int(x) for x in line.split()[1:9]]
            idle = ticks[3] + ticks[4]  # idle + iowait
            total = sum(ticks)
            return float(total - idle), float(total)
        import psutil

        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return total - idle, total

    def _memory_mb(self) -> tuple[float, float, float]:
        """(total, available, swap used) in MiB."""
        if self.use_proc:
            text = self._meminfo.read(4096)
            return (_meminfo_kb(text, b"MemTotal:") / 1024.0,
                    _meminfo_kb(text, b"MemAvailable:") / 1024.0,
                    (_meminfo_kb(text, b"SwapTotal:") - _meminfo_kb(text, b"SwapFree:")) / 1024.0)
        import psutil

        vm = psutil.virtual_memory()
        return vm.total / MIB, vm.available / MIB, psutil.swap_memory().used / MIB

    def _io_counters(self) -> list[float]:
        """[disk read, disk written, net sent, net received] bytes since boot."""
        if self.use_proc:
            # Kept-open fds read with the GIL held: psutil's opens and reads
            # would each hand the GIL back and forth with a busy main thread.
            return _diskstats(self._diskstats, self._disks) + _net_dev(self._net)
        import psutil

        counters = []
        try:
            disk = psutil.disk_io_counters()
            counters += [float(disk.read_bytes), float(disk.write_bytes)]
        except Exception:  # no disks visible (containers), or no /proc/diskstats
            counters += [NAN, NAN]
        try:
            nics = psutil.net_io_counters(pernic=True)
            counters += [float(sum(n.bytes_sent for name, n in nics.items() if name != "lo")),
                         float(sum(n.bytes_recv for name, n in nics.items() if name != "lo"))]
        except Exception:
            counters += [NAN, NAN]
        return counters

    def boundary(self) -> None:
        """Read the cadence figures in the next sample too."""
        self._read_slow_next = True

    def _refresh_slow(self, now: float) -> None:
        import psutil

        counters = self._io_counters()
        dt = now - self._last_slow_t
        if self._last_counters is not None and dt > 0:
            rates = [(new - old) / dt for new, old in zip(counters, self._last_counters)]
        else:
            rates = [NAN] * len(COUNTERS)
        try:
            disk_percent = float(psutil.disk_usage(self.disk_path).percent)
        except OSError:
            disk_percent = NAN
        try:
            load1 = os.getloadavg()[0]
        except (OSError, AttributeError):  # Windows has no load average
            load1 = NAN
        self._last_counters = tuple(counters)
        self._last_slow_t = now
        self._slow = {
            "sys_disk_used_percent": disk_percent,
            **dict(zip(COUNTERS, counters)),
            **{f"{name}_per_s": rate for name, rate in zip(COUNTERS, rates)},
            "sys_load1": load1,
        }

    def sample(self, now: float) -> dict[str, float]:
        busy, total = self._cpu_times()
        d_total = total - self._cpu_total
        # Clamped: iowait may go backwards (proc(5)), and psutil's float seconds
        # give an unchanged busy time as -1e-9, which the sampler would reject.
        # Without a tick elapsed (an extra sample right after another), repeat
        # the last figure and keep the baseline, so the next sample spans both.
        if d_total > 0:
            self._cpu_percent = min(100.0, max(0.0, (busy - self._cpu_busy) / d_total * 100.0))
            self._cpu_busy, self._cpu_total = busy, total
        if self._read_slow_next or now - self._last_slow_t >= self.slow_every_s:
            self._read_slow_next = False
            self._refresh_slow(now)
            values = self._slow.copy()
        else:
            values = self._unread.copy()
        mem_total, mem_avail, swap_used = self._memory_mb()
        values["sys_cpu_percent"] = self._cpu_percent
        values["sys_mem_used_mb"] = mem_total - mem_avail
        values["sys_mem_available_mb"] = mem_avail
        values["sys_mem_total_mb"] = mem_total
        values["sys_mem_percent"] = (mem_total - mem_avail) / mem_total * 100.0
        values["sys_swap_used_mb"] = swap_used
        return values

    def close(self) -> None:
        for file in (self._stat, self._meminfo, self._diskstats, self._net):
            if file is not None:
                file.close()
        self._stat = self._meminfo = self._diskstats = self._net = None


def _optional(path: str) -> ProcFile | None:
    try:
        return ProcFile(path)
    except OSError:  # no such file here (containers without /proc/diskstats)
        return None


def _diskstats(file: ProcFile | None, disks: frozenset) -> list[float]:
    if file is None or not disks:
        return [NAN, NAN]
    read = written = 0
    for line in file.read().splitlines():
        f = line.split()
        if len(f) > 9 and f[2] in disks:
            read += int(f[5])      # sectors read
            written += int(f[9])   # sectors written
    return [read * float(SECTOR_BYTES), written * float(SECTOR_BYTES)]


def _net_dev(file: ProcFile | None) -> list[float]:
    if file is None:
        return [NAN, NAN]
    sent = received = 0
    for line in file.read().splitlines()[2:]:  # two header lines
        name, _, data = line.partition(b":")
        f = data.split()
        if name.strip() != b"lo" and len(f) >= 9:
            received += int(f[0])
            sent += int(f[8])
    return [float(sent), float(received)]


def _meminfo_kb(text: bytes, key: bytes) -> float:
    at = text.find(key)
    if at < 0:
        return NAN
    return float(text[at + len(key):text.index(b"kB", at)])
