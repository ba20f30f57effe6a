"""Per-sequence causal sdpa on a GPU, backend by backend: what a packed pass's attention costs when every step
brings sequence lengths never seen before (as training does), against the same lengths again.

    python -m tools.bench.bench_sdpa               # Qwen3-1.7B's attention shape, 16 sequences, 3 fresh draws
    python -m tools.bench.bench_sdpa --heads 32 --kv-heads 8 --draws 5

``evolrl/logprobs/sequencewise_attention.py`` attends one sequence at a time. torch picks an sdpa backend per call
(its default order, which on a Hopper GPU can pick cuDNN's attention); cuDNN's builds an execution plan for each new
shape, which a step of new lengths pays on every sequence. Per backend (torch's default choice, ``flash``, ``cudnn``,
``efficient``), per draw of ``--sequences`` lengths (``--prompt`` + log-normal responses, median ``--median``, sigma 1,
capped at ``--cap``: ``bench_update.responses``; a new seed per draw, each backend's one token longer than the
previous backend's, so new shapes for every backend and draw): forward + backward of every sequence, bf16,
``enable_gqa``, timed with the device synchronized; "fresh" is the first pass over a draw, "again" the second. Prints the medians over
draws and each backend's fresh time over the fastest backend's (a ratio against a peer measured in the same run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tools.bench.bench_update import responses

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def attend(sizes: list[int], heads: int, kv_heads: int, dim: int, backend) -> float:
    """Seconds for forward + backward of one causal sdpa call per sequence of ``sizes``."""
    q = torch.randn(1, heads, sum(sizes), dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, kv_heads, sum(sizes), dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    torch.cuda.synchronize()
    start = time.perf_counter()
    with sdpa_kernel(backend) if backend is not None else nullcontext():  # None: torch's own choice
        parts = [F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=heads != kv_heads)
                 for a, b, c in zip(q.split(sizes, 2), k.split(sizes, 2), v.split(sizes, 2))]
    torch.cat(parts, dim=2).sum().backward()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench.bench_sdpa",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--median", type=float, default=2000)
    p.add_argument("--cap", type=int, default=12288)
    p.add_argument("--draws", type=int, default=3)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_sdpa needs a CUDA device (on a CPU torch has one sdpa backend to choose)")
    print(f"{torch.cuda.get_device_name()}, torch {torch.version.__version__}; {a.sequences} sequences a draw, heads "
          f"{a.heads}, kv heads {a.kv_heads}, dim {a.dim}, bf16, forward + backward")
    attend([64, 64], a.heads, a.kv_heads, a.dim, None)  # CUDA context, cuBLAS and the first kernels loaded
    rows = {}
    for name, backend in BACKENDS.items():
        fresh, again = [], []
        for d in range(a.draws):
            # the same lengths for every backend but one token longer per backend: shapes no backend has seen
            draw = responses("heavy", a.sequences, median=a.median, sigma=1.0, cap=a.cap, seed=d)
            sizes = [a.prompt + n + list(BACKENDS).index(name) for n in draw]
            try:
                fresh.append(attend(sizes, a.heads, a.kv_heads, a.dim, backend))
                again.append(attend(sizes, a.heads, a.kv_heads, a.dim, backend))
            except RuntimeError as error:  # a backend that does not take these inputs on this card
                print(f"{name}: not run ({str(error).splitlines()[0][:160]})")
                break
        else:
            rows[name] = (statistics.median(fresh), statistics.median(again))
    best = min(f for f, _ in rows.values())
    print("\n| backend | fresh lengths s | same lengths again s | fresh / again | fresh / fastest fresh |")
    print("| --- | --- | --- | --- | --- |")
    for name, (fresh, again) in rows.items():
        print(f"| {name} | {fresh:.3f} | {again:.3f} | {fresh / again:.2f} | {fresh / best:.2f} |")


if __name__ == "__main__":
    main()
