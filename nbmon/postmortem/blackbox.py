"""The black box: the last minute of a kernel's figures in a small file that
outlives the kernel, so that the next kernel can say why this one died
(:mod:`nbmon.postmortem.deaths`).

While the notebook's monitor runs, each kernel keeps one file,
``<private dir>/boxes/<pid>-<start>-<boot>.box`` (the 0700 per-user
directory of :mod:`nbmon.private`; never a shared one). It is removed when
the monitor stops or the kernel exits normally; a box whose kernel is gone
is what a death leaves behind.

The file has a fixed size (8,184 bytes for its 8 fields) and is only ever
written in place with ``pwrite``, each part with its own CRC-32:

- a header (2,048 bytes): ``NBMONBOX``, the JSON's length and CRC, and a
  JSON object saying whose box it is (pid, start time, boot, pid namespace,
  uid), where it ran (host, notebook, working directory, memory cgroup) and
  the names of the record's fields (a notebook name too long to fit is cut,
  and the whole name's SHA-256 kept beside it);
- the running cell (256 bytes): CRC, change count, prompt number, running
  or not, when it started, its label;
- a ring of 64 records, one a second: CRC, sequence number, wall time, one
  float64 per field (NaN: unknown);
- the variables held (248 bytes): CRC, change count, length, and a JSON
  object: the largest variables of the kernel's namespace as of the last
  cell that ended (:meth:`nbmon.report.variables.Variables.for_box`), so that the
  post-mortem says what was large before the fatal cell.

A record holds its second's statistic of each field over every sample taken
in it (the highest memory, the lowest available memory, the mean CPU), so a
spike between two records is not lost; the container's figures are the
memory warning's reads (:mod:`nbmon.postmortem.memwarn`). While the memory is near the
warning threshold (within 20 points, or heading there fast) both read four
times a second and the current second's record is rewritten at each read,
so the last record before an OOM kill is at most 0.25 s old. Every part is one small ``pwrite`` into the
page cache: a process killed at any moment leaves each part whole.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import socket
import struct
import threading
import time
import weakref
import zlib
from dataclasses import dataclass

import numpy as np

from .. import catalog
from ..private import open_private, pid_running, pid_started, private_dir
from ..sources.procfs import BUDGET

VERSION = 2               # 2: the variables held
VERSIONS = (1, VERSION)   # read back: a box of nbmon before 2 (no variables held) still tells its death
MAGIC = b"NBMONBOX"
HEADER_SIZE = 2048
CELL_SIZE = 256
SLOTS = 64                 # records: about a minute at one a second
RECORD_EVERY_S = 1.0
CHECK_EVERY_S = 0.25       # near the warning threshold: the record rewritten this often
MAX_FIELDS = 16
LABEL_BYTES = 200
HELD_SIZE = 248            # the box stays under 8 KiB
NAME_CHARS = 24            # a variable's name in the box: longer ones lose their middle
SUFFIX = ".box"
WRITING = ".new"   # a box being created: hidden (a leading dot) until renamed
NOTEBOOK_HASH = "notebook_sha256"   # in a header whose notebook name had to be cut: the whole name's

_HEAD = struct.Struct("<8sII")          # magic, JSON length, JSON CRC
_CELL = struct.Struct("<IQqBdH")        # CRC, change count, number, running, started, label length
_RECORD_HEAD = struct.Struct("<IIQd")   # CRC, unused, sequence number, wall time
_HELD = struct.Struct("<IQH")           # CRC, change count, JSON length


def _tree_memory() -> str:
    # The tree's headline memory: the one the live chart draws as the kernel's.
    return next(m.name for m in catalog.METRICS if m.source == catalog.TREE and m.chart == "memory")


# (column, how a second's samples become its record)
FIELDS: tuple[tuple[str, str], ...] = (
    (_tree_memory(), "max"),
    ("proc_cpu_percent", "mean"),
    ("cgroup_mem_used_mb", "max"),
    ("cgroup_mem_limit_mb", "last"),
    ("cgroup_oom_kills", "max"),
    ("sys_mem_available_mb", "min"),
    ("sys_mem_total_mb", "last"),
    ("gpu_mem_used_mb", "max"),
)
NAMES = tuple(name for name, _ in FIELDS)
STATS = tuple(stat for _, stat in FIELDS)
CONTAINER = ("cgroup_mem_used_mb", "cgroup_mem_limit_mb", "cgroup_oom_kills")


def record_struct(fields: int) -> struct.Struct:
    return struct.Struct(_RECORD_HEAD.format + "d" * fields)


def _ring_end(fields: int) -> int:
    return HEADER_SIZE + CELL_SIZE + SLOTS * record_struct(fields).size


def box_size(fields: int, version: int = VERSION) -> int:
    return _ring_end(fields) + (HELD_SIZE if version >= 2 else 0)


class BadBox(ValueError):
    """A file that is not a whole black box of this version."""


def boot_id() -> str:
    """This boot's id (a pid and start time name one process within one boot only)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's pid namespace ('pid:[4026531836]'): pids mean nothing in another one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def box_dir() -> str:
    """The directory of the black boxes (made as needed); UnsafePath or
    another OSError when it cannot be had safely."""
    return private_dir("boxes")


