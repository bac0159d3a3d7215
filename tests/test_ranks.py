"""The ranks of a distributed job: ``nbmon run --rank-dir`` under launcher
variables, ``nbmon.read_ranks`` and ``nbmon report``. The ranks are real
processes; what they did is what they say of themselves (VmHWM, their clock)."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import time

import pytest

import nbmon
from nbmon.cli.ranks import rank_of, rank_table, text_report

# Each rank says how much it held at its largest (its own VmRSS while it
# held its block: VmHWM would not do, nbmon resets it to catch the next peak).
WORKLOAD = r"""
import json, os, time
rank = int(os.environ.get("RANK", "0"))
block = b"\x01" * ((400 if rank == 2 else 30) << 20)   # rank 2: the memory outlier
with open("/proc/self/status") as f:
    held = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
time.sleep(3.0 if rank == 1 else 0.5)                  # rank 1: the straggler
del block
print(json.dumps({"rank": rank, "held_mb": held / 1024, "end": time.time()}))
"""


def nbmon_cli(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbmon.cli", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=120, **kw)


def torchrun_env(rank: int, world: int) -> dict:
    """What torchrun sets for each of its workers."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "ROLE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "nbmon-test"}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """4 ranks started as torchrun would start them, each under nbmon run."""
    runs = tmp_path_factory.mktemp("ranks")
    procs = [subprocess.Popen([sys.executable, "-m", "nbmon.cli", "run", "--quiet", "--interval", "0.05",
                               "--rank-dir", str(runs), "--", sys.executable, "-c", WORKLOAD],
                              env={**os.environ, **torchrun_env(r, 4)}, stdout=subprocess.PIPE, text=True)
             for r in range(4)]
    told = {}
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        said = json.loads(out.strip().splitlines()[-1])
        told[said["rank"]] = said
    return runs, told


def test_each_rank_writes_its_own_file_tagged_with_its_rank(job):
    runs, _ = job
    assert sorted(os.listdir(runs)) == [f"rank-{r:05d}.jsonl" for r in range(4)]
    with open(runs / "rank-00002.jsonl") as f:
        first = json.loads(f.readline())
    assert first["rank"] == 2 and first["local_rank"] == 2 and first["world_size"] == 4
    assert first["launcher"] == "torchrun" and first["host"] == socket.gethostname()


def test_read_ranks_merges_them_on_one_time_axis(job):
    runs, told = job
    frame = nbmon.read_ranks(str(runs / "rank-*.jsonl"))
    assert sorted(frame["rank"].unique()) == [0, 1, 2, 3]
    assert set(frame["host"]) == {socket.gethostname()}
    assert frame["elapsed_s"].min() == 0.0 and frame["elapsed_s"].is_monotonic_increasing
    assert str(frame.index.tz) == "UTC"
    starts = frame.groupby("rank")["elapsed_s"].min()
    assert starts.max() < 10, starts   # started together: on one axis, their starts are close
    table = rank_table(frame)
    # The exact peak of each rank's tree against what the rank's process itself saw.
    for rank, said in told.items():
        assert table.at[rank, "peak_rss_mb"] >= 0.95 * said["held_mb"], (rank, table.at[rank, "peak_rss_mb"], said)
    assert table.index[table["largest"]].tolist() == [max(told, key=lambda r: told[r]["held_mb"])] == [2]
    assert table.index[table["straggler"]].tolist() == [max(told, key=lambda r: told[r]["end"])]
    assert table.at[1, "duration_s"] > table.at[0, "duration_s"] + 2


def test_report_names_the_memory_outlier_and_draws_a_trace_per_rank(job, tmp_path):
    runs, told = job
    page = tmp_path / "report.html"
    done = nbmon_cli("report", str(runs / "rank-*.jsonl"), "--html", str(page))
    assert done.returncode == 0, done.stderr
    largest = max(told, key=lambda r: told[r]["held_mb"])
    assert f"rank {largest} used the most memory" in done.stdout
    text = page.read_text()
    assert re.search(rf'class="nbmon-ranks" data-straggler="{max(told, key=lambda r: told[r]["end"])}" '
                     rf'data-largest="{largest}"', text)
    table = text[text.index('class="nbmon-ranks-largest"'):]
    assert re.search(r"<tr><td[^>]*>(\d+)</td>", table).group(1) == str(largest)   # first row: the largest
    for rank in range(4):
        assert f'"name":"rank {rank}"' in text
    again = nbmon_cli("report", str(runs / "rank-*.jsonl"), "--html", str(page))
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists" in again.stderr
    assert page.read_text() == text


