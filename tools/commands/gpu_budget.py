"""Estimated per-GPU memory of a run, component by component, with and without vLLM's sleep mode.

    python -m tools.commands.gpu_budget                      # Qwen3-4B-Base, configs/paper (8 x 80 GB)
    python -m tools.commands.gpu_budget --config path/to/config.json --gpus 8 --gpu-gib 80
    python -m tools.commands.gpu_budget --gpus 1 --no-vllm --no-embedder --sgd   # the trainer alone (one H100)
    python -m tools.commands.gpu_budget --gpus 1 --strategy auto --lora-rank 32 --sleep   # configs/paper/lora.yaml
    python -m tools.commands.gpu_budget --gpus 1 --no-vllm --checkpoint-every 3   # model.gradient_checkpointing: 3
    python -m tools.commands.gpu_budget --gpus 1 --shape 1.7b --teacher   # Co-rewarding II's EMA teacher, counted

Sampling and scoring hold vLLM, the embedder and the trainer's states. The update holds the states throughout and
peaks at one of the moments its backward passes through, each with its own tensors resident: the start (the last
layer's backward: gathered weights, every kept activation, the gradients of a mini-batch's earlier passes), the LM
head's backward (its fp32 buffers), the end (layer 0's backward: the gradients complete, the gathered copies and the
activations released) and, in a mini-batch of several passes, the end of a pass before the last. The update column
prints the largest moment's components; the line below the table names it and gives the others.

Accuracy: within +2% to +7% of every one-GPU peak recorded on an H100 and an H200, never under
(``tests/test_gpu_budget.py`` holds the rows; docs/gpu.md, "The memory budget"). The per-layer activations are bytes
saved for the backward, counted on a CPU at Qwen3's shapes; one term is fitted to four of the peaks (``BETA``); the
estimate adds a 3% margin (``MARGIN``). Defaults: the paper configs (P = 1 prompt per rank, V = 64 samples of up to
1,024 + 12,288 tokens, mini-batches of two full passes of 32,768 tokens, every layer checkpointed, FSDP2 with bf16
gathers, fp32 master weights, a bf16 reference with fp32 embeddings, Qwen3-Embedding-4B in bf16 embedding 8 texts at
a time). ``--lora-rank R``: the base frozen in bf16, fp32 adapters of rank R on every linear layer of attention and
the MLP with their gradients and AdamW moments, no separate reference, a frozen head.

Below the table, ``gradient checkpointing that fits`` names the n of ``model.gradient_checkpointing: n`` (every n-th
decoder layer) that fits ``--gpu-gib`` with the fewest layers checkpointed (the least recomputation).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

GIB = 2**30


@dataclass(frozen=True)
class Shape:
    """The decoder's shape (a Hugging Face config's fields)."""

    params: float
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    heads: int
    tied: bool = True

    def lora_params(self, rank: int) -> float:
        """Adapter parameters of rank ``rank`` on q, k, v, o, gate, up and down: ``rank x (in + out)`` each."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = (self.hidden + q) * 2 + (self.hidden + kv) * 2 + (self.hidden + self.intermediate) * 3
        return rank * per_layer * self.layers


QWEN3_COMMON = {"vocab_size": 151936, "head_dim": 128, "num_key_value_heads": 8, "max_position_embeddings": 40960,
                "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}
QWEN3 = {
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "tie_word_embeddings": True},
    "qwen3-1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "tie_word_embeddings": True},
    "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "tie_word_embeddings": True},
    "qwen3-8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "tie_word_embeddings": False},
}
"""Name -> the fields of Qwen/Qwen3-<size>'s config.json that differ between sizes (the rest: ``QWEN3_COMMON``)."""


