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


def dotted(path: Path) -> str:
    """'sources.tree.linux' for nbmon/sources/tree/linux.py, 'sources' for its __init__.py."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or "__init__"


MODULES = sorted(dotted(p) for p in PACKAGE.rglob("*.py"))

# Data flows one way: sources -> sampler -> store -> consumers -> outer
# layers. A module may import only modules listed before it.
LAYERS = (
    "values", "catalog", "options", "format", "private", "launch",
    "sources.procfs", "sources.cgroup",
    "sources.tree.memory", "sources.tree.pstree", "sources.tree.peaks", "sources.tree.linux", "sources.tree",
    "sources.machine",
    "sources.gpus.nvml", "sources.gpus", "sources.kernels", "sources",
    "sampling.faults", "sampling.sampler", "sampling.process", "sampling.store", "sampling",
    "report.variables", "report.render", "report.summary", "report.records", "report.notebooks", "report",
    "sinks.files", "sinks.senders", "sinks.consumers", "sinks",
    "postmortem.blackbox", "postmortem.memwarn", "postmortem.memguard", "postmortem.deaths", "postmortem",
    "overview.control", "overview",
    "engine",
    "dask.wire", "dask.feeds", "dask.worker", "dask.client", "dask",
    "compat.calibrax", "compat.scaffold", "compat",
    "views.frontend", "views.frames", "views.charts", "views.live", "views.pages", "views.meter", "views.kernels",
    "views.dashboard", "views.cluster", "views",
    "helper.protocol", "helper.host", "helper.serve", "helper",
    "kernel.guard", "kernel.namespace", "kernel.remote", "kernel.session", "kernel.magics", "kernel",
    "cli.ranks", "cli.demo", "cli.top", "cli.notebooks", "cli", "cli.__main__",
)
PACKAGES = ("sources", "sampling", "report", "sinks", "postmortem", "overview", "dask", "compat", "views", "helper", "kernel",
            "cli")
# The notebook's packages, outer layers that never import compat/ (nor it them).
NOTEBOOK = ("views", "helper", "kernel")
# The vocabulary every layer speaks, loose at nbmon's top with the engine.
VOCABULARY = {"values", "catalog", "options", "format", "private", "launch"}
SOURCES = {m for m in LAYERS if m.startswith("sources")}
SAMPLING = {m for m in LAYERS if m.startswith("sampling")}
REPORT = {m for m in LAYERS if m.startswith("report")}
POSTMORTEM = {m for m in LAYERS if m.startswith("postmortem")}
# What each package may reach outside itself.
PACKAGE_MAY_IMPORT = {
    "sources": VOCABULARY,
    "sampling": VOCABULARY | SOURCES,
    "report": VOCABULARY | SAMPLING,
    "sinks": VOCABULARY | SAMPLING | REPORT,
    "postmortem": VOCABULARY | SOURCES | REPORT,
    "overview": VOCABULARY | SOURCES | POSTMORTEM,   # every kernel of this user, in whichever process asks
    **dict.fromkeys(NOTEBOOK),   # anything before it in LAYERS but compat
    "compat": None,              # anything before it in LAYERS but the notebook's packages
}
# At most this many modules loose at nbmon's top (its __init__ included).
MAX_LOOSE = 8

HEAVY = ("IPython", "plotly", "pandas", "pynvml", "distributed")


def loaded_after(statement: str) -> dict[str, bool]:
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps({{m: m in sys.modules for m in {list(HEAVY)!r}}}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_import_nbmon_loads_no_heavy_library():
    assert loaded_after("import nbmon") == {m: False for m in HEAVY}


def test_import_nbmon_engine_loads_no_notebook_library():
    loaded = loaded_after("import nbmon.engine")
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
        return f"nbmon {self.module}:{self.line} imports {self.target} {where}"


def path_of(module: str) -> Path:
    if module == "__init__":
        return PACKAGE / "__init__.py"
    base = PACKAGE.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def imports_of(module: str, source: str | None = None) -> list[Import]:
    """Every import in nbmon's ``module`` (dotted, e.g. 'sources.tree.linux')
    with its absolute target ('nbmon.x.y' for the package's own modules),
    and whether it sits inside a function."""
    if source is None:
        source = path_of(module).read_text()
    tree = ast.parse(source, filename=f"{module}.py")
    found: list[Import] = []
    # The package a relative import starts from: a package's __init__ is its own.
    is_package = module == "__init__" or (module in MODULES and path_of(module).name == "__init__.py")
    here = ["nbmon"] + ([] if module == "__init__" else module.split("."))
    if not is_package:
        here = here[:-1]

    def resolve(level: int, name: str | None) -> str:
        base = here[:len(here) - (level - 1)]
        return ".".join(base + ([name] if name else []))

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: from . import x / from .x import y / from .. import z
                    if child.module:
                        found.append(Import(module, resolve(child.level, child.module), child.lineno,
                                            in_function))
                    else:
                        found.extend(Import(module, resolve(child.level, a.name), child.lineno, in_function)
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
        "from .. import catalog\n"
        "class A:\n"
        "    import plotly.graph_objects\n"
        "    def f(self):\n"
        "        if True:\n"
        "            from IPython.display import HTML\n"
        "async def g():\n"
        "    import pandas\n")
    got = [(i.target, i.line, i.in_function) for i in imports_of("sources.x", source)]
    assert got == [("pandas", 1, False), ("nbmon.sources.nvml", 2, False), ("nbmon.sources.store", 3, False),
                   ("nbmon.live", 4, False), ("nbmon.catalog", 5, False), ("plotly.graph_objects", 7, False),
                   ("IPython.display", 10, True), ("pandas", 12, True)]


def test_the_checker_sees_imports():
    # Guard against a checker that silently finds nothing.
    targets = {i.target for i in ALL_IMPORTS["engine"]}
    assert {"nbmon.sources", "nbmon.sampling.sampler", "nbmon.sampling.store", "threading"} <= targets
    assert any(i.target == "pynvml" and i.in_function for i in ALL_IMPORTS["sources.gpus.nvml"])
    assert any(i.target == "nbmon.kernel.magics" and i.in_function for i in ALL_IMPORTS["__init__"])
    assert "nbmon.catalog" in {i.target for i in ALL_IMPORTS["sources.tree"]}


def own_module(target: str) -> str | None:
    """The LAYERS name of an import of nbmon's own code ('nbmon.sources.cgroup' ->
    'sources.cgroup'; 'nbmon.sources.cgroup.Cgroup' -> 'sources.cgroup'), None otherwise."""
    if not target.startswith("nbmon."):
        return None
    parts = target.split(".")[1:]
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) if parts else None


# library -> the modules (or packages) that may import it
OWNERS = {"IPython": ("kernel.magics",),
          "plotly": ("views.live", "views.pages", "views.cluster"),
          "pynvml": ("sources.gpus.nvml",), "distributed": ("dask",)}


@pytest.mark.parametrize("library, owners", sorted(OWNERS.items()))
def test_heavy_library_is_imported_by_its_owners_only(library, owners):
    offenders = [i for m, imps in ALL_IMPORTS.items()
                 if not any(m == o or m.startswith(o + ".") for o in owners) for i in imps
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
            continue
        target = own_module(imp.target)
        if imp.target.startswith("nbmon.") and (target is None or target not in earlier):
            offenders.append(imp)
    assert offenders == []


@pytest.mark.parametrize("package", sorted(PACKAGE_MAY_IMPORT))
def test_packages_stay_in_their_lane(package):
    """sources/ reads the machine and needs no engine; the notebook's
    packages and compat/ are outer layers that never import each other."""
    allowed = PACKAGE_MAY_IMPORT[package]
    offenders = []
    for module, imps in ALL_IMPORTS.items():
        if module != package and not module.startswith(package + "."):
            continue
        for imp in imps:
            target = own_module(imp.target)
            if target is None or target == package or target.startswith(package + "."):
                continue
            others = NOTEBOOK if package == "compat" else ("compat",) if package in NOTEBOOK else ()
            if (allowed is not None and target not in allowed) or \
                    any(target == other or target.startswith(other + ".") for other in others):
                offenders.append(imp)
    assert offenders == []


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_is_one_block_of_layers(package):
    """A package's modules stand together in LAYERS: with the layer order,
    no two packages import each other (the Dask package, for one, imports
    nothing of the notebook's; the cluster view there imports the Dask package)."""
    places = [k for k, m in enumerate(LAYERS) if m == package or m.startswith(package + ".")]
    assert places == list(range(places[0], places[-1] + 1)), [LAYERS[k] for k in range(places[0], places[-1] + 1)]


def test_no_package_imports_one_that_imports_it():
    reaches = {a: {b for m, imps in ALL_IMPORTS.items() if m == a or m.startswith(a + ".") for i in imps
                   for b in PACKAGES if b != a and (own_module(i.target) or "").startswith(b)}
               for a in PACKAGES}
    assert [(a, b) for a in PACKAGES for b in reaches[a] if a in reaches[b]] == []


def test_few_modules_loose_at_the_top():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE, loose
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "engine"} == VOCABULARY