def test_launcher_variables():
    assert rank_of({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8"}) \
        == {"rank": 5, "local_rank": 1, "world_size": 8, "launcher": "Open MPI"}
    assert rank_of({"SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4"})["launcher"] == "Slurm"
    assert rank_of({"PMI_RANK": "2", "PMI_SIZE": "4"})["rank"] == 2
    # torchrun inside a Slurm step: torchrun's rank is the process's
    assert rank_of({"SLURM_PROCID": "0", "RANK": "6"})["rank"] == 6
    assert rank_of({}) is None
    assert rank_of({"RANK": "1"}, given="4") == {"rank": 4, "local_rank": None, "world_size": None,
                                                 "launcher": "--rank"}
    with pytest.raises(ValueError, match=r"^SLURM_PROCID='-1' is not a rank \(a whole number, 0 or more\)$"):
        rank_of({"SLURM_PROCID": "-1"})


def test_mpirun_rank_names_the_file(tmp_path):
    done = nbmon_cli("run", "--quiet", "--rank-dir", str(tmp_path), "--", sys.executable, "-c",
                     "import time; time.sleep(0.5)", env={"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"})
    assert done.returncode == 0, done.stderr
    frame = nbmon.read_ranks(str(tmp_path / "rank-00005.jsonl"))
    assert set(frame["rank"]) == {5}


def _rank_main(directory: str, rank: int) -> None:
    from nbmon.cli import main

    sys.exit(main(["run", "--quiet", "--rank-dir", directory, "--rank", str(rank), "--",
                   sys.executable, "-c", "import time; time.sleep(0.5)"]))


def test_plain_multiprocessing_gives_the_rank_with_an_option(tmp_path):
    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=_rank_main, args=(str(tmp_path), r)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    frame = nbmon.read_ranks([str(tmp_path / "rank-00000.jsonl"), str(tmp_path / "rank-00001.jsonl")])
    assert sorted(frame["rank"].unique()) == [0, 1]


def test_system_monitor_rank_lines_are_read_too(tmp_path):
    path = tmp_path / "rank3.jsonl"
    sender = nbmon.JSONLinesSender(str(path))
    monitor = nbmon.SystemMonitor(os.getpid(), sender, sample_rate_seconds=0.2, rank=3)
    monitor.start()
    time.sleep(1.1)
    monitor.flush()
    monitor.shutdown()
    sender.close()
    with open("/proc/self/status") as f:
        rss_mb = next(float(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    with pytest.raises(ValueError, match=r"rank3.jsonl has lines without a time: pass period_s"):
        nbmon.read_ranks(str(path))
    frame = nbmon.read_ranks(str(path), period_s=0.2)
    assert set(frame["rank"]) == {3} and len(frame) >= 4
    assert frame["elapsed_s"].tolist()[:3] == pytest.approx([0.0, 0.2, 0.4])
    # WandB names back to the catalog's: proc.memory.rssMB is the tree's RSS
    assert frame["proc_rss_mb"].iloc[-1] == pytest.approx(rss_mb, rel=0.2)
    assert "sys_cpu_percent" in frame.columns
    assert "rank 3 used the most memory" in text_report(rank_table(frame))   # no host known: still a table


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"^no file matches '.*nothing-\*\.jsonl'$"):
        nbmon.read_ranks(str(tmp_path / "nothing-*.jsonl"))
    broken = tmp_path / "rank-00001.jsonl"
    broken.write_text('{"rank": 1, "time": 1.0}\n{"rank": 1, "ti\n')
    with pytest.raises(ValueError, match=r"rank-00001.jsonl, line 2: not JSON"):
        nbmon.read_ranks(str(broken))
    anonymous = tmp_path / "job.jsonl"
    anonymous.write_text('{"time": 1.0, "proc_rss_mb": 3}\n')
    with pytest.raises(ValueError, match=r"job.jsonl, line 1: no rank, in the line nor in the file's name"):
        nbmon.read_ranks(str(anonymous))
    runs = tmp_path / "runs"
    runs.mkdir()
    for args, env, message in (
            (["--rank-dir", str(tmp_path / "missing")], {}, "is not a directory"),
            (["--rank-dir", str(runs)], {"RANK": "abc"}, "RANK='abc' is not a rank"),
            (["--rank", "3"], {}, "--rank needs --rank-dir"),
            (["--rank-dir", str(runs), "--rank", "1", "--jsonl", str(tmp_path / "x.jsonl")], {},
             "leave out --jsonl")):
        done = nbmon_cli("run", *args, "--", sys.executable, "-c", "open('ran', 'w')", env=env, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert os.listdir(runs) == [] and not (tmp_path / "ran").exists() and not (tmp_path / "x.jsonl").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")}
    done = subprocess.run([sys.executable, "-m", "nbmon.cli", "run", "--rank-dir", str(runs), "--", "true"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no rank in the environment" in done.stderr and "give --rank N" in done.stderr
    assert nbmon_cli("report", "--period", "0", str(broken)).stderr.startswith("nbmon: error: --period must be")
