"""What holds the memory (issue 35): each monitored cell's record names the
variables it made, grew or freed, and a killed kernel's post-mortem names
the largest it held. Real kernels (jupyter_client, nbclient), a real memory
cgroup for the OOM kill; the truth is what the test allocates, and what
the libraries themselves report (pandas' ``memory_usage``, an array's
``nbytes``, a tensor's element count), read in the kernel by the test."""
from __future__ import annotations

import gc
import math
import signal
import sys
from importlib.util import find_spec

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from nbclient.exceptions import DeadKernelError

from helpers import wait_until
from kernels import RealKernel
from nbmon.postmortem import blackbox, deaths
from nbmon.engine import Monitor
from browser_util import summary_rows
from nbmon.helper.host import watch_kernel
from nbmon.kernel.namespace import MAX_ITEMS, CellSizes, Namespace
from nbmon.report.variables import Var, Variables, held_before
from test_blackbox import _with_header, boxes  # noqa: F401 - a fixture
from test_postmortem import FILL, Kernel, last_death, limited_kernelspec, postmortems, private_dir  # noqa: F401

MIB = 2**20
VARIABLES = "nbmon.last_summary().variables.to_dict()"


def record_text(kernel: RealKernel) -> str:
    """The last cell's record table (folded or not), a line per row."""
    html = "".join(o["data"].get("text/html", "") for o in kernel.outputs)
    return "\n".join(f"{title}  {value}" for title, value in summary_rows(html).items())


def row(text: str, title: str) -> str:
    """A record's row by its title ('' if it has none)."""
    return next((line.split(title, 1)[1].strip() for line in text.splitlines() if line.strip().startswith(title)), "")


def by_name(items: list) -> dict[str, list]:
    """Variables.to_dict()'s lists by name: {name: [kind, bytes, change, status, shares, device, at_least]}."""
    return {item[0]: item[1:] for item in items}


# -- in real kernels ------------------------------------------------------------------


def test_a_cell_that_builds_a_dataframe_and_a_view_names_each_once():
    with RealKernel() as kernel:
        kernel.run("%load_ext nbmon\nimport nbmon")
        kernel.run("import numpy as np, pandas as pd\ndata = np.ones(8 << 20)")   # 64 MiB, before the cell
        kernel.run("%%resmon --label build\n"
                   "df = pd.DataFrame({'a': np.zeros(2 << 20), 'b': np.arange(2 << 20)})\n"   # 32 MiB, new
                   "over = pd.DataFrame(data.reshape(-1, 2), copy=False)\n"   # a DataFrame over data: nothing new
                   "X = data[::2]")   # a view of data
        text = record_text(kernel)
        got = kernel.value(VARIABLES)
        # The truth, as the libraries report it.
        df_bytes, data_bytes, over_index = kernel.value(
            "(int(df.memory_usage().sum()), data.nbytes, int(over.memory_usage().sum()) - data.nbytes)")
        history = kernel.value("nbmon.history()[['vars_grew_mb', 'vars_growth_mb', 'vars_held_mb']]"
                               ".iloc[-1].to_dict()")
    grew = by_name(got["grew"])
    assert set(grew) == {"df", "over", "X"}, got
    assert grew["df"][:4] == ["DataFrame", df_bytes, df_bytes, "new"], grew
    assert grew["X"][:5] == ["ndarray", data_bytes, 0, "new", ["data"]], grew     # the buffer it keeps alive
    assert grew["over"][:5] == ["DataFrame", data_bytes + over_index, over_index, "new", ["data"]], grew
    # data's buffer, reached by three names, is counted once.
    assert got["held"] == data_bytes + df_bytes + over_index and got["change"] == df_bytes + over_index, got
    # The record names each once, largest first, and says what each shares.
    grew_row = row(text, "Variables grew")
    assert [grew_row.count(f"{name} ") for name in ("df", "over", "X")] == [1, 1, 1], text
    assert "X 64.0 MiB (ndarray, view of data)" in grew_row and "over 64.0 MiB (DataFrame, shares data)" in grew_row
    # What the cell added first: df's new 32 MiB before the views of data (larger, but not new).
    assert grew_row.startswith("df 32.0 MiB (DataFrame)") and [v[0] for v in got["grew"]] == ["df", "over", "X"], text
    assert row(text, "Variables held") == "96.0 MiB in 4 variables (+32.0 MiB)", text
    assert history["vars_grew_mb"] == {"df": df_bytes / MIB, "over": (data_bytes + over_index) / MIB,
                                       "X": data_bytes / MIB}, history
    assert history["vars_growth_mb"] == (df_bytes + over_index) / MIB, history


