"""Starting nbmon's helper processes -- the sampler process
(:mod:`nbmon.sampling.process`) and the notebook's session host
(:mod:`nbmon.notebook.serve`) -- and whether this process has room to start
anything of nbmon's at all (:func:`check_room`, :class:`StartError`).

A helper starts isolated (-I: no current directory, PYTHONPATH or user
site-packages on sys.path; cwd /), so that a notebook opened in a shared
directory where someone planted an ``nbmon/`` or ``numpy/`` never runs their
code; the directories the kernel's own copies of what the helper imports
come from go first on its sys.path, so it starts wherever they came from.
Its environment is the kernel's (CUDA_VISIBLE_DEVICES, the NVML library,
JPY_SESSION_NAME): -I leaves the PYTHON* variables out. It has a session of
its own (a terminal's Ctrl-C, or a kill of the kernel's process group, is
not for it: it stops when told, or when its parent is gone).
"""
from __future__ import annotations

import importlib.util
import json
import os
import resource
import site
import subprocess
import sys

from . import catalog

# nbmon's own helper processes: never part of a watched tree, though they
# are children of the process they watch.
EXCLUDED: set[int] = set()

_BOOT = ("import importlib, json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
         "module, function = sys.argv[2].split(':'); "
         "sys.exit(getattr(importlib.import_module(module), function)(sys.argv[3:]))")


def import_path(names) -> list[str]:
    """Where the helper imports from before its own isolated sys.path: the
    directory each top-level package of ``names`` is found in from this
    process (site-packages, an editable checkout, a PYTHONPATH entry; found,
    not imported), then the user's site-packages if this process has it (a
    user install of an optional one)."""
    paths: list[str] = []
    for name in names:
        module = sys.modules.get(name)
        try:
            spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = getattr(spec, "origin", None)
        if origin and os.path.isabs(origin):
            where = os.path.dirname(origin)
            paths.append(os.path.dirname(where) if spec.submodule_search_locations is not None else where)
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site and user_site in sys.path:
        paths.append(user_site)
    return list(dict.fromkeys(paths))


def spawn(entry: str, args: list[str], imports, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start ``entry`` ("package.module:function", called with ``args``, its
    return value the exit status) in an isolated interpreter that finds
    ``imports`` (and nbmon's plugins) where this process does; its stdin
    and stdout are pipes, and it inherits ``pass_fds`` too."""
    path = import_path((*imports, *catalog.plugin_imports()))
    return subprocess.Popen(
        [sys.executable, "-I", "-c", _BOOT, json.dumps(path), entry, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/",
        close_fds=True, pass_fds=pass_fds, start_new_session=True)


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
