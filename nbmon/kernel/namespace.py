"""The user's namespace, sized at each cell's end in the kernel: which
variables the cell made, grew or freed, and the largest the kernel holds
(:mod:`nbmon.report.variables` is the report; the session's host shows it).

It runs in the kernel after every cell while a monitor with ``variables``
on runs, so it reads only what objects report about themselves and keeps
nothing of them:

- a size is an object's own report (``ndarray.nbytes``, a tensor's storage,
  a DataFrame's blocks, ``sys.getsizeof`` of bytes and str), never a guess;
  an object of any other class counts as not sized;
- a library's types are looked up in ``sys.modules``: nothing is imported,
  and a library the user has not imported costs nothing;
- no code of the user's runs: types are matched on ``type(value)``'s MRO,
  read through ``type``'s own descriptors, never with ``isinstance`` (a
  proxy's ``__class__`` could run code); a value whose metaclass has a hash,
  equality or attribute lookup of its own, or a name that is not a plain
  ``str``, is not sized; a library's sizer takes the library's own classes
  only (a user's subclass may override any property it reads), but for
  torch's modules, read from their own tables; only the exact built-in
  containers are walked (one level deep, :data:`MAX_ITEMS` elements each),
  and tensor subclasses other than parameters are left unsized (their
  ``__torch_function__`` could run code);
- a size is what memory holds: an array's span (a zero-stride view is its
  element), nothing for a file mapping (``np.memmap``) or a tensor with no
  storage (on the meta device), at most the machine's memory, and the
  survey ends after :data:`SURVEY_DEADLINE_S` of CPU (the names left are counted as
  not sized, and the next survey starts afresh);
- a buffer is known by its address (an array's data, a tensor's storage)
  or by the id of the object that owns it, so one that several names reach
  (views, a DataFrame over an array) is counted once;
- what stays between cells is names, kinds, buffer keys and sizes, in
  dicts of strings and ints, which the cyclic garbage collector does not
  even track: no reference to a user's object outlives the survey.
"""
from __future__ import annotations

import gc
import heapq
import mmap
import os
import sys
import time
import types
from itertools import islice
from operator import itemgetter

from ..format import printable
from ..report.variables import TOP, Var, Variables

MAX_ITEMS = 256        # a container's elements looked at; beyond them its size is a lower bound
MAX_WALKED = 4096      # elements looked at in one survey, all containers together
MAX_TENSORS = 10_000   # a module's parameters and buffers looked at
SURVEY_DEADLINE_S = 0.05   # a survey's CPU time: the names left are counted as not sized
DEADLINE_EVERY = 256       # names sized between two looks at the clock
try:   # no buffer is larger than the machine's memory (a size past it is an object's own claim)
    MAX_BYTES = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError):
    MAX_BYTES = 1 << 50

# Read through type's own descriptors: a metaclass's property or
# __getattribute__ is never called.
_mro = type.__dict__["__mro__"].__get__
_class_dict = type.__dict__["__dict__"].__get__
_class_name = type.__dict__["__name__"].__get__
_class_module = type.__dict__["__module__"].__get__
# What a metaclass may define for its classes to be hashed, compared and read here.
_META_HOOKS = ("__hash__", "__eq__", "__getattribute__", "__getattr__", "__mro__", "__name__", "__module__")

# Neither sized nor "not sized": values that hold no data worth naming.
_IGNORED = frozenset({int, float, complex, bool, type(None), type(...), type(NotImplemented), range, slice,
                      types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
                      types.BuiltinMethodType, types.MethodWrapperType, types.WrapperDescriptorType,
                      staticmethod, classmethod, property})
_CONTAINERS = frozenset((list, tuple, dict, set, frozenset))
_BYTES_LIKE = (bytes, bytearray)
_MISSING = object()
_RENAMED = {"ArrayImpl": "Array"}   # JAX's arrays, as its users know them (jax.Array)


class _NotSized(Exception):
    """A sizer's answer for a value that holds no memory of its own to count (a file mapping)."""


def _library(kind: type) -> str:
    """The top-level package that defines ``kind`` ('' if unknown)."""
    module = _class_module(kind)
    return module.partition(".")[0] if type(module) is str else ""