def test_a_cell_that_deletes_a_variable_shows_the_shrink():
    with RealKernel() as kernel:
        kernel.run("%load_ext nbmon\nimport nbmon")
        kernel.run("%%resmon\nimport numpy as np\nbig = np.ones(8 << 20)\nbase = np.ones(2 << 20)\nkeep = base[:10]")
        kernel.run("%%resmon\ndel big")
        text, got = record_text(kernel), kernel.value(VARIABLES)
        kernel.run("%%resmon\ndel base")   # its 16 MiB stay: keep, a view of it, holds them
        kept_text, kept = record_text(kernel), kernel.value(VARIABLES)
        shrank = kernel.value("nbmon.history()['vars_shrank_mb'].tolist()")
    assert got["shrank"] == [["big", "ndarray", 0, -64 * MIB, "deleted", [], "", False]], got
    assert got["change"] == -64 * MIB and got["held"] == 16 * MIB and got["grew"] == [], got
    assert row(text, "Variables shrank") == "big (ndarray, deleted: -64.0 MiB)", text
    assert row(text, "Variables held") == "16.0 MiB in 2 variables (-64.0 MiB)", text
    # A deleted owner whose buffer a view keeps: no change, and said so.
    assert kept["shrank"] == [["base", "ndarray", 16 * MIB, 0, "deleted", ["keep"], "", False]], kept
    assert kept["change"] == 0 and kept["held"] == 16 * MIB, kept
    assert row(kept_text, "Variables shrank") == "base (ndarray, deleted; 16.0 MiB still held by keep)", kept_text
    assert shrank[1:] == [{"big": -64.0}, {"base": 0.0}], shrank


@pytest.mark.skipif(find_spec("torch") is None, reason="torch is not installed")
def test_tensors_are_sized_by_their_storage():
    with RealKernel() as kernel:
        kernel.run("%load_ext nbmon\nimport nbmon")
        kernel.run("import torch, numpy as np")
        kernel.run("%%resmon\n"
                   "t = torch.ones(1 << 20)\n"          # 4 MiB of float32
                   "v = t[10:]\n"                       # a view: t's storage
                   "m = torch.nn.Linear(512, 512)\n"
                   "shared = torch.from_numpy(np.ones(1 << 19))\n"   # 4 MiB of numpy's
                   "a = shared.numpy()")                # the same memory again
        got = kernel.value(VARIABLES)
        m_bytes = kernel.value("sum(p.numel() * p.element_size() for p in m.parameters())")
    grew = by_name(got["grew"])
    assert grew["t"][:5] == ["Tensor", 4 * MIB, 4 * MIB, "new", []], grew
    assert grew["v"][:5] == ["Tensor", 4 * MIB, 0, "new", ["t"]], grew
    assert grew["m"][:3] == ["Linear", m_bytes, m_bytes] and m_bytes == (512 * 512 + 512) * 4, grew
    # numpy and torch over one buffer: counted once (for the first name), the other shares it.
    assert grew["shared"][:3] == ["Tensor", 4 * MIB, 4 * MIB] and grew["a"][:5] == ["ndarray", 4 * MIB, 0, "new",
                                                                                     ["shared"]], grew
    assert all(v[5] == "" for v in grew.values()), grew   # on the CPU: no device said
    assert got["change"] == 4 * MIB + m_bytes + 4 * MIB, got


@pytest.mark.skipif(find_spec("jax") is None, reason="jax is not installed")
def test_jax_arrays_are_sized():
    with RealKernel() as kernel:
        kernel.run("%load_ext nbmon\nimport nbmon\nimport jax.numpy as jnp")
        kernel.run("%%resmon\nj = jnp.ones((256, 1024))")   # 1 MiB of float32, on the CPU
        got = kernel.value(VARIABLES)
    assert got["grew"] == [["j", "Array", MIB, MIB, "new", [], "", False]], got


