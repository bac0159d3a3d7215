"""The limits of the container the watched process runs in: its cgroup's
memory limit and usage, OOM kills, and CPU quota (cgroup v2 and v1).

In JupyterHub or Kubernetes the kernel dies when its cgroup reaches its
memory limit, long before the machine runs out: "how close is my kernel to
its limit" is the number that matters. The limit in effect is the smallest
of the cgroup's and its ancestors'; usage is what the kernel compares with
it (page cache included). No limit anywhere reads as NaN.

Figures are read on the slow cadence (and at span boundaries); the samples
in between carry NaN rather than a repeated, older value.
"""
from __future__ import annotations

import math
import os
import time

from .. import catalog
from ..options import SLOW_EVERY_S
from ..values import MIB, NAN

_V1_UNLIMITED = 1 << 62   # v1 writes "no limit" as a page-rounded LONG_MAX
LIMIT_EVERY_S = 10.0      # seconds a cgroup's limits are held before they are read again
_LIMITS: dict[tuple, tuple[float, float]] = {}   # (controller, directory, version): (read at, limit)


def _mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[str | None, dict[str, tuple[str, str]]]:
    """(v2 mount point, {v1 controller: (mount point, mount root)})."""
    v2, v1 = None, {}
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        root, point, kind = fields[3], fields[4], after[0]
        if kind == "cgroup2" and v2 is None:
            v2 = point
        elif kind == "cgroup":
            for option in after[2].split(","):
                if option in ("memory", "cpu"):
                    v1[option] = (point, root)
    return v2, v1


def _relative(path: str, mount_root: str) -> str:
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):]
    return path.lstrip("/")


def cgroup_dirs(pid: int) -> dict[str, str]:
    """{'memory': dir, 'cpu': dir, 'version': '2'|'1'} of the cgroups ``pid`` is in (what is found)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    v2_point, v1 = _mounts()
    found: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and v2_point:
            # A v2 cgroup has a controller's files only where it is enabled
            # (never at the root, which has no limits either).
            base = os.path.join(v2_point, path.lstrip("/"))
            for controller, probe in (("memory", "memory.current"), ("cpu", "cpu.max")):
                if os.path.exists(os.path.join(base, probe)):
                    found.setdefault(controller, base)
                    found.setdefault(controller + "_version", "2")
        else:
            for controller in controllers.split(","):
                if controller in v1:
                    point, root = v1[controller]
                    found[controller] = os.path.join(point, _relative(path, root))
                    found[controller + "_version"] = "1"
    return found


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _number(text: str) -> float:
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return NAN


def _ancestors(dirs: dict[str, str], controller: str):
    """The controller's directory and its parents up to the hierarchy's root."""
    path = dirs.get(controller)
    while path:
        yield path
        parent = os.path.dirname(path)
        if parent == path or not os.path.exists(os.path.join(parent, "cgroup.procs")):
            return
        path = parent


def _held(what: str, dirs: dict[str, str], read) -> float:
    """``read()``, read again only every LIMIT_EVERY_S per cgroup: a limit
    hardly ever changes, and its walk up the hierarchy (two files a level)
    would be most of a cell boundary's sample."""
    key = (what, dirs.get(what), dirs.get(what + "_version"))
    now = time.monotonic()
    held = _LIMITS.get(key)
    if held is None or now - held[0] >= LIMIT_EVERY_S:
        held = _LIMITS[key] = (now, read())
    return held[1]


def cpu_limit(dirs: dict[str, str]) -> float:
    """The CPU quota in CPUs (quota / period; the smallest along the
    hierarchy), NaN when there is none (read every LIMIT_EVERY_S)."""
    return _held("cpu", dirs, lambda: _cpu_limit(dirs))


def _cpu_limit(dirs: dict[str, str]) -> float:
    quotas = []
    for directory in _ancestors(dirs, "cpu"):
        if dirs.get("cpu_version") == "2":
            quota, _, period = _read(os.path.join(directory, "cpu.max")).partition(" ")
        else:
            quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))
            period = _read(os.path.join(directory, "cpu.cfs_period_us"))
        q, p = _number(quota), _number(period)
        if q == q and p == p and q > 0 and p > 0:  # "max" / -1: no quota here
            quotas.append(q / p)
    return min(quotas) if quotas else NAN