def from_config(path_or_fields: str | dict) -> Shape:
    """The shape of a Hugging Face config.json (a path), or of its fields."""
    cfg = path_or_fields if isinstance(path_or_fields, dict) else json.loads(Path(path_or_fields).read_text())
    heads, hidden, inter, layers = (cfg[k] for k in ("num_attention_heads", "hidden_size", "intermediate_size",
                                                     "num_hidden_layers"))
    kv, head_dim, tied = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or hidden // heads, bool(
        cfg.get("tie_word_embeddings"))
    params = layers * (hidden * head_dim * (heads + kv) * 2 + 3 * hidden * inter) + cfg["vocab_size"] * hidden * (
        2 - tied)  # q, o, k, v; gate, up, down; the embeddings and an untied head
    return Shape(params, hidden, layers, kv, head_dim, inter, cfg["vocab_size"], heads, tied)


MARGIN = 1.03
"""The update's estimate is its largest moment's sum x 1.03, conservative on purpose: the sum alone fell 1% under the
one recorded peak with 18 compiled layers unchecked (whose saved tensors were counted on a CPU's inductor, not CUDA's),
and small tensors (workspaces, reduce buffers, log-probs) are not itemized."""
BETA = 6
"""One block's backward working set in bytes per token, x intermediate (the MLP's bf16 gradient buffers): the one
fitted term, fitted on the four recorded peaks that end at layer 0's backward with today's code."""

Row = tuple[str, str, float]
"""(component, formula, bytes)."""


@dataclass(frozen=True)
class Update:
    """How the update runs: the settings that move its peak."""

    gpus: int = 8
    strategy: str = "fsdp"
    """fsdp: FSDP2, a block's gathered copy freed after its forward; held: FSDP2 on one GPU keeping them through a pass
    (``reshard_after_forward`` null there); single: one process (``trainer.strategy: auto``)."""
    plan: tuple[tuple[int, ...], ...] = ((32768, 32768),)
    """Tokens of each pass, by mini-batch."""
    every: int = 1
    compiled: bool = False
    chunk: int = 1024
    adamw: bool = True
    lora_rank: int = 0
    teacher: bool = False
    reduce_every_pass: bool = False
    logits: int = 0
    """Padded passes without the fused head: logit positions per pass (sequences x new tokens); 0: the fused head."""