def notebook_name() -> str:
    """The notebook this kernel runs for, as the Jupyter server says
    (``JPY_SESSION_NAME``); '' outside a notebook server."""
    return os.environ.get("JPY_SESSION_NAME", "")


# -- the running cell ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cell:
    """A cell as the box keeps it: its prompt number (None: unknown), label,
    whether it was running, and when it started (epoch s; NaN: unknown)."""

    number: int | None
    label: str
    running: bool
    started: float


IDLE = Cell(None, "", False, math.nan)


class CellNote:
    """The kernel's running cell, as the notebook's cell hooks tell it, and
    its largest variables as the last cell ended. The open boxes write each
    change at once: a cell that dies at its first allocation is still the
    one named."""

    def __init__(self):
        self.cell = IDLE
        self.changes = 0
        self.held: dict | None = None   # the variables held as of the last cell that ended
        self.held_changes = 0
        self.source = ""   # the running (or last) cell's source digest: what the memory guard remembers it by
        self._boxes: "weakref.WeakSet[BlackBox]" = weakref.WeakSet()

    def started(self, number: int | None, label: str, source: str = "") -> None:
        self.source = source
        self._set(Cell(number, label, True, time.time()))

    def finished(self) -> None:
        cell = self.cell
        self._set(Cell(cell.number, cell.label, False, cell.started))

    def running(self) -> tuple[int | None, float, str] | None:
        """The running cell's identity (number, start, source digest), None between cells."""
        cell = self.cell
        return (cell.number, cell.started, self.source) if cell.running else None

    def hold(self, held: dict) -> None:
        """The kernel's largest variables as a cell ended (plain data:
        :meth:`nbmon.report.variables.Variables.for_box`); the open boxes write them now."""
        self.held = held
        self.held_changes += 1
        for box in list(self._boxes):
            box.write_held()

    def watch(self, box: "BlackBox") -> None:
        self._boxes.add(box)

    def unwatch(self, box: "BlackBox") -> None:
        self._boxes.discard(box)

    def _set(self, cell: Cell) -> None:
        # Called on the kernel's main thread only (IPython's cell hooks).
        self.cell = cell
        self.changes += 1
        for box in list(self._boxes):
            box.write_cell()


# -- the file format ---------------------------------------------------------------------


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def notebook_hash(name: str) -> str:
    # Imported here: only a path too long for the header needs it, and hashlib
    # loads OpenSSL's libcrypto (1.4 MiB of the helper's PSS).
    import hashlib

    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def encode_header(header: dict) -> bytes:
    room = HEADER_SIZE - _HEAD.size
    text = json.dumps(header, separators=(",", ":")).encode()
    for key in ("cwd", "notebook"):  # very long paths lose their middle, never the header its end
        if len(text) > room:
            value = header[key]
            if len(value) > 121:
                header = {**header, key: value[:60] + "\u2026" + value[-60:]}
                if key == "notebook":   # matched by its hash from then on (postmortem)
                    header[NOTEBOOK_HASH] = notebook_hash(value)
            text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > room:
        raise ValueError(f"a black box header of {len(text)} bytes does not fit in {room}")
    return (_HEAD.pack(MAGIC, len(text), _crc(text)) + text).ljust(HEADER_SIZE, b"\0")