def test_sizing_keeps_nothing_imports_nothing_and_is_off_with_one_flag():
    heavy = ("numpy", "pandas", "pyarrow", "torch", "jax", "cupy")
    with RealKernel() as kernel:
        kernel.run("%load_ext nbmon\nimport nbmon")
        kernel.run("%resmon auto on --threshold 0")
        kernel.run("import gc, sys, weakref\n"
                   "class Holder:\n"
                   "    pass\n"
                   "kept = Holder()\n"
                   "kept.payload = bytearray(8 << 20)\n"
                   "ref = weakref.ref(kept)\n"
                   "chunks = [bytes(1 << 20) for _ in range(3)]\n"
                   "refs = sys.getrefcount(chunks)")
        got = kernel.value(VARIABLES)
        chunks_bytes = kernel.value("sys.getsizeof(chunks) + sum(map(sys.getsizeof, chunks))")
        kernel.run("del kept\ngc.collect()")
        # nbmon held no reference to what it sized, nor to what it could not.
        assert kernel.value("ref() is None") and kernel.value("sys.getrefcount(chunks) == refs")
        assert kernel.value(f"[m for m in {heavy!r} if m in sys.modules]") == []
        kernel.run("%resmon stop")
        kernel.run("%%resmon --no-variables\nmore = bytes(4 << 20)")
        off_text, off = record_text(kernel), kernel.value("nbmon.last_summary().variables")
    grew = by_name(got["grew"])
    # A class nbmon does not know is counted, not guessed; a list of bytes is sized one level deep.
    assert "kept" not in grew and got["unsized"] == 2, got   # kept, and its weakref
    assert grew["chunks"][:4] == ["list", chunks_bytes, chunks_bytes, "new"], grew
    assert off is None and "Variables" not in off_text, off_text


def test_the_postmortem_of_an_oom_killed_kernel_names_what_it_held(private_dir, limited_kernelspec, tmp_path):
    kernel_name, group = limited_kernelspec
    notebook = str(tmp_path / "held.ipynb")
    with Kernel(notebook, kernel_name) as first:
        first.run("%load_ext nbmon")
        build = first.run("%%resmon --label build --memory-guard off\nimport numpy as np\n"   # the kill, not a stop
                           "weights = np.ones(12 << 20)")   # 96 MiB
        with pytest.raises(DeadKernelError):
            first.run(FILL)
        assert first.process.wait(30) == -signal.SIGKILL and group.oom_kills() >= 1
    with Kernel(notebook) as second:
        (record,) = postmortems(second.run("%load_ext nbmon"))
        death = last_death(second)
    held = f"weights 96.0 MiB (ndarray); 96.0 MiB in 1 variable as cell [{build.execution_count}] ended"
    assert held in record, record
    assert death["held"]["largest"] == [["weights", "ndarray", 96 * MIB, "", False]], death
    assert death["held_text"] == held and death["cause"] == "oom", death


# -- the sizing rules, on real objects in this process -------------------------------------


def survey(ns: dict, before: dict | None = None) -> Variables:
    names = Namespace()
    names.survey(before or {}, {})
    return names.survey(ns, {})


def test_what_each_kind_reports(monkeypatch):
    monkeypatch.setattr("nbmon.kernel.namespace.TOP", 100)   # every variable in the report
    frame = pd.DataFrame({"n": np.arange(1000), "s": [str(i) for i in range(1000)],
                          "c": pd.Categorical(["a", "b"] * 500)})
    objects = pd.Series([object() for _ in range(100)])
    table = pa.table({"a": np.arange(1000)})
    raw = b"x" * 4096
    ns = {"frame": frame, "objects": objects, "table": table, "raw": raw, "over_raw": np.frombuffer(raw, np.uint8),
          "pairs": {"x": np.ones(100), "y": np.ones(50)}, "nested": [[np.ones(10)]], "ints": list(range(10)),
          "many": [np.ones(1) for _ in range(MAX_ITEMS + 1)], "f": len, "n": 3, "mod": np, "_hidden": np.ones(10)}
    report = survey(ns)
    got = {v.name: v for v in report.grew}
    usage = frame.memory_usage().sum()   # pandas' own figure
    if frame["s"].dtype == object:   # pandas < 3: strings are Python objects, not walked: "at least";
        # pandas also counts its categories' hash table there (108 B)
        assert got["frame"].at_least and usage - 256 <= got["frame"].nbytes <= usage, (got["frame"], usage)
    else:
        assert got["frame"].nbytes == usage and not got["frame"].at_least
    assert got["objects"].at_least and got["objects"].nbytes == objects.memory_usage()   # objects not walked
    assert got["table"].nbytes == table.get_total_buffer_size()
    # An array over a bytes object shares its buffer: counted once, for the bytes.
    assert got["raw"].nbytes == sys.getsizeof(raw) and got["over_raw"].shares == ("raw",)
    assert got["pairs"].nbytes == sys.getsizeof(ns["pairs"]) + 150 * 8 and not got["pairs"].at_least
    assert got["nested"].at_least and got["many"].at_least   # one level deep; at most MAX_ITEMS elements
    # Functions, numbers, modules, _names: not data, neither sized nor "not sized".
    assert report.count == len(got) == 9 and report.unsized == 0