def _plain(value):
    # bytes, bytearray, str: the object is its own buffer (getsizeof: header and data, exact).
    return [(id(value), sys.getsizeof(value), True)], "", False


class Sizers:
    """How to size each type, for the libraries imported now. ``leaf(kind)``:
    the sizer of a type (None: not sized, :data:`_IGNORED`: skip); a sizer
    returns (buffers, device, at_least), buffers as [(key, bytes, direct)]
    where ``direct`` says the object owns that buffer (not a view of it)."""

    def __init__(self):
        self.exact = {bytes: _plain, bytearray: _plain, str: _plain, memoryview: self._memoryview}
        # (a library's class, its sizer, whether its subclasses anywhere take it too)
        self.bases: list[tuple[type, object, bool]] = []
        self.ignored: set = set(_IGNORED)
        self.walked = 0
        self.left = 0   # names the deadline left unsized
        self._memo: dict = {}   # the survey's own: types seen -> sizer (gone with it)
        self._metas: dict[int, bool] = {id(type): True}   # metaclasses seen (by id: alive while the survey runs)
        self.roots: list = []   # while torch is imported, NumPy's root arrays (:meth:`_linked`; gone with the survey)
        self.storages: set[int] = set()   # the sizes of the tensors' storages seen
        for hook in (_numpy, _pandas, _torch, _jax, _cupy, _arrow):
            try:
                hook(self)
            except Exception:  # noqa: BLE001 - a library half imported (or changed): not sized
                pass

    def leaf(self, kind: type):
        """The sizer of ``kind`` (not a container), None if not sized, or _IGNORED."""
        got = self.exact.get(kind, _MISSING)
        if got is not _MISSING:
            return got
        got = self._memo.get(kind, _MISSING)
        if got is _MISSING:
            mro = _mro(kind)
            if type in mro or any(t in self.ignored for t in mro):   # classes, numpy scalars ...
                got = _IGNORED
            else:
                got = next((sizer for base, sizer, anywhere in self.bases if base in mro
                            and (anywhere or base is kind or _library(kind) == _library(base))), None)
            self._memo[kind] = got
        return got

    def plain(self, kind: type) -> bool:
        """Whether ``kind`` can be hashed, compared and read without running
        code of its metaclass's (one of its own, or inherited but ``type``'s)."""
        meta = type(kind)
        got = self._metas.get(id(meta))
        if got is None:
            got = self._metas[id(meta)] = not any(
                hook in _class_dict(m) for m in _mro(meta) if m is not type and m is not object for hook in _META_HOOKS)
        return got

    def sized(self, ns: dict, hidden: dict) -> tuple[list, int]:
        """[(name, kind, buffers, device, at_least, id)] of the variables
        of ``ns`` sized (not those of ``hidden``, nor names starting with an
        underscore), and how many values could not be."""
        ignored, exact, leaf, container, plain = self.ignored, self.exact, self.leaf, self._container, self.plain
        found, unsized = [], 0
        items = list(ns.items())   # a copy: a thread of the user's may add names meanwhile
        deadline = time.thread_time() + SURVEY_DEADLINE_S   # its own CPU: a loaded machine's waits are not its cost
        for start in range(0, len(items), DEADLINE_EVERY):
            if start and time.thread_time() > deadline:
                self.left = len(items) - start
                unsized += self.left
                break
            for name, value in items[start:start + DEADLINE_EVERY]:
                if type(name) is not str or name[:1] == "_":   # a str subclass's methods are its own
                    continue
                kind = type(value)
                try:
                    if type(kind) is not type and not plain(kind):
                        unsized += 1
                        continue
                    if kind in ignored or hidden.get(name, _MISSING) is value:
                        continue
                    if kind in _CONTAINERS:
                        buffers, device, at_least = container(value)
                    else:
                        sizer = exact.get(kind) or leaf(kind)
                        if sizer is None or sizer is _IGNORED:
                            unsized += sizer is None
                            continue
                        buffers, device, at_least = sizer(value)
                except Exception:  # noqa: BLE001 - an object that fails to say its size is one not sized
                    unsized += 1
                    continue
                name_of = _class_name(kind)
                found.append((name, _RENAMED.get(name_of, name_of), buffers, device, at_least, id(value)))
        if self.roots and self.storages:
            found = self._linked(found)
        return found, unsized

    def _linked(self, found: list) -> list:
        """NumPy's arrays that may share a tensor's storage (torch.from_numpy,
        Tensor.numpy(): no link between the two objects) known by their
        data's address, as the tensor is; only those of a storage's size:
        the address costs more than the rest of an array's sizing."""
        storages = self.storages
        address = {id(a): a.__array_interface__["data"][0] for a in self.roots if a.nbytes in storages}
        if not address:
            return found
        return [(name, kind, [(address.get(key, key), n, direct) for key, n, direct in buffers], *rest)
                for name, kind, buffers, *rest in found]

    def _memoryview(self, view):
        owner = view.obj
        sizer = self.leaf(type(owner)) if owner is not None else None
        if sizer is None or sizer is _IGNORED:
            return [(id(owner), view.nbytes, False)], "", False
        buffers, device, at_least = sizer(owner)
        return [(key, n, False) for key, n, _ in buffers], device, at_least

    def _container(self, box):
        """A list, tuple, dict (its values), set: its own size and its
        elements' buffers, one level deep (an element that is itself a
        container, or not sized, makes the size a lower bound)."""
        n = len(box)
        walk = max(0, min(n, MAX_ITEMS, MAX_WALKED - self.walked))
        self.walked += walk
        buffers = [(id(box), sys.getsizeof(box), True)]
        device, at_least = "", walk < n
        for item in islice(box.values() if type(box) is dict else box, walk):
            kind = type(item)
            if not self.plain(kind):
                at_least = True
                continue
            if kind in self.ignored:
                continue
            sizer = self.exact.get(kind) or self.leaf(kind)
            if sizer is _IGNORED:
                continue
            if sizer is None:
                at_least = True
                continue
            got, dev, partial = sizer(item)
            buffers += got
            device, at_least = device or dev, at_least or partial
        return buffers, device, at_least


