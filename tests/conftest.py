"""Shared fixtures: no test may leave an nbmon thread running, a stand-in
NVML library (compiled from tests/fake_nvml) under the real pynvml module, and
a real IPython shell with nbmon loaded. Plain helpers live in helpers.py."""
from __future__ import annotations

import time

import pytest

from fake_nvml import CONFIG_ENV, FakeNVML, build, unload_from_pynvml
from helpers import nbmon_threads, wait_until


@pytest.fixture(autouse=True)
def no_leaked_threads(request):
    """Fail any test that leaves an nbmon-* thread alive (after a bounded grace
    period for threads that were told to stop). Tests that deliberately
    abandon a stuck thread mark themselves with ``allow_stuck_thread``."""
    before = set(nbmon_threads())
    yield
    if request.node.get_closest_marker("allow_stuck_thread"):
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        leaked = [t for t in nbmon_threads() if t not in before]
        if not leaked:
            return
        time.sleep(0.02)
    pytest.fail(f"test left threads running: {[t.name for t in leaked]}")


# The suite's tiers (pytest -m NAME): what a test needs beyond this process.
# A test in none of them is "quick": ``pytest -m quick`` runs in a few
# minutes. CI runs every tier (.ci/run).
TIERS = {
    "browser": "drives headless Chromium (JupyterLab, Notebook 7, Voila, nbconvert's pages)",
    "kernel": "runs notebooks in real Jupyter kernels",
    "cluster": "starts a Dask cluster",
    "multiuser": "acts as a real second local user (needs root)",
    "slow": "takes ten seconds or more on its own (soaks, cycles, pip installs)",
    "quick": "in none of the tiers above",
}
MODULE_TIERS = {
    "test_browser": ("browser",), "test_dashboard_browser": ("browser",), "test_postmortem_browser": ("browser",),
    "test_voila_browser": ("browser",), "test_record_viewers": ("browser", "kernel"),
    "test_dask_browser": ("browser", "cluster"), "test_dask_cluster": ("cluster",),
    "test_dask_notebook": ("cluster", "kernel"), "test_cell_errors": ("kernel",), "test_corpus": ("kernel",), "test_peak_labels": ("kernel",), "test_footprint": ("kernel",), "test_notebooks": ("kernel",),
    "test_postmortem": ("kernel",), "test_variables": ("kernel",), "test_warmup": ("kernel",),
    "test_memory_guard": ("kernel",), "test_notebook_records": ("kernel",),
    "test_soak": ("slow",), "test_reliability_lifecycle": ("slow",), "test_plugins": ("slow",),
}
FIXTURE_TIERS = {"other_user": "multiuser", "shared_dir": "multiuser", "cluster": "cluster"}
SLOW_TESTS = ("test_a_sink_added_to_the_table_reaches_every_front_end", "test_a_daemon_the_command_left_is_named",
              "test_20000_cells_keep_the_history_bounded")


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_stuck_thread: the test abandons a stuck thread on purpose")
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(items):
    for item in items:
        tiers = set(MODULE_TIERS.get(item.module.__name__, ()))
        tiers.update(tier for fixture, tier in FIXTURE_TIERS.items() if fixture in item.fixturenames)
        if item.name.startswith(SLOW_TESTS):
            tiers.add("slow")
        for tier in sorted(tiers) or ["quick"]:
            item.add_marker(tier)


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory) -> str:
    return build(tmp_path_factory.mktemp("fake_nvml"))


@pytest.fixture
def fake_gpu(fake_nvml_lib, tmp_path, monkeypatch):
    """A FakeNVML (no devices until the test calls .set) that nbmon's NVML
    source loads through ``NBMON_NVML_LIBRARY``; NVML state is reset after."""
    import nbmon.sources.gpus.nvml

    nbmon.sources.gpus.nvml.shutdown()
    fake = FakeNVML(tmp_path / "nvml.conf")
    monkeypatch.setenv(CONFIG_ENV, str(fake.path))
    monkeypatch.setenv("NBMON_NVML_LIBRARY", fake_nvml_lib)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # it picks devices: the test's fakes, all of them
    yield fake
    nbmon.sources.gpus.nvml.shutdown()
    unload_from_pynvml()


@pytest.fixture
def session():
    """The notebook's session outside a shell (``nbmon.monitor()`` from a
    script); closed afterwards, its helper process and relay thread gone."""
    from nbmon.kernel.session import SESSION

    yield SESSION
    SESSION.close()


@pytest.fixture(scope="module")
def ipython():
    from IPython.testing import globalipapp

    # start_ipython() answers None once any module has called it: then
    # globalipapp.get_ipython() is the shell it made.
    return globalipapp.start_ipython() or globalipapp.get_ipython()


@pytest.fixture
def ip(ipython):
    """The shell with nbmon loaded and rich display formats on (as in a kernel);
    afterwards nbmon is unloaded, which stops every nbmon thread."""
    from IPython.utils.capture import capture_output

    saved = list(ipython.display_formatter.active_types)
    ipython.display_formatter.active_types = list(ipython.display_formatter.format_types)
    with capture_output():
        ipython.run_line_magic("load_ext", "nbmon")
    from nbmon.kernel.session import SESSION

    # The helper imports the meter's widgets in the background: let it finish,
    # so that the tests' snapshots of its threads start from its steady state.
    wait_until(lambda: "nbmon-warmup" not in SESSION.host.info()["threads"], timeout=60.0,
               what="the helper's warm-up to end")
    yield ipython
    with capture_output():
        ipython.run_line_magic("unload_ext", "nbmon")
    ipython.display_formatter.active_types = saved
    for name in [k for k in ipython.user_ns if k.startswith("rm_")]:
        del ipython.user_ns[name]
    wait_until(lambda: not nbmon_threads(), timeout=10.0, what="nbmon threads to end after unload")
