"""Estimated per-GPU memory of a paper run, component by component, with and without vLLM's sleep mode.

    python -m tools.commands.gpu_budget                      # Qwen3-4B-Base, configs/paper (8 x 80 GB)
    python -m tools.commands.gpu_budget --config path/to/config.json --gpus 8 --gpu-gib 80
    python -m tools.commands.gpu_budget --gpus 1 --no-vllm --no-embedder --sgd   # the trainer alone (one H100)
    python -m tools.commands.gpu_budget --gpus 1 --lora-rank 32 --sleep --shape 8b   # configs/paper/lora.yaml
    python -m tools.commands.gpu_budget --gpus 1 --no-vllm --checkpoint-every 3   # model.gradient_checkpointing: 3
    python -m tools.commands.gpu_budget --gpus 1 --shape 1.7b --teacher   # Co-rewarding II's EMA teacher, counted

Every figure is an *estimate* from the model's shape and the run's settings (formulas below, next to
each line). One line is fitted to GPU measurements instead: on one H100 80 GB the update's peak exceeded the
itemized sum by about a bf16 copy of the weights (3.2 GiB at a 1.7B shape, 8.7 at Qwen3-4B's; not yet traced to
a component), so ``not itemized`` adds params x 2 B, not divided by the GPU count (whether it shards is not known).
docs/gpu.md prints this table and those measurements. The defaults are the paper
configs: P = 1 prompt per rank, V = 64 samples of up to 1,024 + 12,288 tokens, packed micro-batches of at
most 32,768 tokens (``max_tokens_per_micro_batch``), the LM head fused into the log-prob step (``--micro N``
instead: the update before both, N right-padded sequences of full length per pass and the model's logits),
gradient checkpointing, bf16 compute with fp32 master weights sharded by FSDP2 (bf16
all-gathers), the frozen reference's linear weights in bf16 (its embeddings fp32), Qwen3-Embedding-4B in bf16 embedding 8 texts at a time.

``--lora-rank R`` estimates a LoRA run (``model.lora``): the base frozen in bf16 (no fp32 master copy, no
gradient, no optimizer state, no separate reference: the reference is the base with the adapters off), float32
adapters of rank R on every linear layer of attention and the MLP with their gradients and AdamW moments, and the
fused head without its weight gradient (the head is frozen).

Below the table, the line ``gradient checkpointing that fits`` names the n of ``model.gradient_checkpointing: n``
(every n-th decoder layer checkpointed) that leaves the update within ``--gpu-gib`` with the most layers keeping their
activations (the least recomputation), from the same activation estimate (:func:`activations_gib`), judged as the
table's peak is, without a margin (a lower ``--gpu-gib`` keeps one).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

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
    cfg = path_or_fields
    if isinstance(cfg, str):
        with open(cfg) as file:
            cfg = json.load(file)
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    inter = cfg["intermediate_size"]
    vocab = cfg["vocab_size"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    attention = hidden * head_dim * (heads * 2 + kv * 2)  # q, o, k, v
    params = layers * (attention + 3 * hidden * inter) + vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return Shape(params, hidden, layers=layers, kv_heads=kv, head_dim=head_dim, intermediate=inter, vocab=vocab,
                 heads=heads)


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


def activations_gib(m: Shape, tokens: int, every: int = 1) -> float:
    """A training pass's activations over ``tokens`` tokens (bf16) with every ``every``-th layer checkpointed (0: none).
    A checkpointed layer keeps its input, tokens x hidden x 2 B, and while the backward recomputes one block at a time
    that block's full activations exist too; a layer not checkpointed keeps its full activations from the forward to
    the backward. A block's full activations: tokens x (3 x intermediate + 6 x hidden) x 2 B."""
    kept = checkpointed_layers(m.layers, every)
    block = tokens * (3 * m.intermediate + 6 * m.hidden) * 2
    return (tokens * m.hidden * 2 * kept + block * (m.layers - kept + (1 if kept else 0))) / GIB


