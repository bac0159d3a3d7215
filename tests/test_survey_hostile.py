"""The variables survey calls no user code and reports no absurd size
(issue 42): hostile objects in the namespace -- a metaclass whose hash,
equality or ``__mro__`` is the user's, subclasses of NumPy's and pandas'
types with their own properties, names that are ``str`` subclasses or no
``str`` at all -- are counted as not sized, their code never runs, and the
rest of the namespace is sized as before. Sizes are what the memory holds:
a zero-stride view is its one element, a file mapping (``np.memmap``) is
not memory the kernel holds. The survey ends by a deadline."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nbmon.kernel import namespace
from nbmon.kernel.namespace import Namespace

calls: list[str] = []


def ran(what: str) -> None:
    calls.append(what)


class HashingMeta(type):
    def __hash__(cls):
        ran("metaclass __hash__")
        return id(cls)

    def __eq__(cls, other):
        ran("metaclass __eq__")
        return cls is other


class MroMeta(type):
    @property
    def __mro__(cls):
        ran("metaclass __mro__")
        return (cls, object)


class UnhashableMeta(type):
    __hash__ = None


class Hashed(metaclass=HashingMeta):
    pass


class Mro(metaclass=MroMeta):
    pass


class Unhashable(metaclass=UnhashableMeta):
    pass


class OwnArray(np.ndarray):
    @property
    def dtype(self):
        ran("ndarray subclass dtype")
        return np.dtype("f8")

    def __getattribute__(self, name):
        ran(f"ndarray subclass {name}")
        return super().__getattribute__(name)


class OwnFrame(pd.DataFrame):
    @property
    def _mgr(self):
        ran("DataFrame subclass _mgr")
        return vars(self)["_mgr"]


def own_frame() -> OwnFrame:
    frame = pd.DataFrame({"a": np.arange(10)})
    frame.__class__ = OwnFrame   # made as a DataFrame: pandas sets its _mgr while making one
    return frame


class Name(str):
    def __hash__(self):
        ran("name __hash__")
        return str.__hash__(self)

    def __eq__(self, other):
        ran("name __eq__")
        return str.__eq__(self, other)

    def __getitem__(self, key):
        ran("name __getitem__")
        return str.__getitem__(self, key)


def survey(ns: dict):
    calls.clear()
    report = Namespace().survey(ns, {})
    return report, list(calls)


def test_hostile_objects_run_nothing_and_the_rest_is_sized():
    ok = np.ones(1000)
    ns = {"hashed": Hashed(), "mro": Mro(), "unhashable": Unhashable(),
          "own_array": np.ones(100).view(OwnArray), "own_frame": own_frame(),
          Name("evil_name"): np.ones(10), 1: np.ones(10), "ok": ok}
    report, ran_code = survey(ns)
    assert ran_code == []
    assert [v.name for v in report.largest] == ["ok"] and report.held == ok.nbytes
    assert report.unsized == 5   # the five hostile values; names that are not plain strings are no variables


def test_a_zero_stride_view_holds_its_one_element_and_a_file_mapping_is_not_held(tmp_path):
    one = np.zeros(1)
    huge = np.lib.stride_tricks.as_strided(one, shape=(10**6, 10**6), strides=(0, 0))   # 7.3 TiB by nbytes
    sparse = np.memmap(tmp_path / "sparse", mode="w+", dtype=np.uint8, shape=(64 << 30,))   # 64 GiB, no page held
    report, _ = survey({"huge": huge, "sparse": sparse})
    assert report.held <= one.nbytes and report.unsized == 1, report


def test_the_survey_stops_at_its_deadline(monkeypatch):
    monkeypatch.setattr(namespace, "SURVEY_DEADLINE_S", 0.0)
    names = {f"a{k}": np.ones(4) for k in range(3 * namespace.DEADLINE_EVERY)}
    report, _ = survey(names)
    # The first names before the clock is read, the rest counted as not sized.
    assert report.count == namespace.DEADLINE_EVERY and report.unsized == len(names) - report.count


@pytest.mark.parametrize("after", [1, 2])
def test_a_hostile_object_does_not_stop_later_surveys(after):
    ns = {"unhashable": Unhashable(), "ok": np.ones(10)}
    names = Namespace()
    for _ in range(after):
        report = names.survey(ns, {})
    assert report.count == 1 and report.unsized == 1
