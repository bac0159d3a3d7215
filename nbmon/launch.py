"""Starting nbmon's helper processes -- the sampler process
(:mod:`nbmon.sampling.process`) and the notebook's session host
(:mod:`nbmon.helper.serve`) --, the frames both speak on their pipes
(:func:`frame`, :class:`Frames`), and what this process has: whether it has
room to start anything of nbmon's at all (:func:`check_room`,
:class:`StartError`), its resident memory (:func:`resident_mb`).

A helper starts isolated (-I: no current directory, PYTHONPATH or user
site-packages on sys.path; -S: no .pth file runs; cwd /), so that a notebook opened in a shared
directory where someone planted an ``nbmon/`` or ``numpy/`` never runs their
code; the directories the kernel's own copies of what the helper imports
come from go first on its sys.path, so it starts wherever they came from.
Its environment is the kernel's (CUDA_VISIBLE_DEVICES, the NVML library,
JPY_SESSION_NAME): -I leaves the PYTHON* variables out. It has a session of
its own (a terminal's Ctrl-C, or a kill of the kernel's process group, is
not for it: it stops when told, or when its parent is gone).
"""
from __future__ import annotations

from importlib.machinery import PathFinder
import json
import os
import resource
import select
import site
import struct
import subprocess
import sys
import time

from . import catalog

# nbmon's own helper processes: never part of a watched tree, though they
# are children of the process they watch.
EXCLUDED: set[int] = set()

# The helper's first lines: the kernel's own copies of the packages it names
# (``places``: top-level name -> directory) are imported from exactly there;
# everything else from its isolated sys.path (the standard library first),
# then from the kernel's directories (``fallback``: their dependencies).
# -I: no current directory, PYTHONPATH or user site-packages; -S: no site
# module, so no .pth file of any site-packages runs code in the helper.
_FLAGS = ("-I", "-S")
SPAWN_MARK = "\0".join((*_FLAGS, "-c", "")).encode()   # in a helper's /proc/PID/cmdline: a quick first test
_BOOT = ("import importlib, importlib.machinery, json, sys\n"
         "places, fallback = json.loads(sys.argv[1])\n"
         "class Places:\n"
         "    def find_spec(self, name, path=None, target=None):\n"
         "        where = places.get(name)\n"
         "        return importlib.machinery.PathFinder.find_spec(name, [where]) if where else None\n"
         "sys.meta_path.insert(0, Places())\n"
         "sys.path.extend(fallback)\n"
         "module, function = sys.argv[2].split(':')\n"
         "sys.exit(getattr(importlib.import_module(module), function)(sys.argv[3:]))")


def import_places(names) -> tuple[dict[str, str], list[str]]:
    """Where the helper imports ``names`` from: each top-level package's
    directory as this process has it (already imported: where it came
    from; else found on sys.path without the current directory, so that a
    decoy planted in a notebook's directory never runs in the helper; the
    standard library's names are the helper's own), then those
    directories, and the user's site-packages if this process has it (a
    user install of an optional one), for their dependencies."""
    places: dict[str, str] = {}
    for name in names:
        if name in sys.stdlib_module_names:
            continue
        module = sys.modules.get(name)
        try:
            spec = module.__spec__ if module is not None else PathFinder.find_spec(name, catalog.installed_path())
        except (ImportError, ValueError, AttributeError):
            spec = None
        origin = getattr(spec, "origin", None)
        if origin and os.path.isabs(origin):
            where = os.path.dirname(origin)
            places[name] = os.path.dirname(where) if spec.submodule_search_locations is not None else where
    outside = set(catalog.installed_path())
    fallback = [where for where in places.values() if where in outside]
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site and user_site in sys.path:
        fallback.append(user_site)
    return places, list(dict.fromkeys(fallback))


