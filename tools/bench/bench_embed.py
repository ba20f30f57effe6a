"""Time the novelty reward's embedding step: P x V responses of ~300 tokens in one batched call.

Prints the median wall time of one step's embedding (all P*V texts in one call),
of the peer pattern (one call per prompt, as the authors' reward manager did),
their ratio, and the cost of the similarity/band math on the result.

    python -m tools.bench.bench_embed           # P=8, V=64, packaged all-MiniLM-L6-v2, CPU
    python -m tools.bench.bench_embed --model Qwen/Qwen3-Embedding-4B --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import random
import statistics

from tools.common import call_times

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from evolrl.rewards import SentenceTransformerEmbedder, evol_rewards_batched


def synthetic_response(rng: random.Random, words: int) -> str:
    """A math-style worked answer of about ``words`` words (deterministic for a given rng)."""
    steps = []
    while sum(len(s.split()) for s in steps) < words:
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        op, value = rng.choice([("+", a + b), ("-", a - b), ("\\times", a * b)])
        steps.append(
            rng.choice(
                [
                    f"First we compute ${a} {op} {b} = {value}$, which gives the next quantity.",
                    f"Then substituting {a} into the expression, we get {value} after simplifying.",
                    f"Notice that {a} and {b} share no common factor, so the fraction stays as it is.",
                    f"We check the boundary case where $x = {a}$ and find the total is {value}.",
                ]
            )
        )
    return " ".join(steps) + f" Therefore the final answer is $\\boxed{{{rng.randint(1, 999)}}}$."


def median_time(fn, repeats: int) -> float:
    return statistics.median(call_times(fn, repeats))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.bench_embed",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="P")
    parser.add_argument("--votes", type=int, default=64, help="V, responses per prompt")
    parser.add_argument("--words", type=int, default=190, help="words per response (~300 MiniLM tokens)")
    parser.add_argument("--model", default=None, help="sentence-transformers model (default: packaged MiniLM)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rng = random.Random(0)
    texts = [[synthetic_response(rng, args.words) for _ in range(args.votes)] for _ in range(args.prompts)]
    flat = [t for group in texts for t in group]
    embedder = SentenceTransformerEmbedder(args.model, device=args.device, batch_size=args.batch_size, dtype=args.dtype)
    tokenizer = embedder.model.tokenizer
    tokens = [len(tokenizer(t, verbose=False)["input_ids"]) for t in flat]
    embedder.embed(flat[: args.batch_size])  # warm-up

    one_call = median_time(lambda: embedder.embed(flat), args.repeats)
    per_prompt = median_time(lambda: [embedder.embed(group) for group in texts], args.repeats)
    emb = embedder.embed(flat).view(args.prompts, args.votes, -1)
    g = torch.Generator().manual_seed(0)
    majority = torch.rand(args.prompts, args.votes, generator=g) < 0.6
    valid = torch.rand(args.prompts, args.votes, generator=g) < 0.9
    math_time = median_time(lambda: evol_rewards_batched(emb, majority, valid), max(args.repeats, 5))

    print(f"model: {args.model or 'all-MiniLM-L6-v2 (packaged)'}  device: {args.device}  torch threads: "
          f"{torch.get_num_threads()}")
    print(f"texts: {len(flat)} = P {args.prompts} x V {args.votes}; tokens per text: mean {statistics.mean(tokens):.0f}, "
          f"max {max(tokens)} (model truncates at {embedder.model.max_seq_length})")
    print(f"one batched call (evolrl):      {one_call:7.2f} s")
    print(f"one call per prompt (peer):     {per_prompt:7.2f} s")
    print(f"ratio evolrl / peer:            {one_call / per_prompt:7.2f}")
    print(f"similarity + bands [P, V, V]:   {math_time * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
