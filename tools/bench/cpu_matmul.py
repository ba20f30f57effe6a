"""This CPU's matmul rate in float32 and in bf16, and whether evolrl sees native bf16 (evolrl/cpu_bf16.py).

    python -m tools.bench.cpu_matmul               # square 2048 matmuls, 3 timed after one warm-up each
    python -m tools.bench.cpu_matmul --size 512

The ratio is what ``cpu_bf16: auto`` is about: where bf16 is emulated it runs at a fraction of a percent of float32.
"""

from __future__ import annotations

import argparse
import time

import torch

from evolrl.cpu_bf16 import native_bf16


def gflops(dtype: torch.dtype, size: int, repeats: int = 3) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench.cpu_matmul",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=2048)
    a = p.parse_args()
    if a.size < 1:
        p.error(f"--size {a.size}: a matmul side is 1 or more")
    fp32, bf16 = gflops(torch.float32, a.size), gflops(torch.bfloat16, a.size)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads, native bf16: {native_bf16()}")
    print(f"float32 {fp32:.1f} GFLOP/s, bf16 {bf16:.1f} GFLOP/s, bf16 / float32 {bf16 / fp32:.3f}")


if __name__ == "__main__":
    main()