def spawn(entry: str, args: list[str], imports, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start ``entry`` ("package.module:function", called with ``args``, its
    return value the exit status) in an isolated interpreter that finds
    ``imports`` (and nbmon's plugins) where this process does; its stdin
    and stdout are pipes, and it inherits ``pass_fds`` too."""
    places = import_places((*imports, *catalog.plugin_imports()))
    return subprocess.Popen(
        [sys.executable, *_FLAGS, "-c", _BOOT, json.dumps(places), entry, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/",
        close_fds=True, pass_fds=pass_fds, start_new_session=True)


def spawned(argv: list[bytes]) -> bool:
    """Whether a command line (/proc/<pid>/cmdline's fields) is one of
    :func:`spawn`'s: nbmon's own helper processes, seen from outside."""
    flags = [flag.encode() for flag in _FLAGS]
    return argv[1:len(flags) + 3] == [*flags, b"-c", _BOOT.encode()]


# A frame on a helper's pipe: its kind (one byte), its payload's length, the payload.
FRAME = struct.Struct("<cI")
MAX_FRAME = 256 << 20   # plotly's bundle is ~5 MB; anything this large is a broken pipe


def frame(kind: bytes, payload) -> bytes:
    return FRAME.pack(kind, len(payload)) + payload


def write_all(fd: int, data: bytes, deadline: float | None = None) -> None:
    """Write ``data`` whole; to a non-blocking ``fd`` by ``deadline``
    (time.monotonic(); TimeoutError past it, the frame maybe cut)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError from None
            select.select([], [fd], [], left)


class Frames:
    """Frames from a pipe, each whole: :meth:`read` returns (kind, payload),
    or None at the pipe's end (or at a frame no sender of ours would make)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = bytearray()

    def buffered(self) -> bool:
        """Whether a whole frame is here already (read() will not block)."""
        if len(self._buffer) < FRAME.size:
            return False
        return len(self._buffer) >= FRAME.size + FRAME.unpack_from(self._buffer)[1]

    def read(self, deadline: float | None = None) -> tuple[bytes, bytes] | None:
        """The next frame; TimeoutError if none is whole by ``deadline`` (time.monotonic())."""
        while True:
            if len(self._buffer) >= FRAME.size:
                kind, size = FRAME.unpack_from(self._buffer)
                if size > MAX_FRAME:
                    return None
                if len(self._buffer) >= FRAME.size + size:
                    payload = bytes(self._buffer[FRAME.size:FRAME.size + size])
                    del self._buffer[:FRAME.size + size]
                    return kind, payload
            if deadline is not None:
                ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise TimeoutError
            try:
                chunk = os.read(self.fd, 1 << 20)   # blocks without the GIL
            except OSError:
                return None
            if not chunk:
                return None
            self._buffer += chunk


PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def resident_mb(pid: int | str = "self") -> float:
    """A process's resident set (``/proc/<pid>/statm``: microseconds, cheap
    enough for every cell's start, and no import of nbmon's sources in a
    kernel), NaN where unreadable."""
    try:
        fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return int(os.read(fd, 256).split()[1]) * PAGE_MB
        finally:
            os.close(fd)
    except (OSError, IndexError, ValueError):
        return float("nan")


def free_fds() -> tuple[int, int]:
    """(how many descriptors this process may still open, its soft
    RLIMIT_NOFILE); (-1, -1) where that cannot be told (no limit, no fd
    listing), none free when even listing them fails (EMFILE)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return -1, -1
    if soft == resource.RLIM_INFINITY:
        return -1, -1
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, soft - len(os.listdir(listing))), soft
        except FileNotFoundError:
            continue
        except OSError:
            return 0, soft
    return -1, -1


class StartError(RuntimeError):
    """A monitor that could not start, and why, in one sentence: the process
    is out of file descriptors, say. Nothing of that start is left open or
    running; what was watched before goes on."""


MIN_FREE_FDS = 16


def check_room() -> None:
    """Raise :class:`StartError` when this process has fewer than
    MIN_FREE_FDS file descriptors free: a monitor started then would take
    the last ones from the process's own code (and, in a kernel, the one
    that a large message needs: without it the kernel aborts)."""
    free, limit = free_fds()
    if 0 <= free < MIN_FREE_FDS:
        raise StartError(f"nbmon did not start: this process has only {free} of its {limit} file descriptors "
                         f"free (ulimit -n), and nbmon starts only with {MIN_FREE_FDS} free, never to take the last ones")
