"""The workload ``nbmon demo`` watches: a CPU burst, a short memory spike and
a child process, about three seconds in all. Run as ``python -m nbmon.cli.demo``."""
from __future__ import annotations

import subprocess
import sys
import time

CHILD = """
import time
block = bytearray(100 * 1024 * 1024)          # 100 MiB, touched
block[::4096] = b"x" * len(block[::4096])
end = time.perf_counter() + 1.0
while time.perf_counter() < end:              # one core busy for a second
    pass
"""


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def spike(mib: int, hold_s: float) -> None:
    block = bytearray(mib * 1024 * 1024)  # zero-filled, so every page is touched
    time.sleep(hold_s)
    del block


def main() -> None:
    print("demo: 1 s CPU burst", flush=True)
    burn(1.0)
    print("demo: 160 MiB spike for 30 ms (shorter than the sampling interval)", flush=True)
    spike(160, 0.03)
    time.sleep(0.3)
    print("demo: a child process with 100 MiB, busy for 1 s", flush=True)
    subprocess.run([sys.executable, "-c", CHILD], check=True)
    time.sleep(0.3)
    print("demo: done", flush=True)


if __name__ == "__main__":
    main()