def encode_cell(cell: Cell, changes: int) -> bytes:
    label = cell.label.encode("utf-8", "replace")[:LABEL_BYTES].decode("utf-8", "ignore").encode()
    number = -1 if cell.number is None else cell.number
    body = _CELL.pack(0, changes, number, cell.running, cell.started, len(label))[4:] + label
    return (struct.pack("<I", _crc(body)) + body).ljust(CELL_SIZE, b"\0")


def encode_record(layout: struct.Struct, seq: int, wall: float, values) -> bytes:
    body = layout.pack(0, 0, seq, wall, *values)[4:]
    return struct.pack("<I", _crc(body)) + body


def encode_held(held: dict, changes: int) -> bytes:
    """The variables' section: as many of the largest as fit, names shortened."""
    largest = [[_short(v[0]), *v[1:]] for v in held.get("largest", [])]
    room = HELD_SIZE - _HELD.size
    while True:   # without any, a few numbers: they fit
        text = json.dumps({**held, "largest": largest}, separators=(",", ":")).encode()
        if len(text) <= room or not largest:
            break
        largest.pop()
    body = _HELD.pack(0, changes, len(text))[4:] + text
    return (struct.pack("<I", _crc(body)) + body).ljust(HELD_SIZE, b"\0")


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:11] + "\u2026" + name[-12:]


def _decode_held(chunk: bytes) -> dict | None:
    """The variables' section's JSON object; None if never written, damaged or not an object."""
    crc, _changes, length = _HELD.unpack_from(chunk)
    end = _HELD.size + length
    if length == 0 or end > len(chunk) or _crc(chunk[4:end]) != crc:
        return None
    try:
        held = json.loads(chunk[_HELD.size:end])
    except ValueError:
        return None
    return held if isinstance(held, dict) else None


@dataclass(frozen=True, slots=True)
class Record:
    seq: int
    wall: float
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class Box:
    """A black box as read back: ``header`` (validated: pid, started, boot,
    pid_ns, uid, created, notebook, cwd, host, cgroup, fields), the ``cell``,
    the ``records`` oldest first, how many slots failed their checksum, and
    the variables ``held`` as of the last cell that ended (None: unknown)."""

    path: str
    header: dict
    cell: Cell
    records: tuple[Record, ...]
    damaged: int
    held: dict | None = None


_HEADER_TYPES = {"version": int, "pid": int, "started": int, "boot": str, "pid_ns": str, "uid": int,
                 "created": float, "notebook": str, "cwd": str, "host": str, "cgroup": dict, "fields": list}


def decode(data: bytes, path: str = "") -> Box:
    """The box in ``data``; :class:`BadBox` saying what is wrong otherwise."""
    if len(data) < HEADER_SIZE + CELL_SIZE:
        raise BadBox(f"{len(data)} bytes: truncated")
    magic, length, crc = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise BadBox("not a black box (no NBMONBOX mark)")
    text = data[_HEAD.size:_HEAD.size + length]
    if length > HEADER_SIZE - _HEAD.size or _crc(text) != crc:
        raise BadBox("its header is damaged (checksum)")
    try:
        header = json.loads(text)
    except ValueError:
        raise BadBox("its header is not JSON") from None
    header = _checked_header(header)
    layout = record_struct(len(header["fields"]))
    size = box_size(len(header["fields"]), header["version"])
    if len(data) != size:
        raise BadBox(f"{len(data)} bytes, not {size}: truncated or grown")
    cell = _decode_cell(data[HEADER_SIZE:HEADER_SIZE + CELL_SIZE])
    records, damaged = [], 0
    for slot in range(SLOTS):
        chunk = data[HEADER_SIZE + CELL_SIZE + slot * layout.size:][:layout.size]
        crc, _, seq, wall, *values = layout.unpack(chunk)
        if seq == 0 and not any(chunk[4:]):
            continue  # never written
        if _crc(chunk[4:]) != crc or not math.isfinite(wall):
            damaged += 1
            continue
        records.append(Record(seq, wall, {name: v if math.isfinite(v) else math.nan
                                          for name, v in zip(header["fields"], values)}))
    records.sort(key=lambda r: r.seq)
    # A ring holds one record per sequence number of its last SLOTS: older ones are leftovers.
    newest = records[-1].seq if records else 0
    records = [r for r in records if r.seq > newest - SLOTS]
    held = _decode_held(data[_ring_end(len(header["fields"])):]) if header["version"] >= 2 else None
    return Box(path, header, cell, tuple(records), damaged, held)