def activation_row(m: Shape, tokens: int, pass_text: str, every: int) -> tuple[str, str, float, float]:
    """The budget's activation row for ``model.gradient_checkpointing: every`` (1: every layer, the paper configs)."""
    kept, block = checkpointed_layers(m.layers, every), "(3 x intermediate + 6 x hidden)"
    if every == 1:
        name, formula = "activations (checkpointed)", f"{pass_text} tokens x hidden x layers x 2 B + one block recomputed"
    elif every == 0:
        name, formula = "activations (not checkpointed)", f"{pass_text} tokens x {block} x layers x 2 B"
    else:
        name = f"activations ({every_nth(every)} checkpointed: {kept} of {m.layers})"
        formula = f"{pass_text} tokens x (hidden x {kept} + {block} x ({m.layers} - {kept} + 1)) x 2 B"
    return name, formula, 0.0, activations_gib(m, tokens, every)


def fitting_every(m: Shape, tokens: int, without_activations: float, gpu_gib: float) -> int | None:
    """The ``model.gradient_checkpointing`` whose update fits ``gpu_gib`` with the fewest layers checkpointed (0: none
    needed; the smallest n of that count, so the checkpointed layers are spread evenly); ``None``: not even every
    layer's checkpointing fits."""
    candidates = [0, *sorted(range(1, m.layers + 1), key=lambda n: (checkpointed_layers(m.layers, n), n))]
    return next((n for n in candidates if without_activations + activations_gib(m, tokens, n) <= gpu_gib), None)


