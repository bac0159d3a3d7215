"""Check nbmon's GPU figures on a real NVIDIA GPU with PyTorch.

    python scripts/gpu_check.py [--seconds 8]

Runs a bf16 matmul loop on cuda:0 under nbmon's Monitor and checks:
utilisation is high while it runs, the process tree's GPU memory covers
torch.cuda.memory_reserved() (NVML also counts the CUDA context, so it reads
somewhat more), power is between 0 and the enforced limit, and the SM clock
is non-zero. Prints a table and exits 1 if a check fails.
"""
from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()

    import torch

    import nbmon.sources.gpus.nvml
    from nbmon.engine import Monitor

    if not torch.cuda.is_available() or not nbmon.sources.gpus.nvml.init():
        print(f"no usable GPU: torch.cuda.is_available()={torch.cuda.is_available()}, "
              f"NVML: {nbmon.sources.gpus.nvml.status()}")
        return 1
    print(f"GPU: {torch.cuda.get_device_name(0)}, NVML devices: {nbmon.sources.gpus.nvml._device_count}")
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()

    monitor = Monitor(interval=0.1).start()
    time.sleep(0.5)
    with monitor.window() as span:
        end = time.perf_counter() + args.seconds
        iters = 0
        while time.perf_counter() < end:
            for _ in range(20):
                c = a @ b
            torch.cuda.synchronize()
            iters += 20
        reserved_mb = torch.cuda.memory_reserved() / 2**20
    summary = span.summary()
    latest = monitor.latest()
    monitor.stop()
    tflops = 2 * n**3 * iters / args.seconds / 1e12
    del c

    stats = span.window.stats()
    util_mean = stats.value("mean", "gpu0_util_percent")
    proc_mem_peak = stats.value("max", "gpu0_proc_mem_mb")
    power_mean = stats.value("mean", "gpu0_power_w")
    power_limit = stats.value("last", "gpu0_power_limit_w")
    sm_clock = stats.value("mean", "gpu0_sm_clock_mhz")
    mem_clock = stats.value("mean", "gpu0_mem_clock_mhz")
    temp = stats.value("max", "gpu0_temp_c")
    checks = [
        ("mean utilisation > 80 %", util_mean > 80, f"{util_mean:.1f} %"),
        ("tree GPU memory >= torch reserved", proc_mem_peak >= reserved_mb,
         f"{proc_mem_peak:.0f} MiB vs reserved {reserved_mb:.0f} MiB"),
        ("tree GPU memory <= reserved + 4 GiB (CUDA context)", proc_mem_peak <= reserved_mb + 4096,
         f"{proc_mem_peak - reserved_mb:.0f} MiB over reserved"),
        ("0 < power <= limit", 0 < power_mean <= power_limit * 1.05,
         f"{power_mean:.0f} W of {power_limit:.0f} W"),
        ("SM clock > 0", sm_clock > 0, f"{sm_clock:.0f} MHz (memory {mem_clock:.0f} MHz)"),
        ("temperature read", temp == temp, f"{temp:.0f} °C"),
        ("summary has GPU fields", summary.mean_gpu_util is not None and summary.peak_proc_gpu_mem_mb is not None,
         f"mean_gpu_util={summary.mean_gpu_util}, peak_proc_gpu_mem_mb={summary.peak_proc_gpu_mem_mb}"),
    ]
    print(f"workload: {iters} bf16 matmuls {n}x{n} in {args.seconds:.0f} s = {tflops:.0f} TFLOP/s")
    print(f"samples in span: {summary.num_samples}, faults: {monitor.faults or 'none'}")
    print("latest gpu0: " + ", ".join(f"{k}={v:.1f}" for k, v in latest.items() if k.startswith("gpu0_")))
    print("\n| check | result | value |\n|---|---|---|")
    for name, ok, value in checks:
        print(f"| {name} | {'PASS' if ok else 'FAIL'} | {value} |")
    print("\n" + str(summary))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