class Cgroup:
    """Samples the cgroup limits of process ``pid``. ``dirs`` (for tests on
    a hierarchy that cannot exist here) overrides what /proc says."""

    name = "cgroup"
    caller_safe = True  # reads /proc and /sys only: cannot get stuck

    def __init__(self, pid: int | None = None, *, slow_every_s: float = SLOW_EVERY_S,
                 dirs: dict[str, str] | None = None):
        self.pid = os.getpid() if pid is None else pid
        self.fields = catalog.names(catalog.CGROUP)
        self.slow_every_s = slow_every_s
        self._given = dirs
        self.dirs: dict[str, str] = {}
        self._last_t = -math.inf
        self._empty = dict.fromkeys(self.fields, NAN)

    def start(self, now: float) -> None:
        self.dirs = dict(self._given) if self._given is not None else cgroup_dirs(self.pid)

    def boundary(self) -> None:
        self._last_t = -math.inf

    def sample(self, now: float) -> dict[str, float]:
        if now - self._last_t < self.slow_every_s:
            return self._empty
        self._last_t = now
        return {"cgroup_mem_used_mb": self._memory_used() / MIB,
                "cgroup_mem_limit_mb": self._memory_limit() / MIB,
                "cgroup_oom_kills": self._oom_kills(),
                "cgroup_cpu_limit_cpus": cpu_limit(self.dirs)}

    def _v2(self, controller: str) -> bool:
        return self.dirs.get(controller + "_version") == "2"

    def _memory_used(self) -> float:
        name = "memory.current" if self._v2("memory") else "memory.usage_in_bytes"
        directory = self.dirs.get("memory")
        return _number(_read(os.path.join(directory, name))) if directory else NAN

    def _memory_limit(self) -> float:
        def read() -> float:
            name = "memory.max" if self._v2("memory") else "memory.limit_in_bytes"
            limits = [_number(_read(os.path.join(d, name))) for d in _ancestors(self.dirs, "memory")]
            limits = [x for x in limits if x == x and x < _V1_UNLIMITED]  # "max" parses as NaN
            return min(limits) if limits else NAN

        return _held("memory", self.dirs, read)

    def _oom_kills(self) -> float:
        name = "memory.events" if self._v2("memory") else "memory.oom_control"
        directory = self.dirs.get("memory")
        if not directory:
            return NAN
        for line in _read(os.path.join(directory, name)).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return _number(value)
        return NAN

    def close(self) -> None:
        pass


class OwnGroup:
    """A memory cgroup of its own for what ``nbmon run --cgroup`` starts.

    The kernel then keeps the whole tree's exact peak -- every page once,
    page cache included (v2 ``memory.peak``, v1 ``memory.max_usage_in_bytes``)
    -- without any process's high-water mark being touched. It is made below
    nbmon's own memory cgroup with the limit in effect copied into it, so
    that the command reads the limit it would have read (JVMs and Go size
    their heaps by it); what does change for the command is its cgroup
    (``/proc/self/cgroup``), which is why this is asked for, not done by
    default. :meth:`make` returns None, with the reason in ``why``, where
    no group can be made (no rights; v2 without the memory controller
    delegated to nbmon's cgroup)."""

    why = ""

    def __init__(self, path: str, parent: str, version: str):
        self.path, self.parent, self.version = path, parent, version
        self._procs_fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    @classmethod
    def make(cls) -> "OwnGroup | None":
        dirs = cgroup_dirs(os.getpid())
        parent, version = dirs.get("memory"), dirs.get("memory_version")
        if not parent:
            cls.why = "no memory cgroup here"
            return None
        if version == "2" and "memory" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
            cls.why = f"the memory controller is not delegated below {parent}"
            return None
        container = Cgroup(dirs=dirs)
        container.start(0.0)
        limit = container._memory_limit()
        path = os.path.join(parent, f"nbmon-run-{os.getpid()}")
        try:
            os.mkdir(path, 0o755)
        except OSError as err:
            cls.why = f"cannot make a cgroup in {parent}: {err.strerror}"
            return None
        try:
            if limit == limit:
                with open(os.path.join(path, "memory.max" if version == "2" else "memory.limit_in_bytes"), "w") as f:
                    f.write(str(int(limit)))
            return cls(path, parent, version)
        except OSError as err:
            os.rmdir(path)
            cls.why = f"cannot set up the cgroup {path}: {err.strerror}"
            return None

    def enter(self) -> None:
        """Move the calling process into the group (``Popen(preexec_fn=...)``:
        the command is in it before its first allocation)."""
        os.write(self._procs_fd, b"0")

    def peak_mb(self) -> float:
        name = "memory.peak" if self.version == "2" else "memory.max_usage_in_bytes"
        return _number(_read(os.path.join(self.path, name))) / MIB

    def close(self) -> str:
        """Give what still runs in the group back to nbmon's own cgroup and
        remove the group; returns a sentence when it could not be removed."""
        os.close(self._procs_fd)
        for pid in _read(os.path.join(self.path, "cgroup.procs")).split():
            try:
                with open(os.path.join(self.parent, "cgroup.procs"), "w") as f:
                    f.write(pid)
            except OSError:
                pass  # exited meanwhile
        for _ in range(100):  # a process just moved out can keep it busy for an instant
            try:
                os.rmdir(self.path)
                return ""
            except OSError as err:
                error = err
                time.sleep(0.01)
        return f"could not remove the cgroup {self.path}: {error.strerror}"