# -- the libraries (each only if imported) ---------------------------------------------


def _arrays(ndarray, address, device=None):
    """A sizer of ``ndarray`` (NumPy's; CuPy's, ``device`` saying where an
    array is): the buffer at the root of its chain of bases, what that root
    reports (a view keeps all of it alive); an array over a bytes object
    shares that object's buffer; an array over a file mapping holds no
    memory of its own to count (:class:`_NotSized`). Read through
    ``ndarray``'s descriptors: a subclass's properties never run."""
    nbytes, base, dtype = ndarray.nbytes.__get__, ndarray.base.__get__, ndarray.dtype.__get__

    def size(array):
        root, owner = array, base(array)
        if owner is None:   # most arrays: their own data
            key, direct, n = address(array), True, nbytes(array)
        else:
            while owner is not None and ndarray in _mro(type(owner)):
                root, owner = owner, base(owner)
            kind = type(owner)
            if kind is mmap.mmap:
                raise _NotSized
            if kind in _BYTES_LIKE:
                key, direct = id(owner), False
            elif kind is memoryview and type(owner.obj) in _BYTES_LIKE:
                key, direct = id(owner.obj), False
            else:
                key, direct = address(root), root is array
            # Over memory it does not own (a strided view of another object's): its span at most.
            n = nbytes(root) if owner is None else min(nbytes(root), _span(ndarray, root))
        # An array of objects: the objects are not walked.
        return [(key, n, direct)], device(array) if device else "", dtype(array).hasobject
    return size


def _span(ndarray, array) -> int:
    """The bytes between an array's first and last elements' ends (what a
    view with zero or negative strides reaches)."""
    shape, strides = ndarray.shape.__get__(array), ndarray.strides.__get__(array)
    if 0 in shape:
        return 0
    return ndarray.itemsize.__get__(array) + sum((extent - 1) * abs(stride) for extent, stride in zip(shape, strides))


def _numpy(sizers: Sizers) -> None:
    np = sys.modules.get("numpy")
    if np is None:
        return
    # A root array is known by its id; where torch is imported, some by their
    # data's address once all are sized (Sizers._linked).
    if "torch" in sys.modules:
        def address(array):
            sizers.roots.append(array)
            return id(array)
    else:
        address = id
    size = _arrays(np.ndarray, address)
    sizers.exact[np.ndarray] = size
    sizers.bases.append((np.ndarray, size, False))
    sizers.ignored.update((np.generic, np.dtype))


