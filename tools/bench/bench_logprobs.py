"""Peak memory and time of the log-prob/entropy step, forward + backward: full logits vs the fused chunked head.

    python -m tools.bench.bench_logprobs                        # V=151,936 (Qwen3), H=576 (SmolLM2), 1k/2k/4k tokens
    python -m tools.bench.bench_logprobs --lengths 8192 --chunks 256 --dtype bfloat16

For each length and chunk size, fresh CPU processes run one step of ``loss = sum(a * logp + b * entropy)``,
``loss.backward()`` with respect to the final hidden states and the head's weight, by two paths:

* ``full``: ``logits = hidden @ weight.T`` (``[L, V]``), then ``logprobs_and_entropy`` (evolrl.logprobs.from_logits),
  which is what ``logprobs/forward.py`` does with the model's logits today;
* ``chunked``: ``head_logprobs_and_entropy`` (evolrl.logprobs.chunked_head), never more than a chunk of logits.

Memory is the process's resident-set high-water mark (``VmHWM``) minus its resident set just before the step, the
inputs already built: torch has no CPU allocator statistics and ``tracemalloc`` does not see its buffers. The
children run with ``MALLOC_MMAP_THRESHOLD_=1MiB`` so that glibc serves every tensor of 1 MiB or more with its own
``mmap`` and returns it on free (by default the threshold grows to 32 MiB and freed buffers below it stay resident),
so the resident set follows live tensors closely. Hence also one fresh process per case. Times are the median of ``--repeats`` steps after the first (which is also timed if alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from tools.common import ROOT, call_times, status_mib


def run_case(path: str, length: int, vocab: int, width: int, chunk: int, dtype: str, repeats: int) -> dict:
    """One case, in this (fresh) process: ``{"peak_mib", "seconds"}``."""
    import torch

    from evolrl.logprobs.chunked_head import head_logprobs_and_entropy
    from evolrl.logprobs.from_logits import logprobs_and_entropy

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    hidden = torch.randn(1, length, width, dtype=dt).requires_grad_(True)
    weight = (torch.randn(vocab, width, dtype=dt) * width**-0.5).requires_grad_(True)
    tokens = torch.randint(0, vocab, (1, length))
    upstream = torch.randn(2, 1, length)

    def step(rows: int):
        h, t, up = hidden[:, :rows], tokens[:, :rows], upstream[:, :, :rows]
        if path == "full":
            logp, entropy = logprobs_and_entropy(h @ weight.T, t, temperature=1.0, chunk_size=chunk)
        else:
            logp, entropy = head_logprobs_and_entropy(h, weight, tokens=t, temperature=1.0, chunk_size=chunk)
        (logp * up[0] + entropy * up[1]).sum().backward()
        hidden.grad = weight.grad = None

    step(8)  # pages in the kernels' code and thread pools: tens of MiB of resident set that are not the step's
    before = status_mib("VmRSS")
    times = call_times(lambda: step(length), repeats)
    return {"peak_mib": status_mib("VmHWM") - before, "seconds": statistics.median(times[1:] or times)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.bench_logprobs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen3: 151,936)")
    parser.add_argument("--hidden", type=int, default=576, help="hidden size (SmolLM2-135M: 576)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096], help="tokens per step")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 256], help="chunk sizes (rows)")
    parser.add_argument("--dtype", default="float32", help="dtype of hidden and weight (bf16 is slow on most CPUs)")
    parser.add_argument("--repeats", type=int, default=1, help="steps per case (median of all but the first)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print its JSON
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(**json.loads(args.case))))
        return

    def measure(path: str, length: int, chunk: int) -> dict:
        case = {"path": path, "length": length, "vocab": args.vocab, "width": args.hidden, "chunk": chunk,
                "dtype": args.dtype, "repeats": args.repeats}
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}  # see the module docstring
        out = subprocess.run([sys.executable, "-m", "tools.bench.bench_logprobs", "--case", json.dumps(case)],
                             check=False, capture_output=True, text=True, env=env, cwd=ROOT)
        if out.returncode:
            raise RuntimeError(f"{case} failed:\n{out.stderr}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    size = 4 if args.dtype == "float32" else 2
    print(f"V={args.vocab} H={args.hidden} {args.dtype}; forward+backward of log-prob+entropy w.r.t. hidden and weight")
    print(f"weight [V, H] = {args.vocab * args.hidden * size / 2**20:.0f} MiB (its gradient too, not counted above "
          "the inputs); peak = VmHWM - RSS before the step")
    print(f"{'tokens':>6} {'chunk':>5} {'logits MiB':>10} | {'full MiB':>8} {'chunked MiB':>11} {'ratio':>5} | "
          f"{'full s':>6} {'chunked s':>9} {'ratio':>5}")
    for length in args.lengths:
        for chunk in args.chunks:
            full, fused = measure("full", length, chunk), measure("chunked", length, chunk)
            logits = length * args.vocab * size / 2**20
            print(f"{length:>6} {chunk:>5} {logits:>10.0f} | {full['peak_mib']:>8.0f} {fused['peak_mib']:>11.0f} "
                  f"{full['peak_mib'] / fused['peak_mib']:>5.2f} | {full['seconds']:>6.2f} {fused['seconds']:>9.2f} "
                  f"{fused['seconds'] / full['seconds']:>5.2f}", flush=True)


if __name__ == "__main__":
    main()
