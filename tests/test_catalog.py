"""The metric catalog: every metric declared once, and everything that shows a
metric (store columns, samples(), CSV, the chart, scaffold's keys) derived
from it -- so adding one is one catalog entry plus its source's value."""
from __future__ import annotations

import csv
import dataclasses
import time

import pytest

from helpers import wait_until
from nbmon import catalog
from nbmon.engine import Monitor
from nbmon.views import charts
from nbmon.sinks.senders import CSVSender
from nbmon.sources.gpus import nvml
from nbmon.sources.gpus import GPUs
from nbmon.sources.machine import Machine
from nbmon.sources.tree import ProcessTree

KINDS = {catalog.GAUGE, catalog.COUNTER, catalog.RATE}
SUMMARIES = {catalog.PEAK, catalog.MEAN, catalog.LAST, catalog.DELTA}
SOURCES = {catalog.TREE, catalog.MACHINE, catalog.CGROUP, catalog.GPU, catalog.DEVICE}


@pytest.mark.parametrize("metric", catalog.METRICS, ids=lambda m: m.name)
def test_each_metric_is_well_formed(metric):
    assert metric.unit in catalog.UNIT_SUFFIX, metric
    suffix = catalog.UNIT_SUFFIX[metric.unit]
    if suffix:
        assert metric.name.endswith(suffix), f"{metric.name} is in {metric.unit}: name it *{suffix}"
    else:  # a count carries no unit suffix, and no other unit's either
        assert not any(metric.name.endswith(s) for s in catalog.UNIT_SUFFIX.values() if s), metric.name
    assert metric.kind in KINDS and metric.summary in SUMMARIES and metric.source in SOURCES
    assert metric.label and metric.label == metric.label.strip()
    assert metric.chart is None or metric.chart in {row.key for row in charts.ROWS}
    if metric.wandb is not None:
        key, stat = metric.wandb
        assert stat in SUMMARIES
        assert ("{i}" in key) == (metric.source == catalog.DEVICE)
    if metric.source == catalog.GPU:  # a total of a per-device metric
        assert metric.total in ("sum", "mean") and catalog.BY_NAME[metric.of].source == catalog.DEVICE
    else:
        assert metric.total is None and metric.of is None


def test_names_are_unique_and_device_columns_round_trip():
    names = [m.name for m in catalog.METRICS]
    assert len(names) == len(set(names))
    for m in catalog.METRICS:
        if m.source == catalog.DEVICE:
            column = catalog.device_column(3, m.name)
            assert catalog.split_device_column(column) == (3, m.name)
            assert catalog.metric_of(column) is m and catalog.unit_of(column) == m.unit
        else:
            assert catalog.split_device_column(m.name) is None and catalog.metric_of(m.name) is m
    assert catalog.metric_of("an_extra_sources_field") is None


def test_every_chart_row_headline_is_a_catalog_metric():
    for row in charts.ROWS:
        assert catalog.metric_of(row.headline) is not None, row


def test_builtin_sources_return_exactly_their_catalog_metrics(fake_gpu):
    fake_gpu.set(devices=[{"util_gpu": 10}, {"util_gpu": 30}])
    tree, machine, gpus = ProcessTree(), Machine(), GPUs()
    now = time.monotonic()
    for source in (tree, machine, gpus):
        source.start(now)
    try:
        assert tree.fields == catalog.names(catalog.TREE)
        assert machine.fields == catalog.names(catalog.MACHINE)
        assert gpus.fields == catalog.names(catalog.GPU) + tuple(
            catalog.device_column(i, name) for i in (0, 1) for name in catalog.names(catalog.DEVICE))
        for source in (tree, machine, gpus):
            assert set(source.sample(time.monotonic() + 0.01)) == set(source.fields), source.name
    finally:
        for source in (tree, machine, gpus):
            source.close()


def test_fan_speed_is_one_catalog_entry_and_one_query(fake_gpu):
    fake_gpu.set(devices=[{"fan": 42}, {"fan": 77}])
    gpus = GPUs()
    gpus.start(time.monotonic())
    try:
        values = gpus.sample(time.monotonic())
    finally:
        gpus.close()
    assert values["gpu0_fan_percent"] == 42 and values["gpu1_fan_percent"] == 77