def test_replaced_and_grown_variables():
    data = bytearray(MIB)
    before = {"data": data, "swap": np.ones(1000)}
    names = Namespace()
    names.survey(before, {})
    data.extend(bytes(MIB))
    after = names.survey({"data": data, "swap": np.ones(500)}, {})
    got = {v.name: v for v in after.grew + after.shrank}
    assert got["data"].status == "grew" and got["data"].change == sys.getsizeof(data) - sys.getsizeof(bytearray(MIB))
    assert got["swap"].status == "replaced" and got["swap"].change == -4000
    assert got["swap"].text() == "swap 3.9 KiB (ndarray, replaced: -3.9 KiB)"


def in_survey() -> bool:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not Namespace.survey.__code__:
        frame = frame.f_back
    return frame is not None


def test_no_garbage_collection_runs_while_a_cell_end_is_sized(ipython):
    # A survey of 1,000 names makes thousands of tuples: with the collector on,
    # collections would start amid them, and move them to the old generation.
    names = {f"a{k}": np.ones(4) for k in range(1000)}
    ipython.user_ns.update(names)
    sizes = CellSizes()
    sizes.watch(True)
    during = []
    gc.callbacks.append(lambda phase, info: during.append(info["generation"]) if in_survey() else None)
    try:
        sizes.cell_started(ipython)
        report = sizes.cell_ended(ipython)
    finally:
        gc.callbacks.pop()
        for name in names:
            del ipython.user_ns[name]
    assert report["count"] >= 1000 and during == [] and gc.isenabled()


def test_a_variable_that_fails_to_size_is_counted_not_raised():
    class Broken(pd.DataFrame):
        @property
        def _mgr(self):
            raise RuntimeError("no manager")

    report = survey({"broken": Broken.__new__(Broken), "ok": np.ones(10)})
    assert report.unsized == 1 and [v.name for v in report.grew] == ["ok"]


# -- the black box's section ---------------------------------------------------------------


def test_the_box_keeps_as_many_of_the_largest_as_fit():
    largest = tuple(Var(f"variable_with_a_long_name_{k}", "DataFrame", (10 - k) * MIB) for k in range(8))
    held = Variables(55 * MIB, 0, 12, 3, largest=largest).for_box(14)
    section = blackbox.encode_held(held, 1)
    assert len(section) == blackbox.HELD_SIZE
    back = blackbox._decode_held(section)
    kept = back["largest"]
    assert 2 <= len(kept) < 8 and [v[2] for v in kept] == [(10 - k) * MIB for k in range(len(kept))]
    assert all(len(v[0]) <= blackbox.NAME_CHARS for v in kept)
    text = held_before(back)
    assert text.startswith("variable_wi\u2026_long_name_0 10.0 MiB (DataFrame), variable_wi\u2026_long_name_1 9.0 MiB")
    assert "12 variables as cell [14] ended; 3 objects not sized" in text, text
    damaged = bytearray(section)
    damaged[20] ^= 0xFF
    assert blackbox._decode_held(bytes(damaged)) is None
    assert blackbox._decode_held(bytes(blackbox.HELD_SIZE)) is None   # never written


def test_a_live_box_keeps_what_was_held_and_a_box_from_before_still_reads(boxes):
    note = blackbox.CellNote()
    monitor = Monitor(interval=0.05, gpu=False)
    watch_kernel(monitor, note)
    with monitor:
        path = wait_until(lambda: boxes.is_dir() and next(boxes.iterdir(), None), what="the box")
        note.hold(Variables(96 * MIB, 0, 1, 0, largest=(Var("weights", "ndarray", 96 * MIB),)).for_box(2))
        wait_until(lambda: blackbox.read_box(str(path)).records, what="a record")
        image = path.read_bytes()
    box = blackbox.decode(image)
    assert box.held == {"cell": 2, "held": 96 * MIB, "count": 1, "unsized": 0,
                        "largest": [["weights", "ndarray", 96 * MIB, "", False]]}
    assert ("Variables held", "weights 96.0 MiB (ndarray); 96.0 MiB in 1 variable as cell [2] ended") \
        in deaths.death_of(box).rows()
    # A box of nbmon before the variables (version 1, without their section): its death, nothing held.
    old = blackbox.decode(_with_header(image, version=1)[:-blackbox.HELD_SIZE])
    assert old.held is None and old.records == box.records and old.cell == box.cell
    assert "Variables held" not in dict(deaths.death_of(old).rows())


def test_a_held_section_the_postmortem_cannot_read_shows_no_row():
    for bad in ({"largest": "x"}, {"largest": [["a", "b", "c", "", False]], "held": 1, "count": 1, "unsized": 0},
                {"largest": [], "held": math.nan, "count": 1, "unsized": 0}):
        with pytest.raises(ValueError):
            held_before(bad)