def checkpointed_layers(layers: int, every: int) -> int:
    """How many of ``layers`` decoder layers ``model.gradient_checkpointing: every`` checkpoints (0, every, 2 x every,
    ...): ``ceil(layers / every)``; none for 0."""
    return -(-layers // every) if every else 0


def every_nth(n: int) -> str:
    """``every layer``, ``every 2nd layer``, ``every 3rd layer``, ``every 4th layer``, ..."""
    if n == 1:
        return "every layer"
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"every {n}{suffix} layer"


def states(m: Shape, u: Update) -> list[Row]:
    """What stays resident through sampling and the update: weights, optimizer state, reference, teacher."""
    n, params, embed = u.gpus, m.params, m.vocab * m.hidden
    if u.lora_rank:
        lora = m.lora_params(u.lora_rank)
        rows = [("frozen base shard (bf16)", f"params / {n} x 2 B", params / n * 2),
                (f"adapters, rank {u.lora_rank}, their gradients and AdamW moments (fp32)",
                 f"{lora / 1e6:.0f}M x {8 + 8 * u.adamw} B", lora * (8 + 8 * u.adamw))]
    else:
        rows = [("policy master shard (fp32)", f"params / {n} x 4 B", params / n * 4),
                ("AdamW moments (fp32)", f"2 x params / {n} x 4 B", params / n * 8 * u.adamw),
                # Under autocast the reference keeps its embeddings (and norms) as loaded, fp32 (build.parameters_in).
                ("reference shard (bf16 linear, fp32 embeddings)", f"(params + vocab x hidden) / {n} x 2 B",
                 (params + embed) / n * 2)]
        if u.strategy != "single":  # FSDP2 never reshards a root after forward; the reference has no backward
            rows.append(("reference's gathered embeddings (FSDP2 root)", "vocab x hidden x 2 B", embed * 2))
    if u.teacher:  # rewards/co_rewarding/teacher.py: an average of the trainable tensors, whole on every rank
        count = m.lora_params(u.lora_rank) if u.lora_rank else params
        rows.append(("EMA teacher (fp32, whole on each rank)", f"{count / 1e6:.0f}M x 4 B", count * 4))
    return [r for r in rows if r[2]]


def layer_bytes(m: Shape, compiled: bool = False, wide: bool = False) -> int:
    """Bytes per token a decoder layer saves for its backward when not checkpointed, bf16 autocast, packed varlen
    attention (counted on a CPU: ``tests/test_gpu_budget.py``); ``wide``: an fp32 residual stream (fp32 weights in one
    process); ``compiled``: the compiled block's partition (at Qwen3-1.7B's and 4B's shapes; the fused [qkv] and
    [gate, up] weights it also keeps are counted apart)."""
    h, i, q, kv = m.hidden, m.intermediate, m.heads * m.head_dim, m.kv_heads * m.head_dim
    return (8 * h + 6 * q + 6 * kv + 6 * i if compiled else 16 * h + 10 * q + 10 * kv + 8 * i) + 10 * h * wide


def moments(m: Shape, u: Update) -> dict[str, list[Row]]:
    """Each moment of the update's backward with what is resident then besides :func:`states` (bytes)."""
    H, I, V, L, n = m.hidden, m.intermediate, m.vocab, m.layers, u.gpus
    q, kv, embed = m.heads * m.head_dim, m.kv_heads * m.head_dim, m.vocab * m.hidden
    outside = embed * (1 if m.tied else 2)  # embeddings (and an untied head) outside the decoder blocks
    block = (m.params - outside) / L
    single, lora = u.strategy == "single", u.lora_rank > 0
    wide = single and not lora  # one process trains fp32 weights: an fp32 residual stream under autocast
    per, kept_in = layer_bytes(m, u.compiled, wide), (4 if wide else 2) * H  # a kept layer; a checkpointed one
    fused = 2 * H * (q + 2 * kv + 2 * I) if u.compiled else 0
    k = checkpointed_layers(L, u.every)
    gathered = {"held": ("all-gathered bf16 params (held through the pass)", "params x 2 B", 2 * m.params),
                "fsdp": ("all-gathered bf16 params (the root + 2 blocks)", "(embeddings + 2 x block) x 2 B",
                         2 * outside + 4 * block),
                "single": ("autocast's bf16 copies of the linear weights", "(params - embeddings) x 2 B",
                           0 if lora else 2 * (m.params - outside))}[u.strategy]
    grads = (None if lora else ("gradients (fp32, sharded after every pass)", f"params / {n} x 4 B", 4 * m.params / n)
             if u.reduce_every_pass else ("gradients (fp32, unsharded until the mini-batch's last pass)",
                                          "params x 4 B", 4 * m.params))
    head_grad = (None if lora else ("LM head's gradient (fp32)", "vocab x hidden x 4 B", 4 * embed) if single else
                 ("LM head's gradient (bf16, on the root)", "vocab x hidden x 2 B", 2 * embed))
    x = 4 if u.compiled else 10  # the fused head's fp32 chunk buffers, bytes per chunk position x vocab
    if u.logits:
        head = [("logits + their gradient (bf16) + fp32 chunk",
                 f"2 x {u.logits} x vocab x 2 B + 3 x {u.chunk} x vocab x 4 B",
                 2 * u.logits * V * 2 + 3 * u.chunk * V * 4)]
    elif lora:  # a frozen head: no weight gradient
        head = [("fused LM head: chunk buffers", f"{x} x {u.chunk} x vocab B", x * u.chunk * V)]
    else:
        head = [("fused LM head: weight-gradient sum (fp32) + chunk buffers",
                 f"vocab x hidden x 4 B + max({x} x {u.chunk} x vocab, 2 x {u.chunk} x vocab + vocab x hidden x 2) B",
                 4 * embed + max(x * u.chunk * V, 2 * u.chunk * V + 2 * embed))]
        if single:  # the fused head's bf16 copy of the tied weight, saved for its backward
            head.append(("fused LM head: bf16 copy of the weight", "vocab x hidden x 2 B", 2 * embed))
    out = {}
    for b, passes in enumerate(u.plan):
        for j, tokens in enumerate(passes):
            name = ((f"mini-batch {b + 1}, " if len(u.plan) > 1 else "")
                    + (f"pass {j + 1} of {len(passes)}, " if len(passes) > 1 else ""))
            held = [r for r in (gathered, grads if j else None) if r and r[2]]
            acts = ("activations kept for the backward",
                    f"{tokens} tokens x ({k} x {kept_in} + {L - k} x {per}) B"
                    + (f" + {L - k} x {fused / 2**20:.0f} MiB fused weights" if fused else ""),
                    tokens * (k * kept_in + (L - k) * (per)) + (L - k) * fused)
            work = ("one block's backward working set", f"{tokens} tokens x {BETA} x intermediate B", tokens * BETA * I)
            recompute = [("the last layer, recomputed", f"{tokens} tokens x {per} B", tokens * per)] if (
                u.every and (L - 1) % u.every == 0) else []
            layer0 = ("layer 0 in its backward", f"{tokens} tokens x ({per} + {BETA} x intermediate"
                      + (f" + {kept_in}) B" if u.every else ") B"),
                      tokens * (per + BETA * I + (kept_in if u.every else 0)))
            out[name + "start of the backward"] = [*held, acts, *[r for r in (head_grad,) if r], *recompute, work]
            out[name + "LM head's backward"] = [*held, acts, ("final norm + the head's input",
                                                              f"{tokens} tokens x {10 if wide else 8} x hidden B",
                                                              tokens * (10 if wide else 8) * H), *head]
            if j < len(passes) - 1:  # gradients complete, unsharded until the last pass
                out[name + "end"] = [r for r in (gathered, grads, layer0) if r and r[2]]
            elif lora:
                out[name + "end"] = [r for r in (gathered if u.strategy == "fsdp" else None, layer0) if r and r[2]]
            elif single:
                out[name + "end"] = [gathered, ("gradients (fp32), all but layer 0's", "(params - block) x 4 B",
                                                4 * (m.params - block)), layer0]
            else:  # each block's gradient reduce-scattered, its gathered copy freed, as its backward ends
                out[name + "end"] = [("gradients (fp32, blocks sharded as each finishes)",
                                      f"(params - embeddings) / {n} x 4 B", 4 * (m.params - outside) / n),
                                     ("the root's gathered copy + the head's bf16 gradient",
                                      "(embeddings + vocab x hidden) x 2 B", 2 * (outside + embed)),
                                     ("layer 0's gathered copy", "block x 2 B", 2 * block), layer0]
    return out


def update_peak(m: Shape, u: Update) -> tuple[str, list[Row]]:
    """The update's largest moment and its rows besides the states (bytes, without the margin)."""
    return max(moments(m, u).items(), key=lambda item: sum(r[2] for r in item[1]))


def update_gib(m: Shape, u: Update) -> float:
    """The update's estimated peak per GPU without the engine and the embedder: states + largest moment, x MARGIN."""
    return MARGIN * sum(r[2] for r in states(m, u) + update_peak(m, u)[1]) / GIB


def fitting_every(m: Shape, u: Update, gpu_gib: float, other_gib: float = 0.0) -> int | None:
    """The ``model.gradient_checkpointing`` whose update fits ``gpu_gib`` beside ``other_gib`` with the fewest layers
    checkpointed (0: none needed; of equal counts the smallest n, spreading them evenly); ``None``: not even every
    layer's checkpointing fits."""
    candidates = [0, *sorted(range(1, m.layers + 1), key=lambda n: (checkpointed_layers(m.layers, n), n))]
    return next((n for n in candidates if update_gib(m, replace(u, every=n)) + other_gib <= gpu_gib), None)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.commands.gpu_budget",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a Hugging Face config.json (default: --shape)")
    parser.add_argument("--shape", choices=("4b", "1.7b", "8b"), default="4b", help="Qwen3-4B, 1.7B or 8B-Base's")
    parser.add_argument("--lora-rank", type=int, default=0, help="a LoRA run's adapter rank (0: full fine-tuning)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-gib", type=float, default=80.0)
    parser.add_argument("--strategy", choices=("fsdp", "auto"), default="fsdp",
                        help="fsdp: evolrl.distributed.ModelParallelStrategy (FSDP2); auto: one process (--gpus 1)")
    parser.add_argument("--vllm-fraction", type=float, default=0.4, help="the engine's gpu_memory_utilization")
    parser.add_argument("--samples", type=int, default=64, help="vote samples per rank per step (P x V)")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new", type=int, default=12288)
    parser.add_argument("--max-tokens", type=int, default=32768, help="max_tokens_per_micro_batch (packed)")
    parser.add_argument("--single-pass", action="store_true",
                        help="every mini-batch fits one pass (default: two full passes, gradients held between)")
    parser.add_argument("--micro", type=int, help="instead: micro_batch_size, sequences padded to full length")
    parser.add_argument("--embed-batch", type=int, default=8)
    parser.add_argument("--no-vllm", action="store_true", help="the trainer alone (HFEngine, or vLLM asleep)")
    parser.add_argument("--no-embedder", action="store_true", help="a reward without the embedding model (TTRL)")
    parser.add_argument("--sgd", action="store_true", help="an optimizer without state (no AdamW moments)")
    parser.add_argument("--compile", action="store_true", help="model.batching.compile_blocks: true")
    parser.add_argument("--chunk", type=int, default=1024, help="the fused head's tokens per chunk in training")
    parser.add_argument("--reduce-every-pass", action="store_true",
                        help="model.batching.reduce_every_pass: gradients reduce-scattered after every pass")
    parser.add_argument("--reshard-after-forward", action="store_true",
                        help="model.batching.reshard_after_forward: true (one GPU: each block's gathered copy freed "
                        "after its forward)")
    parser.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                        help="model.gradient_checkpointing: every N-th layer checkpointed (1: every layer, the paper "
                        "configs; 0: none)")
    parser.add_argument("--teacher", action="store_true", help="Co-rewarding II's EMA teacher (CoRewardingReward)")
    parser.add_argument("--sleep", action="store_true", help="judge the fit with sleep level 2 (the paper configs)")
    parser.add_argument("--sleep-residual-gib", type=float, default=1.0,
                        help="what a sleeping engine keeps on the GPU (CUDA context, buffers; an assumption)")
    args = parser.parse_args()
    if args.strategy == "auto" and args.gpus != 1:
        parser.error(f"--strategy auto with --gpus {args.gpus}: one process trains on one GPU; pass --gpus 1")
    shape = from_config(args.config or QWEN3_COMMON | QWEN3[f"qwen3-{args.shape}"])
    tokens = args.prompt + args.new
    passes = (args.micro * tokens,) if args.micro else (args.max_tokens,)
    strategy = ("single" if args.strategy == "auto" else
                "held" if args.gpus == 1 and not args.reshard_after_forward else "fsdp")
    u = Update(args.gpus, strategy, plan=(passes if args.single_pass else passes * 2,), every=args.checkpoint_every,
               compiled=args.compile, chunk=args.chunk, adamw=not args.sgd, lora_rank=args.lora_rank,
               teacher=args.teacher, reduce_every_pass=args.reduce_every_pass,
               logits=args.micro * args.new if args.micro else 0)
    vllm = 0.0 if args.no_vllm else args.vllm_fraction * args.gpu_gib * GIB
    embedder = 0.0 if args.no_embedder else shape.params * 2
    embed_act = 0.0 if args.no_embedder else args.embed_batch * tokens * (3 * shape.intermediate + 2 * shape.hidden) * 2
    rows = [("vLLM (weights + KV cache + buffers)", f"gpu_memory_utilization {args.vllm_fraction} x {args.gpu_gib:g} "
             "GiB", vllm, vllm),
            ("embedder weights (bf16, the policy's shape)", "params x 2 B", embedder, embedder),
            ("embedder activations (reward only)", f"{args.embed_batch} texts x {tokens} tokens x (3 x intermediate "
             "+ 2 x hidden) x 2 B", embed_act, 0.0),
            *((name, formula, b, b) for name, formula, b in states(shape, u))]
    moment, peak = update_peak(shape, u)
    rows += [(name, formula, 0.0, b) for name, formula, b in peak]
    own = sum(r[3] for r in rows[3:])
    rows.append((f"margin ({MARGIN - 1:.0%}, conservative)", "3% of the trainer's rows above", 0.0, (MARGIN - 1) * own))
    print("| component (estimated) | formula | sampling + reward, GiB | update, GiB |")
    print("|---|---|---|---|")
    for name, formula, sampling, update in rows:
        if sampling or update:
            print(f"| {name} | {formula} | {sampling / GIB:.1f} | {update / GIB:.1f} |")
    sampling_total, update_total = sum(r[2] for r in rows) / GIB, sum(r[3] for r in rows) / GIB
    print(f"| **peak, no sleep mode** | sum | {sampling_total:.1f} | {update_total:.1f} |")
    if not args.no_vllm:
        slept = update_total - vllm / GIB + args.sleep_residual_gib
        print(f"| **update with sleep level 2** | vLLM keeps ~{args.sleep_residual_gib:g} GiB (assumed) | - | "
              f"{slept:.1f} |")
        update_total = slept if args.sleep else update_total
    kept, groups = sum(r[2] for r in states(shape, u)), {}
    for name, part in moments(shape, u).items():
        where, _, what = name.rpartition(", ")
        groups.setdefault(where, []).append(f"{what} {MARGIN * (kept + sum(r[2] for r in part)) / GIB:.1f}")
    print(f"\nThe update peaks at: {moment}. Its moments with the states and the margin, GiB: "
          + "; ".join(f"{where}: " * bool(where) + ", ".join(parts) for where, parts in groups.items()) + ".")
    if update_total > args.gpu_gib:
        print(f"\nThe update's estimated peak ({update_total:.1f} GiB) exceeds the {args.gpu_gib:g} GiB GPU: it does "
              "not fit (more GPUs, sleep mode or a smaller token budget lower it).")
    print_checkpointing_fit(shape, u, args.gpu_gib, other_gib=update_total - update_gib(shape, u))
    if args.no_vllm:
        return
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    held = (vllm - shape.params * 2) / kv_per_token / 1e3
    print(f"\nKV cache: about {held:.0f}k tokens fit of the {args.samples * tokens / 1e3:.0f}k that all samples at full "
          f"length would need ({kv_per_token / 1024:.0f} KiB per token; {args.samples} x {tokens} wanted); vLLM "
          "queues the rest.")


def print_checkpointing_fit(m: Shape, u: Update, gpu_gib: float, other_gib: float) -> None:
    """The line naming the ``model.gradient_checkpointing`` that fits (:func:`fitting_every`)."""
    every = fitting_every(m, u, gpu_gib, other_gib)
    head = f"\nGradient checkpointing that fits the {gpu_gib:g} GiB GPU:"
    if every is None:
        need = other_gib + update_gib(m, replace(u, every=1))
        print(f"{head} none; with every layer checkpointed the update needs {need:.1f} GiB.")
        return
    chosen = ("false (no layer checkpointed)" if every == 0 else
              f"{every} ({every_nth(every)}: {checkpointed_layers(m.layers, every)} of {m.layers} checkpointed)")
    print(f"{head} model.gradient_checkpointing: {chosen}; update {other_gib + update_gib(m, replace(u, every=every)):.1f} GiB.")


if __name__ == "__main__":
    main()