def _pandas(sizers: Sizers) -> None:
    pd, np = sys.modules.get("pandas"), sys.modules.get("numpy")
    if pd is None or np is None or not hasattr(pd, "DataFrame"):
        return
    ndarray, array = np.ndarray, sizers.exact[np.ndarray]
    simple_index = (pd.RangeIndex, pd.MultiIndex)   # their nbytes: levels and codes, or three numbers

    def values(v, buffers: list) -> bool:
        """Add a block's or index's values (an ndarray or an extension array); True if a lower bound."""
        if type(v) is ndarray:
            got, _, at_least = array(v)
            buffers += got
            return at_least
        if _library(type(v)) != "pandas":   # another library's extension array: its nbytes is its own code
            return True
        inner = getattr(v, "_ndarray", None)   # NumPy-backed extension arrays: dates, categoricals, strings
        if type(inner) is ndarray:
            got, _, at_least = array(inner)
            buffers += got
            rest = int(v.nbytes) - got[0][1] if inner.base is None else 0   # a categorical's categories
            if rest > 0:
                buffers.append((id(v), rest, True))
            return at_least
        buffers.append((id(v), int(v.nbytes), True))
        return False

    def index(ix, buffers: list) -> bool:
        if any(t in simple_index for t in _mro(type(ix))):
            buffers.append((id(ix), int(ix.nbytes), True))
            return False
        return values(ix._data, buffers)

    def frame(df):
        buffers: list = []
        at_least = index(df.index, buffers)
        for block in df._mgr.blocks:
            at_least = values(block.values, buffers) or at_least
        return buffers, "", at_least

    def series(s):
        buffers: list = []
        at_least = index(s.index, buffers)
        return buffers, "", values(s._values, buffers) or at_least

    def index_alone(ix):
        buffers: list = []
        return buffers, "", index(ix, buffers)

    sizers.bases += [(pd.DataFrame, frame, False), (pd.Series, series, False), (pd.Index, index_alone, False)]


def _torch(sizers: Sizers) -> None:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return

    def buffer(t, buffers: list) -> str:
        if t.device.type == "meta":   # shapes and types only: no storage
            return "meta"
        storage = t.untyped_storage()
        n = int(storage.nbytes())
        if n:
            buffers.append((storage.data_ptr(), n, t._base is None))
            sizers.storages.add(n)
        return "" if t.device.type == "cpu" else str(t.device)

    def tensor(t):
        buffers: list = []
        return buffers, buffer(t, buffers), False

    def module(m):
        """Its parameters' and buffers', and its submodules', read from the
        module's own tables (its methods may be the user's)."""
        buffers: list = []
        device, seen, stack, count = "", {id(m)}, [m], 0
        while stack and count < MAX_TENSORS:
            tables = vars(stack.pop())
            for name in ("_parameters", "_buffers"):
                for t in (tables.get(name) or {}).values():
                    if t is not None and type(t) in exact:
                        device = buffer(t, buffers) or device
                        count += 1
            for sub in (tables.get("_modules") or {}).values():
                if sub is not None and id(sub) not in seen:
                    seen.add(id(sub))
                    stack.append(sub)
        return buffers, device, bool(stack)

    # Other tensor subclasses (fake, distributed, wrappers) run code of their own on any call: not sized.
    exact = {torch.Tensor, torch.nn.Parameter, *((torch.nn.Buffer,) if hasattr(torch.nn, "Buffer") else ())}
    for kind in exact:
        sizers.exact[kind] = tensor
    sizers.bases.append((torch.nn.Module, module, True))   # the user's models: read from their tables only
    sizers.ignored.update((torch.device, torch.dtype))


def _jax(sizers: Sizers) -> None:
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "Array"):
        return

    def array(a):
        if a.is_deleted():
            return [], "", False
        devices = a.devices()
        first = min(devices, key=lambda d: d.id)
        device = "" if first.platform == "cpu" else f"{first.platform}:{first.id}" + (
            f" +{len(devices) - 1}" if len(devices) > 1 else "")
        return [(id(a), int(a.nbytes), True)], device, False   # immutable: no views to share a buffer with

    sizers.bases.append((jax.Array, array, False))


