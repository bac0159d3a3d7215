"""What each module may import: cheap ``import nbmon``, heavy libraries in one
place each, pandas only lazily, and a strict layer order."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import nbmon

PACKAGE = Path(nbmon.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))

# procsampler (the helper-process sampler, added after the layer list was
# written) reads the same sources as the sampler and is monitor's backend.
LAYERS = ("render", "procfs", "proctree", "system", "nvml", "sampler", "procsampler", "store", "summary",
          "senders", "export", "monitor", "frames", "meter", "live", "session", "resources",
          "system_monitor", "magics", "cli", "demo")

HEAVY = ("IPython", "plotly", "pandas", "pynvml")


def loaded_after(statement: str) -> dict[str, bool]:
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps({{m: m in sys.modules for m in {list(HEAVY)!r}}}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_import_nbmon_loads_no_heavy_library():
    assert loaded_after("import nbmon") == {m: False for m in HEAVY}


def test_import_nbmon_monitor_loads_no_notebook_library():
    loaded = loaded_after("import nbmon.monitor")
    assert {m: loaded[m] for m in ("IPython", "plotly", "pandas")} == {
        "IPython": False, "plotly": False, "pandas": False}


def test_seed_apis_load_no_notebook_library():
    loaded = loaded_after("import nbmon; nbmon.ResourceMonitor; nbmon.SystemMonitor; nbmon.CSVSender")
    assert not loaded["IPython"] and not loaded["plotly"] and not loaded["pandas"]


# -- static checks -------------------------------------------------------------------


class Import:
    def __init__(self, module: str, target: str, line: int, in_function: bool):
        self.module, self.target, self.line, self.in_function = module, target, line, in_function

    def __repr__(self) -> str:
        where = "in a function" if self.in_function else "at module level"
        return f"nbmon/{self.module}.py:{self.line} imports {self.target} {where}"


def imports_of(module: str, source: str | None = None) -> list[Import]:
    """Every import in nbmon/<module>.py with its absolute target ('nbmon.x' for
    the package's own modules), and whether it sits inside a function."""
    if source is None:
        source = (PACKAGE / f"{module}.py").read_text()
    tree = ast.parse(source, filename=f"{module}.py")
    found: list[Import] = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: from . import x / from .x import y
                    if child.module:
                        found.append(Import(module, f"nbmon.{child.module}", child.lineno, in_function))
                    else:
                        found.extend(Import(module, f"nbmon.{a.name}", child.lineno, in_function)
                                     for a in child.names)
                elif child.module == "nbmon":
                    found.extend(Import(module, f"nbmon.{a.name}", child.lineno, in_function)
                                 for a in child.names)
                else:
                    found.append(Import(module, child.module, child.lineno, in_function))
            visit(child, inside)

    visit(tree, False)
    return found


ALL_IMPORTS = {m: imports_of(m) for m in MODULES}


def test_the_checker_on_known_source():
    source = (
        "import pandas as pd\n"
        "from . import nvml\n"
        "from .store import Store\n"
        "from nbmon import live\n"
        "class A:\n"
        "    import plotly.graph_objects\n"
        "    def f(self):\n"
        "        if True:\n"
        "            from IPython.display import HTML\n"
        "async def g():\n"
        "    import pandas\n")
    got = [(i.target, i.line, i.in_function) for i in imports_of("x", source)]
    assert got == [("pandas", 1, False), ("nbmon.sources.nvml", 2, False), ("nbmon.store", 3, False),
                   ("nbmon.notebook.dashboard", 4, False), ("plotly.graph_objects", 6, False),
                   ("IPython.display", 9, True), ("pandas", 11, True)]


def test_the_checker_sees_imports():
    # Guard against a checker that silently finds nothing.
    targets = {i.target for i in ALL_IMPORTS["monitor"]}
    assert {"nbmon.sources.nvml", "nbmon.sources.proctree", "nbmon.sampler", "threading"} <= targets
    assert any(i.target == "pynvml" and i.in_function for i in ALL_IMPORTS["nvml"])
    assert any(i.target == "nbmon.notebook.magics" and i.in_function for i in ALL_IMPORTS["__init__"])


@pytest.mark.parametrize("library, owner", [("IPython", "magics"), ("plotly", "live"),
                                            ("pynvml", "nvml")])
def test_heavy_library_is_imported_in_one_module_only(library, owner):
    offenders = [i for m, imps in ALL_IMPORTS.items() if m != owner for i in imps
                 if i.target == library or i.target.startswith(library + ".")]
    assert offenders == []


def test_pandas_only_inside_functions():
    offenders = [i for imps in ALL_IMPORTS.values() for i in imps
                 if (i.target == "pandas" or i.target.startswith("pandas.")) and not i.in_function]
    assert offenders == []


def test_every_module_has_a_layer():
    unknown = set(MODULES) - set(LAYERS) - {"__init__"}
    assert unknown == set(), f"add these modules to LAYERS: {sorted(unknown)}"


@pytest.mark.parametrize("module", [m for m in LAYERS if m in MODULES])
def test_layer_order(module):
    """A module imports only modules listed before it (in functions too)."""
    earlier = set(LAYERS[:LAYERS.index(module)])
    offenders = []
    for imp in ALL_IMPORTS[module]:
        if imp.target == "nbmon":
            offenders.append(imp)  # the package itself re-exports everything
        elif imp.target.startswith("nbmon."):
            target = imp.target.split(".")[1]
            if target not in earlier:
                offenders.append(imp)
    assert offenders == []
