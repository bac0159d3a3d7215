"""What the kernel and its session's helper process say to each other
(:mod:`nbmon.kernel.remote` on the kernel's side, :mod:`nbmon.helper.serve`
on the helper's): the methods of the host the kernel may call
(:data:`CALLS`) or tell without waiting (:data:`NOTES`), and the frames'
payloads.

A frame is ``kind (1 byte) + length (u32) + payload`` (:func:`nbmon.launch.frame`);
a payload is a JSON head (u32 length first) and binary buffers (each u32
length first).
"""
from __future__ import annotations

import inspect
import json
import struct
from typing import Protocol

from ..launch import Frames, frame

_PART = struct.Struct("<I")
class HostCalls(Protocol):
    """What the kernel may ask of its session's host, each answered in plain
    data: :class:`nbmon.helper.host.SessionHost` does it (in the helper, or
    in the kernel), :class:`nbmon.kernel.remote.RemoteHost` sends each call
    over the pipe (``HostError`` when the helper cannot answer)."""

    def hello(self) -> dict: ...
    def start(self, options: dict | None = None, outputs: dict | None = None, force: bool = False,
              owner: str = "") -> dict: ...
    def info(self) -> dict: ...
    def stop(self) -> dict: ...
    def stop_auto(self) -> bool: ...
    def summary(self) -> dict | None: ...
    def status(self, auto: bool) -> str: ...
    def cell_open(self, options: dict | None = None, *, label: str = "", number: int | None = None,
                  meter: bool = False, min_duration_s: float = 0.0, token: str | None = None,
                  kernel_rss_mb: float | None = None) -> dict: ...
    def cell_close(self, token: int | str, status: str = "ok", *, show: str = "", extra_html: str = "",
                   number: int | None = None, variables: dict | None = None) -> dict: ...
    def last_summary(self) -> dict | None: ...
    def history(self) -> list[dict]: ...
    def samples(self) -> dict: ...
    def view_open(self, options: dict | None = None, window_s: float = 600.0, own_output: bool = False) -> dict: ...
    def view_start(self) -> None: ...
    def kernels_view(self) -> dict: ...
    def cluster_begin(self, key: str, t0: float, expected: int, max_bytes: int, every_s: float) -> None: ...
    def cluster_view(self, window_s: float) -> dict: ...
    def cluster_view_start(self) -> None: ...
    def cluster_end(self) -> dict: ...


class HostNotes(Protocol):
    """What the kernel tells its session's host without waiting (the cell
    hooks; a watched Dask cluster's events, from the Dask client's thread)."""

    def cell_started(self, number: int | None, label: str, source: str = "") -> None: ...
    def cell_finished(self, number: int | None, variables: dict | None = None) -> None: ...
    def cell_open_note(self, token: str, number: int | None, min_duration_s: float, kernel_rss_mb: float,
                       options: dict | None = None, label: str = "") -> None: ...
    def cell_close_note(self, token: str, status: str, number: int | None, variables: dict | None) -> None: ...
    def cluster_event(self, envelope: dict, arrived: float) -> None: ...


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(value) for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("_")}


# Each call's and note's signature, which both ends check a message against.
CALLS, NOTES = _methods(HostCalls), _methods(HostNotes)


def check(method: str, args, kwargs, table: dict[str, inspect.Signature]) -> None:
    """TypeError unless ``method(*args, **kwargs)`` is in ``table`` (CALLS or NOTES) and fits its signature."""
    signature = table.get(method)
    if signature is None:
        raise TypeError(f"{method} is no call nor note of the host's")
    signature.bind(None, *args, **kwargs)


def pack(kind: bytes, head, buffers=()) -> bytes:
    text = json.dumps(head, separators=(",", ":")).encode()
    parts = [_PART.pack(len(text)), text]
    for buffer in buffers:
        data = memoryview(buffer).cast("B")   # numpy's buffers count items, not bytes
        parts += [_PART.pack(data.nbytes), data]
    return frame(kind, b"".join(parts))


def unpack(payload: bytes) -> tuple[object, list[bytes]]:
    view = memoryview(payload)
    (size,), at = _PART.unpack_from(view), _PART.size
    head = json.loads(bytes(view[at:at + size]))
    at += size
    buffers = []
    while at < len(view):
        (size,) = _PART.unpack_from(view, at)
        at += _PART.size
        buffers.append(bytes(view[at:at + size]))
        at += size
    return head, buffers


class Reader(Frames):
    """Frames from a pipe: :meth:`read` returns (kind, head, buffers), or
    None at its end (or at a frame no sender of ours would make)."""

    def read(self, deadline: float | None = None):
        got = super().read(deadline)
        return None if got is None else (got[0], *unpack(got[1]))