def _checked_header(header) -> dict:
    if not isinstance(header, dict):
        raise BadBox("its header is not a JSON object")
    if header.get("version") not in VERSIONS:
        raise BadBox(f"written by another version of nbmon (box version {header.get('version')!r})")
    for key, kind in _HEADER_TYPES.items():
        value = header.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = header[key] = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BadBox(f"its header's {key!r} is {value!r}, not a {kind.__name__}")
    fields = header["fields"]
    if not 0 < len(fields) <= MAX_FIELDS or not all(isinstance(f, str) and 0 < len(f) <= 64 for f in fields):
        raise BadBox("its header lists no valid fields")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in header["cgroup"].items()):
        raise BadBox("its header's cgroup is not a table of names")
    if header["pid"] <= 0 or header["started"] < 0:
        raise BadBox(f"its header names no process (pid {header['pid']}, start {header['started']})")
    guard = header.setdefault("guard", None)   # boxes before the guard have none
    if not (guard is None or guard == "auto" or (isinstance(guard, (int, float)) and not isinstance(guard, bool))):
        raise BadBox(f"its header's 'guard' is {guard!r}, not a setting of the memory guard")
    return header


def _decode_cell(chunk: bytes) -> Cell:
    crc, _changes, number, running, started, length = _CELL.unpack_from(chunk)
    body_end = _CELL.size + length
    if length > LABEL_BYTES or _crc(chunk[4:body_end]) != crc:
        raise BadBox("its cell record is damaged (checksum)")
    label = chunk[_CELL.size:body_end].decode("utf-8", "replace")
    return Cell(None if number < 0 else number, label, bool(running),
                started if math.isfinite(started) else math.nan)