def budget(m: Shape, gpus: int, gpu_gib: float, vllm_fraction: float, samples: int, prompt: int, new: int,
           micro: int | None, max_tokens: int, embed_batch: int,
           chunk: int = 1024, adamw: bool = True,
           reduce_every_pass: bool = False, lora_rank: int = 0,
           checkpoint_every: int = 1, reshard: bool = False, teacher: bool = False
           ) -> list[tuple[str, str, float, float]]:
    """``(component, formula, GiB while sampling, GiB during the update)`` rows, without sleep mode;
    ``checkpoint_every`` is ``model.gradient_checkpointing`` (every n-th layer; 0: none), ``reshard``
    ``model.batching.reshard_after_forward: true`` (one GPU); ``teacher``: Co-rewarding II's EMA teacher, an
    average of the trainable tensors held whole on every rank (``evolrl/teacher.py``; such runs do not shard)."""
    tokens = prompt + new
    shard = m.params / gpus
    block = (m.params - m.vocab * m.hidden) / m.layers
    vllm = vllm_fraction * gpu_gib
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * 2
    mb_tokens = micro * tokens if micro else max_tokens
    pass_text = f"{micro} x {tokens}" if micro else f"{max_tokens}"
    rows = [
        ("vLLM (weights + KV cache + buffers)", f"gpu_memory_utilization {vllm_fraction} x {gpu_gib:g} GiB",
         vllm, vllm),
        ("embedder weights (bf16)", "params x 2 B", m.params * 2 / GIB, m.params * 2 / GIB),
        ("embedder activations (reward only)", f"{embed_batch} texts x {tokens} tokens x (3 x intermediate + 2 x hidden) x 2 B",
         0.0, 0.0),
        ("policy master shard (fp32)", f"params / {gpus} x 4 B", shard * 4 / GIB, shard * 4 / GIB),
        # FSDP2 reduce-scatters once per mini-batch (update.py): until its last pass each rank accumulates the
        # whole model's gradients unsharded, in fp32 (the reduce dtype); one GPU holds them whole anyway. With
        # Batching.reduce_every_pass each pass reduce-scatters them: a shard stays.
        ("gradients (fp32, sharded after every pass)", f"params / {gpus} x 4 B", 0.0, shard * 4 / GIB)
        if reduce_every_pass else
        ("gradients (fp32, unsharded until a mini-batch's last pass)", "params x 4 B", 0.0, m.params * 4 / GIB),
        ("AdamW moments (fp32)", f"2 x params / {gpus} x 4 B", shard * 8 * adamw / GIB, shard * 8 * adamw / GIB),
        # Under autocast the reference keeps its embeddings (and norms) as loaded, fp32 (build.parameters_in).
        ("reference shard (bf16 linear, fp32 embeddings)", f"(params + vocab x hidden) / {gpus} x 2 B",
         (shard + m.vocab * m.hidden / gpus) * 2 / GIB, (shard + m.vocab * m.hidden / gpus) * 2 / GIB),
        # On one GPU the update holds every block's gathered copy through a pass (Batching.reshard_after_forward).
        ("all-gathered bf16 params (one GPU: all held through a pass)", "params x 2 B", 0.0, m.params * 2 / GIB)
        if gpus == 1 and not reshard else
        ("all-gathered bf16 params", "embeddings + 2 blocks in flight, x 2 B", 0.0,
         (m.vocab * m.hidden + 2 * block) * 2 / GIB),
        activation_row(m, mb_tokens, pass_text, checkpoint_every),
    ]
    if lora_rank:  # the trainer's weights, gradients and optimizer state: a frozen bf16 base and fp32 adapters
        lora = m.lora_params(lora_rank)
        rows[3:7] = [
            ("frozen base shard (bf16)", f"params / {gpus} x 2 B", shard * 2 / GIB, shard * 2 / GIB),
            (f"adapters, rank {lora_rank} (fp32)", f"{lora / 1e6:.0f}M x 4 B", lora * 4 / GIB, lora * 4 / GIB),
            ("adapter gradients (fp32)", f"{lora / 1e6:.0f}M x 4 B", 0.0, lora * 4 / GIB),
            ("AdamW moments (fp32)", f"2 x {lora / 1e6:.0f}M x 4 B", lora * 8 * adamw / GIB, lora * 8 * adamw / GIB),
        ]
    if teacher:
        count, what = (m.lora_params(lora_rank), f"{m.lora_params(lora_rank) / 1e6:.0f}M adapters") if lora_rank else (
            m.params, "params")
        rows.append(("EMA teacher (fp32, whole on each rank)", f"{what} x 4 B", count * 4 / GIB, count * 4 / GIB))
    rows.append(("not itemized (fitted to H100 measurements)", "params x 2 B", 0.0, m.params * 2 / GIB))
    if micro:  # the model's logits, [micro, new, vocab], and their gradient
        rows.append(("logits + their gradient (bf16) + fp32 chunk",
                     f"2 x {micro} x {new} x vocab x 2 B + 3 x {chunk} x vocab x 4 B",
                     0.0, (2 * micro * new * m.vocab * 2 + 3 * chunk * m.vocab * 4) / GIB))
    elif lora_rank:  # chunked_head.py: a frozen head has no weight gradient, only a chunk's fp32 buffers
        rows.append(("fused LM head: chunk buffers", f"4 x {chunk} x vocab x 4 B", 0.0, 4 * chunk * m.vocab * 4 / GIB))
    else:  # chunked_head.py: a chunk's fp32 buffers, the fp32 weight-gradient sum and one bf16 [V, H] product
        formula = f"4 x {chunk} x vocab x 4 B + vocab x hidden x (4 + 2) B"
        rows.append(("fused LM head: chunk + weight-gradient buffers", formula, 0.0, (4 * chunk * m.vocab * 4 + m.vocab * m.hidden * 6) / GIB))
        rows.append(("packed row's attention mask (sdpa; none with flash-attention)", f"{max_tokens}^2 x 1 B", 0.0,
                     max_tokens**2 / GIB))
    embed_act = embed_batch * tokens * (3 * m.intermediate + 2 * m.hidden) * 2 / GIB
    rows[2] = (rows[2][0], rows[2][1], embed_act, 0.0)
    kv_tokens = (vllm * GIB - m.params * 2) / kv_per_token
    rows.append(("(vLLM KV cache holds)", f"{kv_per_token / 1024:.0f} KiB per token; {samples} x {tokens} wanted",
                 kv_tokens / 1e3, samples * tokens / 1e3))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.commands.gpu_budget",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a Hugging Face config.json (default: --shape)")
    parser.add_argument("--shape", choices=("4b", "1.7b", "8b"), default="4b", help="Qwen3-4B, 1.7B or 8B-Base's")
    parser.add_argument("--lora-rank", type=int, default=0, help="a LoRA run's adapter rank (0: full fine-tuning)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-gib", type=float, default=80.0)
    parser.add_argument("--vllm-fraction", type=float, default=0.4, help="the engine's gpu_memory_utilization")
    parser.add_argument("--samples", type=int, default=64, help="vote samples per rank per step (P x V)")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new", type=int, default=12288)
    parser.add_argument("--max-tokens", type=int, default=32768, help="max_tokens_per_micro_batch (packed)")
    parser.add_argument("--micro", type=int, help="instead: micro_batch_size, sequences padded to full length")
    parser.add_argument("--embed-batch", type=int, default=8)
    parser.add_argument("--no-vllm", action="store_true", help="the trainer alone (HFEngine, or vLLM asleep)")
    parser.add_argument("--no-embedder", action="store_true", help="a reward without the embedding model (TTRL)")
    parser.add_argument("--sgd", action="store_true", help="an optimizer without state (no AdamW moments)")
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
    shape = from_config(args.config or QWEN3_COMMON | QWEN3[f"qwen3-{args.shape}"])
    rows = budget(shape, args.gpus, gpu_gib=args.gpu_gib, vllm_fraction=args.vllm_fraction, samples=args.samples,
                  prompt=args.prompt, new=args.new, micro=args.micro, max_tokens=args.max_tokens,
                  embed_batch=args.embed_batch, adamw=not args.sgd,
                  reduce_every_pass=args.reduce_every_pass, lora_rank=args.lora_rank,
                  checkpoint_every=args.checkpoint_every, reshard=args.reshard_after_forward, teacher=args.teacher)
    dropped = {0} if args.no_vllm else set()
    dropped |= {1, 2} if args.no_embedder else set()
    rows = [(name, formula, 0.0, 0.0) if i in dropped else (name, formula, a, b)
            for i, (name, formula, a, b) in enumerate(rows)]
    print("| component (estimated) | formula | sampling + reward, GiB | update, GiB |")
    print("|---|---|---|---|")
    for name, formula, sampling, update in rows[:-1]:
        print(f"| {name} | {formula} | {sampling:.1f} | {update:.1f} |")
    sampling_total = sum(r[2] for r in rows[:-1])
    update_total = sum(r[3] for r in rows[:-1])
    print(f"| **peak, no sleep mode** | sum | {sampling_total:.1f} | {update_total:.1f} |")
    if not args.no_vllm:
        slept = update_total - rows[0][3] + args.sleep_residual_gib
        print(f"| **update with sleep level 2** | vLLM keeps ~{args.sleep_residual_gib:g} GiB (assumed) | - | "
              f"{slept:.1f} |")
        update_total = slept if args.sleep else update_total
    if update_total > args.gpu_gib:
        print(f"\nThe update's estimated peak ({update_total:.1f} GiB) exceeds the {args.gpu_gib:g} GiB GPU: it does "
              "not fit (more GPUs, sleep mode or a smaller token budget lower it).")
    print_checkpointing_fit(shape, args.micro * (args.prompt + args.new) if args.micro else args.max_tokens,
                            update_total - next(r[3] for r in rows if r[0].startswith("activations")), args.gpu_gib)
    if args.no_vllm:
        return
    name, formula, held, wanted = rows[-1]
    print(f"\nKV cache: about {held:.0f}k tokens fit of the {wanted:.0f}k that all samples at full length would "
          f"need ({formula}); vLLM queues the rest.")


