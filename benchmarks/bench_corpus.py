"""What nbmon costs a realistic notebook end to end: "Run All" of each
notebook of the corpus (tests/corpus: pandas with many small cells,
matplotlib plots, a model fitted with NumPy) plain, with ``%resmon auto
on`` and with ``%%resmon`` on every cell, in real kernels (nbclient).

    python benchmarks/bench_corpus.py [--rounds N] [--before DIR] [--out benchmarks/RESULTS.md]

A fresh kernel per run, one at a time, modes interleaved, each round
starting one further along; a run's time is its cells' (the kernel's start
apart, nbmon's set-up cell in). The table gives the median over rounds of
each round's ratio to plain (machine drift between rounds cancels) and the
median seconds. ``--before DIR`` runs another checkout's nbmon (on the
kernels' PYTHONPATH) in the same rounds. Page heights are the test's
(tests/test_corpus.py, FIGURE lines with -s).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import results_file  # noqa: E402
from corpus_notebooks import MODES, NOTEBOOKS, notebook, run  # noqa: E402


def commit(directory: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=directory).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default=None, help="another checkout to measure beside this one")
    parser.add_argument("--out", default=None, help="write the section into this RESULTS.md")
    args = parser.parse_args()
    versions = {f"after ({commit(HERE.parent)})" if args.before else "this": HERE.parent}
    if args.before:
        versions = {f"before ({commit(Path(args.before))})": Path(args.before).resolve(), **versions}
    conditions = [("plain", None)] + [(mode, version) for version in versions for mode in MODES if mode != "plain"]
    seconds: dict[tuple, list[float]] = {}
    with tempfile.TemporaryDirectory() as cwd:
        for r in range(args.rounds):
            for name in NOTEBOOKS:
                shift = r % len(conditions)
                for mode, version in conditions[shift:] + conditions[:shift]:
                    env = dict(os.environ, PYTHONPATH=str(versions[version])) if version else None
                    seconds.setdefault((name, mode, version), []).append(run(notebook(name, mode), Path(cwd), env))
                print(f"round {r + 1}/{args.rounds} {name} done", file=sys.stderr)
    header = ["notebook", "cells", "plain"] + [f"{mode} {version}" if len(versions) > 1 else mode
                                                for mode, version in conditions[1:]]
    lines = ["## A realistic notebook, end to end", "",
             f"{', '.join(versions)}; {platform.platform()}, {os.cpu_count()} CPUs, Python "
             f"{platform.python_version()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. "
             f"`python benchmarks/bench_corpus.py --rounds {args.rounds}{' --before DIR' if args.before else ''}`.",
             "", "\"Run All\" of each corpus notebook (tests/corpus) in a fresh kernel per run, modes interleaved: "
             "the median of each round's ratio to plain (median seconds of its cells).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in NOTEBOOKS:
        plain = seconds[name, "plain", None]
        cells = sum(c.cell_type == "code" for c in notebook(name, "plain").cells) - 1
        row = [name, str(cells), f"1.000× ({statistics.median(plain):.2f} s)"]
        for mode, version in conditions[1:]:
            took = seconds[name, mode, version]
            ratio = statistics.median(t / p for t, p in zip(took, plain))
            row.append(f"{ratio:.3f}× ({statistics.median(took):.2f} s)")
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        results_file.update(args.out, text, owns=r"## A realistic notebook", header=False)


if __name__ == "__main__":
    main()