def _cupy(sizers: Sizers) -> None:
    cp = sys.modules.get("cupy")
    if cp is None or not hasattr(cp, "ndarray"):
        return
    size = _arrays(cp.ndarray, lambda a: a.data.ptr, lambda a: f"cuda:{a.device.id}")
    sizers.bases.append((cp.ndarray, size, False))


def _arrow(sizers: Sizers) -> None:
    pa = sys.modules.get("pyarrow")
    if pa is None or not hasattr(pa, "Table"):
        return

    def table(t):
        return [(id(t), int(t.get_total_buffer_size()), True)], "", False   # whole buffers: a slice keeps them

    sizers.bases += [(kind, table, False) for kind in (pa.Table, pa.RecordBatch, pa.ChunkedArray, pa.Array)]


# -- the survey --------------------------------------------------------------------------


class Namespace:
    """The namespace as last sized (names, kinds, object ids, buffer keys
    and sizes only). :meth:`survey` sizes it now and says what changed
    since; ``valid``: the last survey was at the end of the last cell
    (otherwise what changed since is unknown: survey once first)."""

    def __init__(self):
        self.valid = False
        self._ident: dict[str, int] = {}   # name -> id of its object (another id: the name was rebound)
        self._kind: dict[str, str] = {}
        self._owner: dict[int, str] = {}   # buffer key -> the name it is attributed to
        self._size: dict[int, int] = {}    # buffer key -> bytes
        self._held = 0

    def survey(self, ns: dict, hidden: dict) -> Variables:
        """Size ``ns`` (a shell's user namespace, without the names in
        ``hidden`` and those starting with an underscore, as ``%who``
        lists it) and say what changed since the last survey."""
        sizers = Sizers()
        found, unsized = sizers.sized(ns, hidden)
        size: dict[int, int] = {}
        owner: dict[int, str] = {}
        direct: set[int] = set()
        # Each buffer is attributed to the first name that owns it, else to the first that reaches it.
        for name, _, buffers, device, _, _ in found:
            for key, n, owns in buffers:
                if n <= 0:
                    continue
                if n > MAX_BYTES and not device:
                    n = MAX_BYTES
                if key not in size:
                    size[key], owner[key] = n, name
                elif n > size[key]:
                    size[key] = n
                if owns and key not in direct:
                    direct.add(key)
                    owner[key] = name
        # (name, kind, bytes it reaches, keys attributed to it, names it shares with, device, at_least, id)
        rows = []
        for name, kind, buffers, device, at_least, ident in found:
            if len(buffers) == 1:   # most variables: one buffer
                key = buffers[0][0]
                by = owner.get(key)
                if by is None:
                    rows.append((name, kind, 0, (), (), device, at_least, ident))
                elif by == name:
                    rows.append((name, kind, size[key], (key,), (), device, at_least, ident))
                else:
                    rows.append((name, kind, size[key], (), (by,), device, at_least, ident))
                continue
            # A plain loop: generators cost more than the work here (a survey is per cell).
            total, own, others, seen = 0, [], set(), set()
            for key, n, _ in buffers:
                if n > 0 and key not in seen:
                    seen.add(key)
                    total += size[key]
                    by = owner[key]
                    if by == name:
                        own.append(key)
                    else:
                        others.add(by)
            rows.append((name, kind, total, tuple(own), tuple(sorted(others)), device, at_least, ident))
        held = sum(size.values())
        report = self._changes(rows, ns, size, owner, held, unsized) if self.valid and not sizers.left else \
            Variables(held, 0, len(rows), unsized, largest=_largest(rows))
        self._ident = {r[0]: r[7] for r in rows}
        self._kind = {r[0]: r[1] for r in rows}
        # Past the deadline, what changed is unknown: the next survey starts afresh.
        self._owner, self._size, self._held, self.valid = owner, size, held, not sizers.left
        return report

    def _changes(self, rows, ns, size, owner, held, unsized) -> Variables:
        """Each name's change is the memory of the buffers attributed to it
        that are new (or grew) less that of those it had that are gone: a
        buffer that passes to another name (its owner deleted, a view left)
        is no change."""
        before, idents = self._size, self._ident
        freed: dict[str, int] = {}
        for key, name in self._owner.items():
            if key not in size:
                freed[name] = freed.get(name, 0) + before[key]
        grew, shrank = [], []
        for row in rows:
            name, own = row[0], row[3]
            change = -freed.get(name, 0)
            for key in own:
                change += size[key] - before.get(key, 0)
            ident = idents.get(name)
            if ident is None:
                status = "new"
            elif ident != row[7]:
                status = "replaced"
            elif change:
                status = "grew" if change > 0 else "shrank"
            else:
                continue
            (shrank if change < 0 else grew).append((name, row[1], row[2], change, status, *row[4:7]))
        gone = idents.keys() - {r[0] for r in rows}   # deleted, or now a value not sized
        if gone:
            kept: dict[str, list[int]] = {}
            for key, name in self._owner.items():
                if name in gone and key in size:
                    kept.setdefault(name, []).append(key)
            for name in gone:
                value = ns.get(name, _MISSING)
                if value is _MISSING:
                    keys = kept.get(name, ())
                    shrank.append((name, self._kind[name], sum(size[k] for k in keys), -freed.get(name, 0),
                                   "deleted", tuple(sorted({owner[k] for k in keys})), "", False))
                else:
                    shrank.append((name, type(value).__name__, 0, -freed.get(name, 0), "replaced", (), "", False))
        return Variables(held, held - self._held, len(rows), unsized,
                         grew=_vars(heapq.nlargest(TOP, grew, key=itemgetter(3, 2))),   # what the cell added first
                         shrank=_vars(heapq.nsmallest(TOP, shrank, key=itemgetter(3))),
                         largest=_largest(rows), grew_count=len(grew), shrank_count=len(shrank))


