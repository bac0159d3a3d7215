"""A real ipykernel for tests that need one and its messages as they are:
started by jupyter_client, one cell at a time.

    with RealKernel() as kernel:
        out = kernel.run("print(1 + 1)")   # stdout; a cell that raises raises KernelError
        kernel.outputs                     # the last cell's display messages
        kernel.error, kernel.reply         # its error message's content (or None), its execute_reply's
"""
from __future__ import annotations

import subprocess

from jupyter_client.manager import start_new_kernel

TIMEOUT_S = 180.0


class KernelError(RuntimeError):
    """The cell raised: its exception's name and value."""


class RealKernel:
    def __init__(self, env: dict | None = None):
        self.km, self.kc = start_new_kernel(kernel_name="python3", stderr=subprocess.DEVNULL,
                                            **({"env": env} if env is not None else {}))
        self.pid = self.km.provisioner.process.pid
        self.outputs: list[dict] = []   # the last cell's display_data / update_display_data contents
        self.stderr = ""
        self.error: dict | None = None
        self.reply: dict = {}

    def __enter__(self) -> "RealKernel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, code: str) -> str:
        """Execute ``code``; its stdout. Its displays are in :attr:`outputs`, its stderr in :attr:`stderr`."""
        # stop_on_error=False: after an error ipykernel < 7 aborts the requests that come
        # within its abort window ("aborted", no error), as a quick next run() may.
        msg_id = self.kc.execute(code, stop_on_error=False)
        out, err, self.outputs, self.error = [], [], [], None
        while True:
            msg = self.kc.get_iopub_msg(timeout=TIMEOUT_S)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                (out if content["name"] == "stdout" else err).append(content["text"])
            elif kind in ("display_data", "update_display_data"):
                self.outputs.append(content)
            elif kind == "error":
                self.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        self.stderr = "".join(err)
        reply = self.kc.get_shell_msg(timeout=TIMEOUT_S)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=TIMEOUT_S)
        self.reply = reply["content"]
        if self.error is not None:
            raise KernelError(f"{self.error['ename']}: {self.error['evalue']}")
        return "".join(out)

    def value(self, expression: str):
        """An expression's value, through its repr (literals only)."""
        import ast

        return ast.literal_eval(self.run(f"print(repr({expression}))").strip())

    def close(self) -> None:
        self.kc.stop_channels()
        # As a user's kernel ends (jupyter_client kills it only if it does not):
        # killed, it would leave its black box, and the next kernel a post-mortem.
        self.km.shutdown_kernel(now=False)