def print_checkpointing_fit(m: Shape, tokens: int, without_activations: float, gpu_gib: float) -> None:
    """The line naming the ``model.gradient_checkpointing`` that fits (:func:`fitting_every`), with its formula."""
    every = fitting_every(m, tokens, without_activations, gpu_gib)
    formula = ("Activations of a pass with every n-th layer checkpointed: tokens x (hidden x k + (3 x intermediate + "
               "6 x hidden) x (layers - k + 1)) x 2 B, k = ceil(layers / n); none: tokens x (3 x intermediate + "
               "6 x hidden) x layers x 2 B.")
    head = f"\nGradient checkpointing that fits the {gpu_gib:g} GiB GPU:"
    if every is None:
        need = without_activations + activations_gib(m, tokens, 1)
        print(f"{head} none; with every layer checkpointed the update needs {need:.1f} GiB. {formula}")
        return
    chosen = ("false (no layer checkpointed)" if every == 0 else
              f"{every} ({every_nth(every)}: {checkpointed_layers(m.layers, every)} of {m.layers} checkpointed)")
    print(f"{head} model.gradient_checkpointing: {chosen}; activations {activations_gib(m, tokens, every):.1f} GiB, "
          f"update {without_activations + activations_gib(m, tokens, every):.1f} GiB. {formula}")


if __name__ == "__main__":
    main()