def _vars(rows) -> tuple[Var, ...]:
    return tuple(Var(*row) for row in rows)


def _largest(rows) -> tuple[Var, ...]:
    """The largest held, each buffer once: a name that only reaches other names' buffers (a view) is left out."""
    held = (r for r in rows if r[3] or not r[4])   # owns a buffer, or shares none
    return tuple(Var(name, kind, nbytes, 0, "", shares, device, at_least)
                 for name, kind, nbytes, _own, shares, device, at_least, _
                 in heapq.nlargest(TOP, held, key=itemgetter(2)))


class CellSizes:
    """When the kernel sizes its namespace: at the end of every cell while
    the session's monitor sizes variables (``on``, as the host's answers
    say), once a cell; and, where the last cell's end was not sized (the
    monitor just started), before a cell, so that what it changes is known."""

    def __init__(self):
        self.namespace = Namespace()
        self.on = False
        self._sent = False   # this cell's end was sized (a %%resmon cell's close did it)
        self._failed = False

    def watch(self, on: bool) -> None:
        """The running monitor sizes variables (or, False: none does)."""
        self.on = bool(on)
        if not self.on:
            self.namespace.valid = False

    def cell_started(self, shell) -> None:
        self._sent = False
        self.ready(shell)

    def ready(self, shell) -> None:
        """Size the namespace now unless its last survey is the last cell's end."""
        if self.on and not self.namespace.valid:
            self._survey(shell)

    def cell_ended(self, shell) -> dict | None:
        """The namespace's report at this cell's end (:meth:`Variables.to_dict`),
        once a cell; None when off, already sent, or sizing failed."""
        if not self.on or self._sent:
            return None
        self._sent = True
        report = self._survey(shell)
        return report.to_dict() if report is not None else None

    def cell_finished(self) -> None:
        """After the cell (post_run_cell): a cell not sized leaves the namespace unknown."""
        if not self._sent:
            self.namespace.valid = False

    def _survey(self, shell) -> Variables | None:
        # No collection during the survey: its thousands of short-lived tuples
        # would survive one into the old generation, and bring the next
        # collection of the whole heap (of a kernel with torch: 100 ms) nearer.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self.namespace.survey(shell.user_ns, shell.user_ns_hidden)
        except Exception as err:  # noqa: BLE001 - never an error of nbmon's in the user's cell
            self.namespace.valid = False
            if not self._failed:   # said once: the next cells run on without it
                self._failed = True
                print(printable(f"nbmon: the variables could not be sized ({type(err).__name__}: {err})"),
                      file=sys.stderr, flush=True)
            return None
        finally:
            if collecting:
                gc.enable()
