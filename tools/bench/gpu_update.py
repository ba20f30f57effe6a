"""The update's speed and numerics on one GPU, as one prepared script: offline, random-weight models built here from
configs, each section in its own process under its own timeout, the report appended to as each section ends.

    python -m tools.bench.gpu_update --out gpu-update                # one GPU: the default sections, 650 s of timeouts
    python -m tools.bench.gpu_update --out gpu-update --sections 2-6  # the earlier ones (the 1.7B update's targets)
    python -m tools.bench.gpu_update --out cpu-update --cpu           # CPU mode, tiny sizes: ~1 min on 2 cores

Sections, in the order they run, are listed below the options with their GPU timeouts (``*``: run without
``--sections``, the figures still wanted; ``BENCH`` holds each bench section's ``bench_update`` flags). Where one
command may run 600 s at most, pass ``--deadline`` or run two commands with the same ``--out``.

Reading ``DIR/report.md`` (a line per invocation, then each section's ``ok``, ``FAILED``, ``TIMED OUT`` or
``skipped``, with why) and ``DIR/work/``'s logs: docs/gpu.md. Exit status 1 when a section failed or timed out.

``--cpu`` (automatic without CUDA): the same sections at CPU sizes: the bench sections with ``--quick --paths packed``
on ``gpu_check``'s small CPU update shape (no profile), FSDP2 over a one-process gloo mesh. For tests,
``EVOLRL_GPU_UPDATE_FAIL=NAME[,NAME]`` makes those sections raise at their start.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import inspect
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from tools.bench import bench_update
from tools.bench.bench_update import HEAD, make_sequences, responses
from tools.commands.gpu_budget import QWEN3, QWEN3_COMMON
from tools.commands.gpu_check import check, env, runs
from tools.common import ROOT, commit, failure_report, pass_on_sigterm

FAIL = "EVOLRL_GPU_UPDATE_FAIL"
LEAST = 20
"""Under ``--deadline``, the fewest seconds a section is started with."""


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    gpu_timeout: float
    cpu_timeout: float
    default: bool = False
    """Run without ``--sections``: the sections whose GPU figures are still wanted (issue order), within 660 s."""
    cpu_skip: str = ""
    """Why CPU mode skips it (unless named in ``--sections``, where it can run on a CPU at all)."""


SECTIONS = (
    Section("versions", "versions, and torch's varlen attention op against the per-sequence path", 30, 60,
            default=True),
    Section("paper", "bench_update --paper --paths packed: the Qwen3-1.7B shape, uncompiled", 120, 120),
    Section("4b-sgd", "bench_update --paper --paths packed: the Qwen3-4B shape, SGD", 130, 120),
    Section("lr0", "an update at learning rate 0: mini-batch 2's ratio and the clip fractions", 75, 90),
    Section("kl", "KL at identical weights: single process and FSDP2", 50, 90),
    Section("paper-compiled", "bench_update --paper --paths packed --compile: the Qwen3-1.7B shape, compiled, "
            "the checkpointing that fits the card", 240, 300,
            cpu_skip="compiling the small model's C++ kernels takes ~3 minutes on 2 cores; name it to run it"),
    Section("4b-budget", "bench_update --paper --compile: the Qwen3-4B shape with SGD, passes of at most 16,384 "
            "tokens, the checkpointing that fits the card", 190, 120, default=True),
    Section("4b-adamw", "bench_update --paper --compile: the Qwen3-4B shape with the trainer's fused AdamW (fp32 "
            "master weights and moments), the checkpointing that fits the card", 130, 120, default=True),
    Section("embedder", "the novelty embedder over 64 responses of 2k, 8k and 12k tokens: Qwen3-Embedding-4B's and "
            "0.6B's shapes", 80, 120, default=True),
    Section("gather", "the Qwen3-4B policy's full weights gathered from FSDP2 as a push does, without vLLM", 50, 90,
            default=True),
    Section("flex", "bench_update --paper --compile --flex: FlexAttention under FSDP2, compiled", 170, 60, default=True,
            cpu_skip="FlexAttention runs on CUDA only (bench_update refuses --flex on a CPU)"),
)
BY_NAME = {s.name: s for s in SECTIONS}


# ----------------------------------------------------------------------------------------------------------------
# The child: one section in this process, its result as JSON in DIR/work/NAME.json


@dataclass
class Context:
    gpu: bool
    work: Path

    @property
    def device(self):
        return torch.device("cuda" if self.gpu else "cpu")

    @property
    def size(self) -> dict:
        return env.sizes(self.gpu, quick=False)

    def model(self, name: str, size: dict, **kwargs) -> Path:
        """A random-weight Qwen3-shaped model of ``size["shape"]`` and ``size["vocab"]`` in ``work/models/NAME``
        (``gpu_check``'s ``runs.random_qwen3``), drawn on the device, built once."""
        return runs.random_qwen3(self.work / "models" / name, size["shape"], vocab=size["vocab"],
                                 device=self.device.type, **kwargs)


def table(head: list[str], rows: list) -> list[str]:
    return ["", *check.table(head, rows), ""]


def versions(ctx: Context) -> tuple[bool, list[str], dict]:
    rows = [("python", platform.python_version()), ("torch", f"{torch.__version__} (CUDA {torch.version.cuda})"),
            ("device", env.device_line() if ctx.gpu else env.cpu_line()),
            *((name, env.version(name) or "missing") for name in ("transformers", "lightning", "triton")),
            ("evolrl", "commit " + commit())]
    figures = {name: value for name, value in rows}
    lines = table(["package", "version"], rows)
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as error:
        figures["varlen_attn"] = None
        return True, [*lines, f"`torch.nn.attention.varlen.varlen_attn`: missing in this torch ({error})"], figures

    figures["varlen_attn"] = str(inspect.signature(varlen_attn))
    return True, [*lines, f"`torch.nn.attention.varlen.varlen_attn` exists: `varlen_attn{figures['varlen_attn']}`"
                  " (its kernels against the per-sequence path: `pytest -m gpu tests/test_varlen.py`)"], figures


BENCH = {"paper": ["--paper", "--paths", "packed", "--repeats", "2", "--profile", "10"],
         "4b-sgd": ["--paper", "--paths", "packed", "--models", "qwen3-4b", "--optimizer", "sgd", "--repeats", "2"],
         "paper-compiled": ["--paper", "--paths", "packed", "--compile", "--repeats", "1", "--profile", "10",
                            "--checkpoint-every", "auto", "--chunk", "2048"],
         "4b-budget": ["--paper", "--paths", "packed", "--models", "qwen3-4b", "--optimizer", "sgd", "--compile",
                       "--repeats", "1", "--budget", "16384", "--checkpoint-every", "auto", "--chunk", "2048"],
         "4b-adamw": ["--paper", "--paths", "packed", "--models", "qwen3-4b", "--compile", "--repeats", "1",
                      "--checkpoint-every", "auto", "--chunk", "2048"],
         "flex": ["--paper", "--paths", "packed", "--compile", "--flex", "--repeats", "1", "--checkpoint-every",
                  "auto", "--chunk", "2048"]}
"""Each bench section's ``bench_update`` flags on a GPU."""
BENCH_CPU = {"paper": [], "4b-sgd": ["--optimizer", "sgd"], "paper-compiled": ["--compile"],
             "4b-budget": ["--optimizer", "sgd", "--budget", "128", "--checkpoint-every", "2"], "4b-adamw": []}
"""On a CPU: ``--quick --paths packed`` on the small model, and these."""
FIGURES = {  # what a bench section reads from bench_update's output
    "busy": r"^GPU busy ([\d.]+) of the update \(([\d.]+) s of kernels\), (\d+) kernel launches, (\d+) kernels$",
    "estimate": r"^heavy, packed: peak ([\d.]+) GiB allocated; tools.commands.gpu_budget estimates ([\d.]+) GiB",
    "compile": r"^heavy, packed: the warm-up update took ([\d.]+) s and traced (\d+) graphs",
    "card": r"^card peak: (.+)$",
    "checkpointing": r"^gradient checkpointing (.+): what tools.commands.gpu_budget fits",
}


def bench(ctx: Context, name: str) -> tuple[bool, list[str], dict]:
    """``python -m tools.bench.bench_update`` with the section's flags, its output echoed (into the section's log, so
    that a timeout leaves its progress there) and read."""
    if ctx.gpu:
        flags = ["--device", "cuda", *BENCH[name]]
    else:
        model = ctx.model("small", ctx.size["update"])
        flags = ["--device", "cpu", "--quick", "--paths", "packed", "--models", str(model),
                 "--peak-size", "256", "--peak-repeats", "2", *BENCH_CPU[name]]
    shown = "python -m tools.bench.bench_update " + shlex.join(flags)
    print(shown, flush=True)
    child = subprocess.Popen([sys.executable, "-m", "tools.bench.bench_update", *flags], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    output = []
    for line in child.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        output.append(line)
    code, text = child.wait(), "".join(output)
    if code:
        return False, [f"`{shown}` exited {code}:", "```", failure_report(text), "```"], {"exit": code}
    figures = read_bench(text)
    if figures is None:
        return False, [f"`{shown}`: no result row in its output", "```", text[-3000:], "```"], {}
    lines = [f"`{shown}`" + ("" if ctx.gpu else " (CPU mode: gpu_check's small CPU shape, not the section's)"),
             *summary_lines(figures, ctx.gpu)]
    return True, [*lines, "", "bench_update's output:", "```", text.strip(), "```"], figures


def read_bench(text: str) -> dict | None:
    """The figures of ``bench_update``'s output (its packed row and ``FIGURES``); None without the row. Also read from
    a section's log after a timeout, where the bench printed its row before the section's time ran out."""
    row = re.search(r"^\| heavy \| packed \| (.+) \|$", text, re.MULTILINE)
    if row is None:
        return None
    figures = {key: number(cell) for key, cell in zip(HEAD[2:], row.group(1).split(" | "))}
    for key, pattern in FIGURES.items():
        found = re.search(pattern, text, re.MULTILINE)
        figures[key] = [number(x) for x in found.groups()] if found else None
    return figures


def summary_lines(figures: dict, gpu: bool) -> list[str]:
    """A bench section's one-row summary (docs/performance.md's columns), and the compile's cost where it was read."""
    busy, estimate = figures["busy"], figures["estimate"]
    peak = (f"{figures['peak MiB (abs)'] / 1024:.1f} GiB allocated" if gpu
            else f"{figures['peak MiB (abs)']:.0f} MiB resident")
    summary = [figures["update s"], figures["tokens/s"], figures["MFU bf16"], busy[0] if busy else "-",
               f"{busy[2]:.0f}" if busy else "-", peak, f"{estimate[1]:.1f} GiB" if estimate else "-"]
    lines = table(["update s", "tokens/s", "MFU (bf16 peak)", "GPU busy", "launches", "peak", "gpu_budget estimate"],
                  [summary])
    if figures["checkpointing"]:
        lines.append(f"gradient checkpointing {figures['checkpointing'][0]}, fitted to the card by gpu_budget")
    if figures["compile"]:
        lines.append(f"compiling: the warm-up update took {figures['compile'][0]} s and traced "
                     f"{figures['compile'][1]} graphs")
    return lines


def number(text: str):
    try:
        return float(text) if re.fullmatch(r"-?[\d.]+(e-?\d+)?", text) else text
    except ValueError:
        return text


def lr0(ctx: Context) -> tuple[bool, list[str], dict]:
    from evolrl.logprobs import Passes
    from evolrl.training import Batching, GRPOLoss, GRPOUpdate, Optimization
    from evolrl.training.build import Dtypes, build_models
    from evolrl.training.optim import build_optimizer, start_schedule

    size = ctx.size["update"]
    run = ({"sequences": 8, "mini_batch": 4, "prompt": 256, "median": 1000, "cap": 4096, "budget": 8192} if ctx.gpu
           else {k: size[k] for k in ("sequences", "mini_batch", "prompt", "median", "cap", "budget")})
    model = ctx.model("update", size)

    class Recorded(GRPOUpdate):
        """Records logp - old_logp over the scored tokens of each training pass given old log-probs (every
        mini-batch after the first)."""
        old = None
        gaps: list

        def train_pass(self, policy, part, temperature, old, *args, **kwargs):
            self.old = old
            try:
                return super().train_pass(policy, part, temperature, old, *args, **kwargs)
            finally:
                self.old = None

        def forward(self, model, seqs, *args, **kwargs):
            out = super().forward(model, seqs, *args, **kwargs)
            if self.old is not None and torch.is_grad_enabled():
                self.gaps.append((out[0].detach().float() - self.old.float())[seqs.response_mask])
            return out

    device = ctx.device
    policy, reference = build_models(str(model), Dtypes.resolve("bf16-mixed", "float32"), with_reference=True,
                                     mesh=bench_update.one_process_mesh(ctx.gpu), device=device,
                                     gradient_checkpointing=True, passes=Passes(packed=True))
    loss = GRPOLoss(kl_coef=0.001, entropy_coef=0.003)
    batching = Batching(mini_batch_size=run["mini_batch"], micro_batch_size=1,
                        max_tokens_per_micro_batch=run["budget"], packed=True)
    update = Recorded(loss, batching, max_grad_norm=1.0)
    update.gaps = []
    optimizer, scheduler = build_optimizer(list(policy.parameters()), Optimization(lr=0.0))
    start_schedule(scheduler, 1000)
    lengths = [run["prompt"] + r for r in responses("heavy", run["sequences"], median=run["median"], sigma=1.0,
                                                     cap=run["cap"], seed=0)]
    seqs = make_sequences(lengths, run["prompt"], vocab=policy.config.vocab_size, seed=1).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        stats = update(policy, reference, seqs, temperature=1.0, optimizer=optimizer, scheduler=scheduler)
    gap = torch.cat(update.gaps) if update.gaps else torch.zeros(0)
    ratio = gap.exp()
    policy_loss = loss.policy_loss
    low, high = getattr(policy_loss, "clip_low", None), getattr(policy_loss, "clip_high", None)
    outside = float(((ratio < 1 - low) | (ratio > 1 + high)).float().mean()) if low is not None and len(ratio) else None
    clips = {k: v for k, v in stats.items() if k.endswith("_frac")}
    figures = {"tokens": len(gap), "max_abs_ratio_minus_1": float((ratio - 1).abs().max()) if len(ratio) else None,
               "mean_ratio": float(ratio.mean()) if len(ratio) else None,
               "mean_abs_logp_gap": float(gap.abs().mean()) if len(gap) else None, "outside_clip_range": outside,
               "clip_fractions": clips, "kl": stats.get("kl"), "skipped_steps": update.skipped_steps,
               "lengths": lengths}
    if not len(gap):
        return False, ["no scored token in mini-batch 2: nothing measured"], figures
    shape = size["shape"]
    lines = [(f"{size['name']} shape ({shape['hidden_size']} x {shape['num_hidden_layers']} layers, random weights), "
              f"FSDP2 over a one-process mesh ({'NCCL' if ctx.gpu else 'gloo'}), bf16 autocast, AdamW at lr 0; "
              f"{run['sequences']} sequences of {run['prompt']} + log-normal(median {run['median']}, cap {run['cap']}) "
              f"tokens ({sum(lengths):,} tokens), mini-batches of {run['mini_batch']}, packed passes of at most "
              f"{run['budget']:,} tokens (the old log-probs' no-grad passes: {batching.no_grad_pass_multiple}x that)"),
             *table(["mini-batch 2's tokens", "max abs(ratio - 1)", "mean ratio", "mean abs(logp - old_logp)",
                     f"outside [1 - {low}, 1 + {high}]"],
                    [(f"{len(gap):,}", f"{figures['max_abs_ratio_minus_1']:.2e}", f"{figures['mean_ratio']:.6f}",
                      f"{figures['mean_abs_logp_gap']:.2e}", f"{outside:.2e}" if outside is not None else "-")]),
             ("the update's clip fractions (means over the 2 mini-batches; mini-batch 1's are 0, its old log-probs its "
              "own): " + ", ".join(f"{k} {v:.2e}" for k, v in clips.items())
              + f"; kl {stats.get('kl', float('nan')):.2e}; non-finite steps skipped: {update.skipped_steps}")]
    return update.skipped_steps == 0, lines, figures


def kl(ctx: Context) -> tuple[bool, list[str], dict]:
    """``gpu_check``'s probe twice: as it builds (one process), then with ``build_models`` given a one-process mesh
    (the probe has no mesh parameter: its ``build_models`` is patched for the call)."""
    from evolrl.training import build

    size = ctx.size["kl"]
    model = ctx.model("kl", size, init=0.1)  # as gpu_check's kl section draws it
    single = check.kl_at_positions(model, size["length"], bands=size["bands"], device=ctx.device)
    mesh, built, build_models = bench_update.one_process_mesh(ctx.gpu), [], build.build_models

    def sharded_build(*args, **kwargs):
        models = build_models(*args, mesh=mesh, device=ctx.device, **kwargs)
        built.extend(type(m).__name__ for m in models)
        return models

    with mock.patch.object(build, "build_models", sharded_build):
        sharded = check.kl_at_positions(model, size["length"], bands=size["bands"], device=ctx.device)
    good = len(built) == 2 and all(name.startswith("FSDP") for name in built)  # the patch took: both sharded
    rows, fsdp = [], f"FSDP2, one-process mesh (policy {built[0]}, reference {built[-1]})" if built else "FSDP2: not built"
    for path, out in (("single process", single), (fsdp, sharded)):
        good &= check.kl_stays_flat(out["bands"])
        rows.append((path, f"{out['k3']:.2e}", *(f"{gap:.2e}" for _, _, gap, _ in out["bands"]), out["rotary"]))
    bands = [f"abs gap {lo:,}-{hi - 1:,}" for lo, hi in size["bands"]]
    shape = size["shape"]
    return good, [(f"one {size['length']:,}-token sequence of random tokens, a {shape['hidden_size']} x "
                   f"{shape['num_hidden_layers']}-layer Qwen3 shape (vocab {size['vocab']:,}, random weights), policy "
                   "and reference from `build_models` (bf16-mixed, reference_dtype bfloat16), at identical weights"),
                  *table(["path", "k3 KL", *bands, "rotary buffers"], rows),
                  (f"(gpu_check's `kl_at_positions`; FAILED when the last band's gap is above {check.KL_RATIO}x "
                   f"the first's and above {check.KL_FLOOR})")], {"single": single, "fsdp2": sharded}


def qwen3_fields(name: str) -> dict:
    """A named Qwen3 shape's config fields without its vocabulary (``random_qwen3`` takes that apart)."""
    return {k: v for k, v in (QWEN3_COMMON | QWEN3[name]).items() if k != "vocab_size"}


def peak_memory(ctx: Context, run) -> tuple[float, float | None]:
    """``(seconds, peak GiB allocated above what was allocated before)`` of ``run()``; no memory figure on a CPU."""
    cuda = torch.cuda if ctx.gpu else None
    if cuda:
        cuda.synchronize()
        cuda.reset_peak_memory_stats()
        before = cuda.memory_allocated()
    start = time.perf_counter()
    run()
    if cuda:
        cuda.synchronize()
    return time.perf_counter() - start, (cuda.max_memory_allocated() - before) / 2**30 if cuda else None


def embedder(ctx: Context) -> tuple[bool, list[str], dict]:
    """``SentenceTransformerEmbedder`` as the novelty reward calls it (one ``embed`` of a step's 64 responses, bf16,
    8 texts a pass) on random-weight Qwen3 encoders: time and the peak above its weights, per response length."""
    from evolrl.rewards import SentenceTransformerEmbedder

    tok, source = runs.tokenizer()
    models = ({"Qwen3-Embedding-4B": qwen3_fields("qwen3-4b"), "Qwen3-Embedding-0.6B": qwen3_fields("qwen3-0.6b")}
              if ctx.gpu else {"small": ctx.size["update"]["shape"]})
    lengths, rows, figures = (2048, 8192, 12288) if ctx.gpu else (64, 256, 512), [], {}
    for name, fields in models.items():  # a causal LM's checkpoint: sentence-transformers reads its decoder
        directory = runs.random_qwen3(ctx.work / "models" / f"embedder-{name}", fields, tok, device=ctx.device.type)
        embed = SentenceTransformerEmbedder(str(directory), device=ctx.device.type, batch_size=8, dtype="bfloat16",
                                            max_seq_length=max(lengths))
        embed.embed(["warm-up"])  # loads the weights: their memory is outside the peak below
        for n in lengths:
            g = torch.Generator().manual_seed(n)
            texts = [tok.decode(torch.randint(len(tok), (n,), generator=g).tolist()) for _ in range(64)]
            seconds, peak = peak_memory(ctx, lambda: embed.embed(texts))
            figures[f"{name} {n}"] = {"seconds": seconds, "peak_gib": peak}
            rows.append((name, f"{n:,}", f"{seconds:.2f}", "-" if peak is None else f"{peak:.1f} GiB"))
        del embed
        if ctx.gpu:
            torch.cuda.empty_cache()
    return True, [(f"64 texts of n random tokens each (tokenizer: {source}; the encoder truncates at n), one `embed` "
                   "call, bf16, batch_size 8"), *table(["encoder shape", "n", "seconds", "peak above the weights"],
                                                       rows)], figures


def gather(ctx: Context) -> tuple[bool, list[str], dict]:
    """The policy's parameters as full bf16 tensors, one at a time, from FSDP2 over a one-process mesh
    (``vllm_weights.full_tensors``, what a push streams into the engine), each dropped as the next comes."""
    from evolrl.rollout.vllm_weights import full_tensors
    from evolrl.training.build import Dtypes, build_models

    size = ({"shape": qwen3_fields("qwen3-4b"), "vocab": 151936, "name": "Qwen3-4B"} if ctx.gpu else ctx.size["update"])
    policy, _ = build_models(str(ctx.model("gather-4b" if ctx.gpu else "update", size)),
                             Dtypes.resolve("bf16-mixed", "float32"), with_reference=False,
                             mesh=bench_update.one_process_mesh(ctx.gpu), device=ctx.device)
    got = {"tensors": 0, "bytes": 0}

    def push() -> None:
        for _, tensor in full_tensors(policy, torch.bfloat16):
            got["tensors"] += 1
            got["bytes"] += tensor.numel() * tensor.element_size()

    seconds, peak = peak_memory(ctx, push)
    figures = {**got, "seconds": seconds, "peak_gib": peak}
    return got["tensors"] > 0, [*table(["shape", "tensors", "bf16 GiB", "seconds", "peak above the shards"], [(
        size["name"], got["tensors"], f"{got['bytes'] / 2**30:.2f}", f"{seconds:.2f}",
        "-" if peak is None else f"{peak:.2f} GiB")])], figures


CHILDREN = {"versions": versions, "lr0": lr0, "kl": kl, "embedder": embedder, "gather": gather, **{name: functools.partial(bench, name=name) for name in BENCH}}


def child(name: str, out: Path, gpu: bool) -> None:
    """Run one section here and write ``work/NAME.json``; then leave at once (a process group's teardown at exit can
    abort a process whose work is done: ``tests/fsdp_ranks.py``)."""
    work = out / "work"
    try:
        if name in os.environ.get(FAIL, "").split(","):
            raise RuntimeError(f"forced by {FAIL}={os.environ[FAIL]}")
        good, lines, figures = CHILDREN[name](Context(gpu, work))
        result = {"status": "ok" if good else "FAILED", "lines": lines, "figures": figures}
    except BaseException as err:  # noqa: BLE001 (SystemExit too: reported, the other sections still run)
        result = {"status": "FAILED", "figures": {},
                  "lines": [f"{type(err).__name__}: {err}", "```", *traceback.format_exc().splitlines()[-15:], "```"]}
    (work / f"{name}.json").write_text(json.dumps(result, default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------------------------------------------
# The parent: each section in a child process under its timeout, the report appended to as each ends


def run_section(number: int, section: Section, out: Path, gpu: bool, timeout: float) -> dict:
    work = out / "work"
    result_file = work / f"{section.name}.json"
    result_file.unlink(missing_ok=True)
    args = ["-m", "tools.bench.gpu_update", "--child", section.name, "--out", str(out), *([] if gpu else ["--cpu"])]
    code, seconds, tail = runs.run(args, work / f"{section.name}.log", timeout=timeout, cwd=ROOT)
    if code == 124:
        result = {"status": "TIMED OUT", "figures": {},
                  "lines": [(f"timed out after {timeout:.3g} s (its timeout; `--timeout {section.name}=S` to change "
                             f"it): killed with everything it started; the last lines of {work / section.name}.log:"),
                            "```", tail, "```"]}
        if section.name in BENCH:  # a bench that printed its row before the time ran out: kept, the status stays
            result |= printed_before_timeout(work / f"{section.name}.log", gpu, result["lines"])
    elif result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        result = {"status": "FAILED", "figures": {},
                  "lines": [(f"the section's process exited {code} without a result; the last lines of "
                             f"{work / section.name}.log:"), "```", tail, "```"]}
    return {"number": number, "name": section.name, "title": section.title, "seconds": round(seconds, 1),
            "timeout": timeout, **result}


def printed_before_timeout(log: Path, gpu: bool, lines: list[str]) -> dict:
    """The figures and summary row a timed-out bench section printed, read from its log; nothing where it printed
    none or its log cannot be read (the timeout's report stands as it is)."""
    try:
        printed = read_bench(log.read_text(errors="replace"))
        return {} if printed is None else {"figures": printed, "lines": [
            *lines, "what it printed before its timeout:", *summary_lines(printed, gpu)]}
    except Exception as error:  # noqa: BLE001 (one unreadable log must not end the run)
        return {"lines": [*lines, f"its log could not be read for figures: {type(error).__name__}: {error}"]}


def markdown(section: dict) -> str:
    return "\n".join([f"## {section['number']}. {section['name']}: {section['status']} ({section['seconds']:.0f} s)",
                      "", section["title"], "", *section["lines"], "", ""])


def chosen_sections(text: str | None) -> list[str]:
    """Names, numbers and ranges (``1-4``), comma-separated, or ``all``; none: the default ones."""
    if not text or text == "all":
        return [s.name for s in SECTIONS if s.default or text]
    names = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if re.fullmatch(r"\d+(-\d+)?", part):
            lo, _, hi = part.partition("-")
            names += [SECTIONS[i - 1].name for i in range(int(lo), int(hi or lo) + 1) if 1 <= i <= len(SECTIONS)]
        else:
            names.append(part)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"--sections: unknown {unknown}; choose from {', '.join(BY_NAME)} or 1-{len(SECTIONS)}")
    return names


def timeouts(given: list[str], gpu: bool) -> dict[str, float]:
    out = {s.name: s.gpu_timeout if gpu else s.cpu_timeout for s in SECTIONS}
    for item in given or []:
        name, _, value = item.rpartition("=")
        if name and name not in BY_NAME:
            raise SystemExit(f"--timeout {item}: no section {name!r}")
        out.update({name: float(value)} if name else dict.fromkeys(out, float(value)))
    return out


def machine(gpu: bool) -> str:
    """The device without a CUDA context in this process (its children need the memory): nvidia-smi's name."""
    if not gpu:
        return f"CPU mode: {env.cpu_line()}"
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        answer = subprocess.run(query, check=False, capture_output=True, text=True, timeout=30).stdout
        return "GPU: " + answer.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "GPU: a CUDA device (nvidia-smi did not answer)"


def main(argv: list[str] | None = None) -> int:
    listed = "\n".join(f"{i}. {x.name} [{x.gpu_timeout:.0f} s]{' *' if x.default else ''}: {x.title}"
                        + (f" (CPU mode skips it: {x.cpu_skip})" if x.cpu_skip else "") for i, x in enumerate(SECTIONS, 1))
    parser = argparse.ArgumentParser(prog="python -m tools.bench.gpu_update", description=__doc__,
                                     epilog="sections:\n" + listed, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="report.md, report.json and work/ (logs, models)")
    parser.add_argument("--cpu", action="store_true", help="CPU mode (automatic without CUDA)")
    parser.add_argument("--sections", help=f"comma-separated names, numbers or ranges (1-{len(SECTIONS)}), or all; "
                        "default: " + ", ".join(s.name for s in SECTIONS if s.default))
    parser.add_argument("--timeout", action="append", metavar="[NAME=]S",
                        help="seconds: every section's timeout, or NAME=S one section's (repeatable)")
    parser.add_argument("--deadline", type=float, metavar="S",
                        help="seconds for the whole run: each section's timeout cut to what is left, and a section "
                             f"with under {LEAST} s left skipped")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one section in this process
    argv = sys.argv[1:] if argv is None else argv
    a = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not a.cpu
    if a.child:
        child(a.child, a.out, gpu)
    names, limits = chosen_sections(a.sections), timeouts(a.timeout, gpu)
    (a.out / "work").mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    header = {"command": "python -m tools.bench.gpu_update " + shlex.join(argv), "machine": machine(gpu),
              "commit": "commit " + commit(), "started": f"{started:%Y-%m-%d %H:%M} UTC", "sections": []}
    report, data = a.out / "report.md", a.out / "report.json"
    try:
        runs_so_far = json.loads(data.read_text())["runs"] if data.exists() else []
    except (ValueError, KeyError, TypeError):
        data.rename(data.with_suffix(".json.unreadable"))
        runs_so_far = []
    opening = f"`{header['command']}` | {header['machine']} | {header['commit']} | {header['started']}\n\n"
    earlier = report.exists() and report.stat().st_size > 0
    with report.open("a") as md:
        md.write(("\n" if earlier else "") + opening)
    print(opening, end="", flush=True)
    start = time.monotonic()
    for number, section in enumerate(SECTIONS, 1):
        if section.name not in names:
            continue
        left = a.deadline - (time.monotonic() - start) if a.deadline else float("inf")
        skipped = {"number": number, "name": section.name, "title": section.title, "seconds": 0.0,
                   "timeout": limits[section.name], "status": "skipped", "figures": {}}
        if section.cpu_skip and not gpu and (a.sections in (None, "all") or section.name not in BENCH_CPU):
            result = skipped | {"lines": [f"skipped: CPU mode ({section.cpu_skip})"]}
        elif left < LEAST:
            result = skipped | {"lines": [f"skipped: {left:.0f} s left of `--deadline {a.deadline:g}`"]}
        else:
            result = run_section(number, section, a.out, gpu, min(limits[section.name], left))
        header["sections"].append(result)
        text = markdown(result)
        with report.open("a") as md:
            md.write(text)
        data.write_text(json.dumps({"runs": [*runs_so_far, header]}, indent=1, default=str) + "\n")
        print(text, end="", flush=True)
    bad = [s["name"] for s in header["sections"] if s["status"] in ("FAILED", "TIMED OUT")]
    print(f"{len(header['sections'])} sections, {len(bad)} failed or timed out{': ' + ', '.join(bad) if bad else ''}; "
          f"report: {report}")
    return 1 if bad else 0


if __name__ == "__main__":
    pass_on_sigterm()
    sys.exit(main())