def test_a_metric_added_to_the_catalog_reaches_samples_csv_and_chart(fake_gpu, monkeypatch, tmp_path):
    """The newcomer's change: one catalog entry and one NVML query. Nothing
    else is touched, yet the store, samples(), the CSV header and rows, and
    the live chart all carry the new metric."""
    added = catalog.Metric("hotspot_c", "°C", "hotspot temperature", catalog.GAUGE, catalog.PEAK,
                           catalog.DEVICE, chart="gpu_util")
    monkeypatch.setattr(catalog, "METRICS", catalog.METRICS + (added,))
    monkeypatch.setitem(catalog.BY_NAME, added.name, added)
    # The stand-in reports temperature; the new query reads it 10 degrees hotter.
    monkeypatch.setitem(nvml.QUERIES, "hotspot", lambda nv, h: {
        "hotspot_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) + 10})
    fake_gpu.set(devices=[{"temp": 61}])

    path = tmp_path / "samples.csv"
    monitor = Monitor(interval=0.02, system=False, consumers=[CSVSender(path)])
    monitor.start()
    try:
        wait_until(lambda: monitor.store.seq >= 3, what="three samples")
    finally:
        monitor.stop()

    assert "gpu0_hotspot_c" in monitor.fields
    from nbmon.report.records import samples_frame

    # (The baseline at start reads only sources that cannot get stuck: not NVML.)
    frame = samples_frame(*monitor.store.series()).iloc[1:]
    assert len(frame) >= 3 and (frame["gpu0_hotspot_c"] == 71).all()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))[1:]
    assert rows and all(float(r["gpu0_hotspot_c"]) == 71 for r in rows)
    rows_shown, traces = charts.traces_for(monitor.fields)
    hotspot = [t for t in traces if t.column == "gpu0_hotspot_c"]
    assert len(hotspot) == 1 and hotspot[0].label == "GPU 0 hotspot temperature" and hotspot[0].unit == "°C"
    assert rows_shown[hotspot[0].row - 1].key == "gpu_util"

    from nbmon.views.dashboard import Dashboard

    dashboard = Dashboard(monitor, start=False)
    assert "gpu0_hotspot_c" in [trace.meta for trace in dashboard.widget.data]
    dashboard.close()


def test_metric_is_a_frozen_record():
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog.METRICS[0].name = "x"


def test_a_tree_metric_added_at_run_time_reaches_every_consumer(monkeypatch, tmp_path):
    """The newcomer's other change (issue 19): one catalog entry saying how a
    record shows it, and one value from its source -- here the tree's open
    files. It is in samples(), the CSV and JSON Lines files, a span's
    summary and a cell's record, history(), and a Dask worker's batches."""
    import json
    import os

    from distributed import Client, LocalCluster

    import nbmon.dask
    from nbmon.helper.host import SessionHost
    from nbmon.kernel.session import Outlet
    from nbmon.sinks.senders import JSONLinesSender
    from nbmon.report.summary import ResourceSummary
    from nbmon.report.records import history_frame, samples_frame

    added = catalog.Metric("proc_open_files", "", "open files, process tree", catalog.GAUGE, catalog.PEAK,
                           catalog.TREE, record=(catalog.Shown("Open files, most", 85),))
    monkeypatch.setattr(catalog, "METRICS", catalog.METRICS + (added,))
    monkeypatch.setitem(catalog.BY_NAME, added.name, added)
    sample = ProcessTree.sample

    def with_open_files(self, now):  # the source's one new value
        return {**sample(self, now), "proc_open_files": float(sum(len(os.listdir(f"/proc/{p}/fd"))
                                                                  for p in self.pids))}
    monkeypatch.setattr(ProcessTree, "sample", with_open_files)

    csv_path, jsonl_path = tmp_path / "s.csv", tmp_path / "s.jsonl"
    session = SessionHost(os.getpid(), Outlet(), kernel=False)   # the notebook's session, here in this process
    session.monitor = Monitor(interval=0.02, gpu=False, system=False,
                              consumers=[CSVSender(csv_path), JSONLinesSender(jsonl_path)]).start()
    try:
        token = session.cell_open(label="opens")["token"]
        files = [open(os.devnull) for _ in range(40)]
        wait_until(lambda: session.monitor.store.seq >= 5, what="samples")
        for f in files:
            f.close()
        closed = session.cell_close(token, show="record")
    finally:
        session.stop()
    summary = ResourceSummary.from_dict(closed["summary"])
    frame = samples_frame(*session.monitor.store.series())
    assert (frame["proc_open_files"].iloc[1:] > 0).all()
    with open(csv_path, newline="") as f:
        assert float(list(csv.DictReader(f))[-1]["proc_open_files"]) > 0
    assert json.loads(open(jsonl_path).readline())["proc_open_files"] > 0
    most = summary.figures["max_proc_open_files"]
    assert most >= 40
    assert dict(summary.rows())["Open files, most"] == str(int(most))
    assert "Open files, most" in closed["table"]["data"]["text/html"]
    assert history_frame(session.records)["max_proc_open_files"].iloc[-1] == most

    # A worker in this process (its plugin imports the catalog patched here) sends it in its batches.
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        watched = nbmon.dask.watch(client, interval=0.05, gpu=False, system=False)
        try:
            feed = wait_until(lambda: next(iter(watched.collector.feeds.values()), None), what="a worker's feed")
            wait_until(lambda: feed.store.seq >= 2, what="two batches")
            assert "max_proc_open_files" in feed.store.columns
            assert feed.store.latest()["max_proc_open_files"] > 0
        finally:
            nbmon.dask.unwatch()