def read_box(path: str) -> Box:
    """Read and check the box at ``path``: a regular file of this user's
    (opened without following a link; see :func:`nbmon.private.open_private`)
    of a black box's size and form; :class:`BadBox` or an OSError
    (:class:`~nbmon.private.UnsafePath` among them) otherwise."""
    fd = open_private(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        data = os.pread(fd, box_size(MAX_FIELDS) + 1, 0)
    finally:
        os.close(fd)
    return decode(data, path)


# -- the writer --------------------------------------------------------------------------


_FOLD = {"max": max, "min": min}


class _Second:
    """One second's statistic of each field (``stats``: "max", "min", "mean"
    or "last"), folded from the samples taken in it. Plain Python: a few
    numbers a second cost less so than through numpy's calls."""

    def __init__(self, stats: tuple[str, ...]):
        self.stats = stats
        self.value = [math.nan] * len(stats)
        self.n = [0] * len(stats)

    def add(self, columns) -> None:
        """``columns``: each field's values in the new samples (NaN: not read)."""
        for i, (stat, values) in enumerate(zip(self.stats, columns)):
            known = [v for v in values if v == v]
            if not known:
                continue
            old, n = self.value[i], self.n[i]
            if stat == "last":
                self.value[i] = known[-1]
            elif stat == "mean":
                self.value[i] = ((old * n if n else 0.0) + sum(known)) / (n + len(known))
            else:
                fold = _FOLD[stat]
                self.value[i] = fold(known) if n == 0 else fold(old, fold(known))
            self.n[i] = n + len(known)


# Every box made in this process, open or not: the exit hook closes each for good, one
# being opened on the consumers' thread included (it waits for that box's lock).
_every_box: "weakref.WeakSet[BlackBox]" = weakref.WeakSet()


class BlackBox:
    """A consumer that keeps the kernel's black box (see the module's
    docstring) while its monitor runs, and removes it when the run ends.

    ``cell`` is the kernel's :class:`CellNote`; ``memory`` (a
    :class:`nbmon.postmortem.memwarn.MemoryWatch` attached before this box) gives the
    container's memory four times a second (the store has it once a second)
    and says when it is near the limit. A box that cannot be written fails
    once, as the monitor's fault ``BlackBox`` (``%resmon status``), and then
    stays quiet: the kernel runs on without a post-mortem. It holds one file
    descriptor while the run lasts, from nbmon's fd budget
    (:data:`~nbmon.sources.procfs.BUDGET`); beyond it, the file is opened
    for each write."""

    name = "BlackBox"
    at_start = True

    def __init__(self, cell: CellNote, memory=None, *, notebook: str | None = None, pid: int | None = None,
                 guard: float | str | None = None):
        self.pid = os.getpid() if pid is None else pid   # the kernel's (the box may be kept by its helper)
        self.cell = cell
        self.memory = memory
        self.guard = guard   # the memory guard's setting (Options.memory_guard_percent), for the post-mortem
        self.notebook = notebook_name() if notebook is None else notebook
        self.path: str | None = None
        self.writes = 0
        self._fd: int | None = None   # kept open (None: opened for each write)
        self._store = None
        self._broken = False
        self._exited = False   # the interpreter is exiting: closed for good
        self._error: OSError | None = None   # a failed cell write, said at the next consume
        self._lock = threading.Lock()
        self._layout = record_struct(len(NAMES))
        self._second = _Second(STATS)
        self._second_t0 = 0.0
        self._seq = 0
        self._cursor = 0
        self._started: int | None = None   # the watched process's start time: its identity
        self._take: list[int | None] = []   # each field's row in the store's samples (None: not there)
        self._rows = np.zeros(0, dtype=int)
        self._container_at = [NAMES.index(c) for c in CONTAINER]
        self._container = [math.nan] * len(CONTAINER)   # this second's: highest usage, last limit, most kills
        _every_box.add(self)

    @property
    def _near(self) -> bool:
        return self.memory is not None and self.memory.near

    @property
    def every_s(self) -> float:
        """Once a second; four times a second while the memory is near the
        warning threshold (the consumers' thread reads it before each call)."""
        return CHECK_EVERY_S if self._near else RECORD_EVERY_S

    # -- the consumer --------------------------------------------------------
    def consume(self, store, final: bool) -> None:
        with self._lock:
            if self._broken or self._exited:
                return
            try:
                if self._error is not None:
                    raise self._error
                if store is not self._store or self.path is None:
                    self._open(store)
                self._fold_container()
                now = time.monotonic()
                rolled = now - self._second_t0 >= RECORD_EVERY_S - CHECK_EVERY_S / 2
                if self.pid != os.getpid() and not pid_running(self.pid, self._started):
                    # Kept by the kernel's helper, which outlives it a moment: the box ends
                    # with the kernel's last sign of life (its OOM kill not counted in it).
                    return
                # The samples are folded and the record written once a second, or at
                # every check while the memory is near the warning threshold.
                if rolled or self._near:
                    self._fold(store)
                    self._write_record()
                if rolled:
                    self._seq += 1
                    self._second = _Second(STATS)
                    self._container = [math.nan] * len(CONTAINER)
                    self._second_t0 = now
            except (OSError, ValueError) as err:
                self._broken = True
                self._close_locked()
                raise OSError(f"the black box could not be written ({err}); "
                              f"this kernel will have no post-mortem") from err

    def close(self, exiting: bool = False) -> None:
        """The run ended: the box goes (the kernel did not die). ``exiting``:
        for good, since the consumers' thread (a daemon) may still call
        consume() before the interpreter stops it, and would open a new box
        that no one removes: a normal exit read as a death."""
        with self._lock:
            self._close_locked()
            self._exited = self._exited or exiting

    # -- the file ----------------------------------------------------------------
    def _open(self, store) -> None:
        self._close_locked()
        pid = self.pid
        header = {"version": VERSION, "pid": pid, "started": pid_started(pid), "boot": boot_id(),
                  "pid_ns": pid_namespace(), "uid": os.geteuid(), "created": time.time(),
                  "notebook": self.notebook, "cwd": _cwd(pid), "host": socket.gethostname(),
                  "cgroup": self.memory.cgroup if self.memory is not None else {},
                  "fields": list(NAMES), "guard": self.guard}
        if header["started"] is None:
            raise OSError(f"cannot read this process's start time from /proc/{pid}/stat")
        name = f"{pid}-{header['started']}-{header['boot'][:8]}{SUFFIX}"
        directory = box_dir()
        path, being_written = os.path.join(directory, name), os.path.join(directory, f".{name}{WRITING}")
        # Written under a hidden name and renamed: a reader never sees a box without its header.
        fd = open_private(being_written, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            size = box_size(len(NAMES))
            os.posix_fallocate(fd, 0, size)   # a full disk fails here, not at a later write
            os.pwrite(fd, encode_header(header).ljust(size, b"\0"), 0)
            os.rename(being_written, path)
        except BaseException:
            os.close(fd)
            _remove(being_written)
            raise
        if not BUDGET.take(1):
            os.close(fd)
            fd = None
        self._fd, self.path, self._store, self._started = fd, path, store, header["started"]
        # The first consume writes a record at once: a kernel that dies in its first second has one.
        self._cursor, self._seq, self._second_t0 = 0, 1, -math.inf
        self._second = _Second(STATS)
        columns = store.columns
        present = [n for n in NAMES if n in columns]   # no GPU, no cgroup: not there
        self._rows = np.array([columns.index(n) for n in present], dtype=int)
        self._take = [present.index(n) if n in present else None for n in NAMES]
        self.cell.watch(self)
        self._write_cell_locked()
        if self.cell.held is not None:
            self._write_held_locked()

    def _fold_container(self) -> None:
        reading = self.memory.container if self.memory is not None else None
        if reading is not None:
            used, limit, kills = reading
            old_used, _, old_kills = self._container
            self._container = [max(used, old_used) if old_used == old_used else used, limit,
                               max(kills, old_kills) if old_kills == old_kills else kills]

    def _fold(self, store) -> None:
        _t, _wall, rows, self._cursor, _lost = store.rows_since(self._cursor)
        picked = rows[self._rows].tolist()
        self._second.add([picked[j] if j is not None else () for j in self._take])

    def _write_record(self) -> None:
        values = list(self._second.value)
        # The store's container figures (once a second) and the warning's own reads, together.
        for at, reading, fold in zip(self._container_at, self._container, (max, None, max)):
            if reading == reading:
                values[at] = reading if fold is None or values[at] != values[at] else fold(values[at], reading)
        record = encode_record(self._layout, self._seq, time.time(), values)
        offset = HEADER_SIZE + CELL_SIZE + (self._seq % SLOTS) * self._layout.size
        self._pwrite(record, offset)
        self.writes += 1

    def _pwrite(self, data: bytes, offset: int) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, data, offset)
            return
        fd = open_private(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def write_cell(self) -> None:
        """Write the running cell now (called from the cell hooks' thread)."""
        self._write_now(self._write_cell_locked)

    def write_held(self) -> None:
        """Write the variables held now (called as a cell ends)."""
        self._write_now(self._write_held_locked)

    def _write_now(self, write) -> None:
        with self._lock:
            if self.path is None or self._broken:
                return
            try:
                write()
            except OSError as err:
                self._error = err   # said at the next consume, on the monitor's thread
                self._close_locked()

    def _write_cell_locked(self) -> None:
        self._pwrite(encode_cell(self.cell.cell, self.cell.changes), HEADER_SIZE)

    def _write_held_locked(self) -> None:
        os.pwrite(self._fd, encode_held(self.cell.held, self.cell.held_changes), _ring_end(len(NAMES)))

    def _close_locked(self) -> None:
        fd, path = self._fd, self.path
        self._fd = self.path = self._store = None
        if path is not None:
            _remove(path)
        if fd is not None:
            os.close(fd)
            BUDGET.give_back(1)
        self.cell.unwatch(self)


def _cwd(pid: int) -> str:
    try:
        return os.getcwd() if pid == os.getpid() else os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@atexit.register
def _remove_at_exit() -> None:
    """A kernel that exits normally leaves no box (the consumers' thread is a
    daemon: its close() would not run)."""
    for box in list(_every_box):
        box.close(exiting=True)


def _forget_in_child() -> None:
    # A forked child is not the kernel: it never writes nor removes the kernel's box.
    for box in list(_every_box):
        box._lock = threading.Lock()
        fd, box._fd, box.path, box._store = box._fd, None, None, None
        box._broken = True
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    _every_box.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
