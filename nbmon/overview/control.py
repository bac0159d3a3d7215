"""Interrupt or shut down a kernel of this user, named by a row of the
kernels' table (the ``%resmon kernels`` widget's buttons).

Only a kernel of the table this process read (this user's, by the owner of
its /proc directory) and only the same process (its pid and start time) is
acted on. An interrupt is SIGINT, as Jupyter's own for a kernel whose
interrupt mode is "signal". A shutdown goes through the Jupyter server of
this user that runs the kernel, where one does (``DELETE /api/kernels/<id>``,
with the token from the server's own file in this user's runtime
directory): a kernel killed behind its server's back is restarted by it.
Elsewhere (a kernel started by a script, nbclient) it is SIGTERM. Each
action says in one sentence what was done.
"""
from __future__ import annotations

import json
import os
import signal
import urllib.parse
import urllib.request

from ..private import pid_started

ACTIONS = ("interrupt", "shutdown")
SERVER_FILE_BYTES = 1 << 16   # a server's jpserver-<pid>.json is read up to this much
SERVER_TIMEOUT_S = 5.0


def act(row: dict, action: str) -> str:
    """Do ``action`` (interrupt or shutdown) to the kernel of ``row``, a row
    of a table read by this process; one sentence of what was done."""
    if action not in ACTIONS:
        return f"nbmon: no such action {action!r}; nothing was done."
    name = row["notebook"] or f"kernel {row['kernel_id']}"
    if pid_started(row["pid"]) != row["started"]:
        return f"nbmon: {name} (pid {row['pid']}) has exited; nothing was done."
    if action == "interrupt":
        os.kill(row["pid"], signal.SIGINT)
        return f"nbmon: interrupted {name} (pid {row['pid']})."
    server = _server_running(row["kernel_id"])
    if server is not None:
        _call(server, "DELETE", f"api/kernels/{urllib.parse.quote(row['kernel_id'], safe='')}")
        return f"nbmon: asked its Jupyter server to shut down {name} (pid {row['pid']})."
    os.kill(row["pid"], signal.SIGTERM)
    return f"nbmon: sent SIGTERM to {name} (pid {row['pid']}): no Jupyter server of yours runs it."


def _servers() -> list[dict]:
    """The Jupyter servers of this user that run: their own files in the
    runtime directory, this user's and naming a live process of this user."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime = jupyter_runtime_dir()
        names = sorted(n for n in os.listdir(runtime) if n.startswith("jpserver-") and n.endswith(".json"))
    except (ImportError, OSError):
        return []
    servers = []
    for name in names:
        try:
            with open(os.path.join(runtime, name), "rb") as f:
                if os.fstat(f.fileno()).st_uid != os.getuid():
                    continue
                info = json.loads(f.read(SERVER_FILE_BYTES))
            if os.stat(f"/proc/{int(info['pid'])}").st_uid == os.getuid() and str(info["url"]).startswith("http"):
                servers.append(info)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return servers


def _call(server: dict, method: str, path: str):
    request = urllib.request.Request(server["url"].rstrip("/") + "/" + path, method=method,
                                     headers={"Authorization": f"token {server.get('token', '')}"})
    with urllib.request.urlopen(request, timeout=SERVER_TIMEOUT_S) as reply:   # noqa: S310 - the user's own server
        body = reply.read()
    return json.loads(body) if body else None


def _server_running(kernel_id: str) -> dict | None:
    """The Jupyter server of this user that lists ``kernel_id``, if one does."""
    for server in _servers():
        try:
            if any(k.get("id") == kernel_id for k in _call(server, "GET", "api/kernels")):
                return server
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return None
