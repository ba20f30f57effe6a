"""The paper's signature at a scale this machine re-runs: TTRL vs EVOL-RL over several seeds (docs/study.md).

    python -m tools.study.study probe          # the base model on candidate tasks: which one has headroom (~10 min)
    python -m tools.study.study run            # every method x 3 seeds, resumable run by run (~25 min a run, 2 cores)
    python -m tools.study.study summary        # the table at the last evaluation (mean +- sd) and OUT/curves.png
    python -m tools.study.study run --smoke    # 2 training steps of each method, one seed, one evaluation batch (CI)
    python -m tools.study.study probe --task chain  # the base model on chained sums it works out step by step

Each study's commands (Studies I to III, the other label-free methods side by side): docs/study.md, "Reproducing the
studies".

A run is the CLI itself: ``python -m evolrl fit --config configs/demo.yaml --config configs/study.yaml`` plus the
method's overlay (``METHODS``: none for EVOL-RL, ``configs/demo_ttrl.yaml`` for TTRL), plus a file this tool writes
beside the run with its seed (``seed_everything`` and ``data.seed``: prompt order, trained subsets, sampling) and its
log directory ``<out>/<method>/seed<S>``. The methods differ only where their overlays say; everything else
(model, task, steps, learning rate, evaluation) is ``configs/study.yaml`` on top of the demo. A finished run leaves
``done.json`` (its wall time, the commit it started at and each start in ``parts``); ``run`` skips those, and goes on
with an unfinished one from its newest checkpoint (every ``CHECKPOINT_EVERY`` steps, or a SIGTERM's; from the start
when it saved none). vLLM's CPU build seeds per engine, so a resumed run samples anew from there, as another seed would.

``probe`` measures the untrained model on candidate tasks (``probe.py``).

``summary`` reads the TensorBoard event files: held-out pass@1, pass@16 and maj@16 at every evaluation, the training
curves over the first and last ``--tail`` steps, the collapse monitor's step and the step times, mean +- sd over the
seeds; the last responses logged; the curves drawn by ``tools.commands.plot_dynamics`` (mean, min-max band).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.checkpoints.run_dir import newest_checkpoint
from evolrl.compare.curves import mean_sd
from evolrl.compare.paired import bootstrap, differences, last_responses, per_problem, read_rows
from tools.commands.plot_dynamics import plot
from tools.common import ROOT, commit, pass_on_sigterm, read_scalars, table
from tools.study.probe import REASONING, SAMPLINGS, probe

BASE = ["configs/demo.yaml", "configs/study.yaml"]
METHODS = {
    "evol": ("EVOL-RL", []),
    "ttrl": ("TTRL", ["configs/demo_ttrl.yaml"]),
    "ttrl_clip_entropy": ("TTRL + clip-high + entropy", ["configs/demo_ttrl_clip_entropy.yaml"]),
    "evol_until": ("EVOL-RL until answer", ["configs/demo_until_answer.yaml"]),
    "ttrl_watch": ("TTRL + clip-high + entropy", ["configs/demo_ttrl_clip_entropy.yaml", "configs/study4_ttrl.yaml"]),
    "self_certainty": ("self-certainty (Intuitor)", ["configs/demo_self_certainty.yaml"]),
    "token_entropy": ("token entropy (RENT)", ["configs/demo_token_entropy.yaml"]),
    "semantic_entropy": ("semantic entropy (EMPO)", ["configs/demo_semantic_entropy.yaml"]),
}
"""Method -> (label, overlay configs on top of ``BASE``). Study I is the first two, Study II the first four
(``--methods evol ttrl ttrl_clip_entropy evol_until``); the others are the other label-free methods, run side by
side the same way (``--methods self_certainty token_entropy semantic_entropy``)."""
TASKS = {"addition": [], "word": ["configs/study_reasoning.yaml"], "chain": ["configs/study_chain.yaml"],
         "chain4": ["configs/study4.yaml"]}
"""``--task`` -> overlay configs between ``BASE`` and the method's: additions in [0, 29] (configs/study.yaml's own),
the word problems of configs/study_reasoning.yaml (Study II's first reasoning candidate) or the chained sums of
configs/study_chain.yaml (Study III's task, the probe's pick)."""
EVAL_SET = "heldout"
FINAL = ("pass@1", "pass@16", "maj@16")
TRAIN = ("entropy", "response_length", "trailing_fraction", "majority_ratio", "label_accuracy", "novelty_mean")
TIMES = ("step", "reward", "update")
SAMPLES = "train/samples/text_summary"


def fit(configs: list[str], out: Path, env: dict, ckpt_path: Path | None = None) -> int:
    """``python -m evolrl fit`` with these configs (from ``ckpt_path`` when given), its console appended to
    ``out/console.log``; the exit code."""
    out.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "evolrl", "fit"] + [a for c in configs for a in ("--config", c)]
    if ckpt_path is not None:
        args += ["--ckpt_path", str(ckpt_path)]
    with open(out / "console.log", "a") as log:
        return subprocess.run(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


CHECKPOINT_EVERY = 10
"""A run saves a checkpoint every this many training steps (the latest only) and an interrupted run goes on from
it: a run takes longer than a working session may last."""


def checkpoints(directory: Path) -> dict:
    """The callbacks of a run saving into ``directory/checkpoints``: configs/study.yaml's, then a ``ModelCheckpoint``
    keeping the latest of every ``CHECKPOINT_EVERY`` steps (named by its step)."""
    callbacks = yaml.safe_load((ROOT / BASE[1]).read_text())["trainer"]["callbacks"]
    saver = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": str(directory / "checkpoints"), "filename": "{step}",
                           "every_n_train_steps": CHECKPOINT_EVERY, "save_top_k": 1}}
    return {"enable_checkpointing": True, "callbacks": callbacks + [saver]}


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint of an unfinished run: a ``step=N.ckpt`` or the ``last.ckpt`` a stopped ``fit`` saves
    (what ``--ckpt_path last`` picks); ``None`` without one."""
    return newest_checkpoint(directory / "checkpoints")


FLOAT32 = {"trainer": {"precision": "32-true"}, "data": {"engine": {"init_args": {"dtype": "float32"}}}}
"""``run --float32``: the update and the rollouts in float32 whatever the CPU (Study II: runs made on different
machines do not differ in precision)."""


def run_overlay(out: Path, method: str, seed: int, smoke: bool, steps: int | None = None,
                float32: bool = False, lr: float | None = None) -> dict:
    """The seed's overlay of a run in ``out/method/seed<S>``: its seed, logger, checkpoints and ``run``'s options."""
    overlay = {
        "seed_everything": seed,
        "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": str(out), "name": method, "version": f"seed{seed}"}}},
        "data": {"seed": seed},
    }
    overlay["trainer"] |= checkpoints(out / method / f"seed{seed}")
    if steps is not None:  # a shorter run: evaluated before training, after every third of it and at its end
        overlay["trainer"] |= {"limit_train_batches": steps, "val_check_interval": max(1, steps // 3)}
    if lr is not None:  # a study's declared learning rate (Study III: from its pilot pair)
        overlay["model"] = {"optim": {"lr": lr}}
    if float32:
        overlay["trainer"] |= FLOAT32["trainer"]
        overlay["data"] |= FLOAT32["data"]
    if smoke:
        overlay["trainer"] |= {"limit_train_batches": 2, "val_check_interval": 2, "limit_val_batches": 1}
    return overlay


def run_configs(task: str, method: str) -> list[str]:
    """The configs a run of ``method`` on ``task`` composes, before its seed overlay."""
    return BASE + TASKS[task] + METHODS[method][1]


STARTED = "%Y-%m-%d %H:%M:%S"


def new_start(parts_file: Path, resume: Path | None) -> list[dict]:
    """The run's starts (``parts.json``: each start's commit, the checkpoint it went on from, when it started, its
    wall time), with a new one written (its time ``None`` until it ends). A start interrupted before it ended is
    counted up to the checkpoint this one goes on from (what came after that is done again)."""
    parts = json.loads(parts_file.read_text()) if resume is not None and parts_file.exists() else []
    if parts and parts[-1]["seconds"] is None:
        parts[-1]["seconds"] = resume.stat().st_mtime - time.mktime(time.strptime(parts[-1]["started"], STARTED))
        parts[-1]["until"] = resume.name
    parts.append({"commit": commit(), "from": resume.name if resume else None, "started": time.strftime(STARTED),
                  "seconds": None})
    parts_file.write_text(json.dumps(parts, indent=1))
    return parts


def run(a: argparse.Namespace) -> None:
    out = Path(a.out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for seed in a.seeds:
        for method in a.methods:
            directory = out / method / f"seed{seed}"
            if (directory / "done.json").exists():
                print(f"{method} seed {seed}: done already", flush=True)
                continue
            resume = latest_checkpoint(directory)
            if directory.exists() and resume is None:  # interrupted before its first checkpoint: start it again
                shutil.rmtree(directory)
            directory.mkdir(parents=True, exist_ok=True)
            overlay = directory.parent / f"seed{seed}.yaml"
            overlay.write_text(yaml.safe_dump(run_overlay(out, method, seed=seed, smoke=a.smoke, steps=a.steps,
                                                          float32=a.float32, lr=a.lr)))
            parts_file = directory / "parts.json"
            parts = new_start(parts_file, resume)
            start = time.perf_counter()
            code = fit(run_configs(a.task, method) + [str(overlay)], directory, env, ckpt_path=resume)
            parts[-1]["seconds"] = time.perf_counter() - start
            parts_file.write_text(json.dumps(parts, indent=1))
            if code:
                sys.exit(f"{method} seed {seed} failed (exit {code}); its console: {directory / 'console.log'}")
            seconds = sum(p["seconds"] for p in parts)  # each interrupted start counted up to the checkpoint used
            (directory / "done.json").write_text(json.dumps({"seconds": seconds, "commit": parts[0]["commit"],
                                                             "parts": parts}))
            shutil.rmtree(directory / "checkpoints", ignore_errors=True)  # gigabytes, and the run is done
            print(f"{method} seed {seed}: {seconds / 60:.1f} min", flush=True)


def run_numbers(scalars: dict[str, list[tuple[int, float]]], tail: int) -> dict[str, float]:
    """Held-out metrics at the first and last evaluation, training curves over the last ``tail`` steps."""
    numbers = {}
    for name in FINAL:
        points = scalars.get(f"val/{EVAL_SET}/{name}", [])
        if points:
            numbers[f"{name} start"], numbers[f"{name} last"] = points[0][1], points[-1][1]
            numbers["last evaluation step"] = points[-1][0]
    collapse = scalars.get("collapse/step", [])
    numbers["collapse step (runs that collapsed)"] = collapse[0][1] if collapse else math.nan
    for part in TIMES:
        points = scalars.get(f"time/{part}", [])
        if points:
            numbers[f"time/{part} median s"] = statistics.median(v for _, v in points)
    for name in TRAIN:
        points = scalars.get(f"train/{name}", [])
        if points:
            numbers[f"{name} first {tail}"] = statistics.mean(v for _, v in points[:tail])
            numbers[f"{name} last {tail}"] = statistics.mean(v for _, v in points[-tail:])
    return numbers


RULES = {
    "II": {"pass@16 margin": 0.05, "entropy ratio": 2.0, "trailing under": 0.1},
    "III": {"pass@16 margin": 0.05, "entropy ratio": 2.0, "trailing under": 0.1, "novelty over": 0.03},
}
"""The pre-registered verdict rules (docs/study.md), per seed against TTRL's run of the same seed: held-out pass@16
at the last evaluation at least TTRL's + the margin, training entropy over the last 10 steps at least the ratio times
TTRL's, trailing fraction over the last 10 steps under its bound; Study III adds mean novelty (``train/novelty_mean``)
over the last 10 steps above a floor, so a run whose novelty has nothing left to tell apart cannot pass."""


def verdict_rows(arm: dict[str, dict[str, float]], ttrl: dict[str, dict[str, float]], tail: int,
                 rule: dict[str, float] = RULES["II"]) -> tuple[list, bool]:
    """``([(seed, pass@16, TTRL's, entropy, TTRL's, trailing[, novelty], met (a bool per criterion))], signature
    shown)`` for the seeds both arms ran (``{seed name: run_numbers}``); the signature is shown when every criterion
    holds in every seed."""
    rows = []
    for seed in sorted(arm.keys() & ttrl.keys()):
        a, t = arm[seed], ttrl[seed]
        cells = (a["pass@16 last"], t["pass@16 last"], a[f"entropy last {tail}"], t[f"entropy last {tail}"],
                 a[f"trailing_fraction last {tail}"])
        met = (cells[0] >= cells[1] + rule["pass@16 margin"], cells[2] >= rule["entropy ratio"] * cells[3],
               cells[4] < rule["trailing under"])
        if "novelty over" in rule:
            novelty = a.get(f"novelty_mean last {tail}", math.nan)  # NaN (never logged) fails the comparison
            cells, met = (*cells, novelty), (*met, novelty > rule["novelty over"])
        rows.append((seed, *cells, met))
    return rows, bool(rows) and all(all(r[-1]) for r in rows)


def verdict(numbers: dict[str, list[dict]], runs: dict[str, list[Path]], arm: str, tail: int, study: str) -> None:
    """Study ``study``'s rule applied to ``arm`` against TTRL, seed by seed (``numbers``: each run's ``run_numbers``,
    in the order of ``runs``)."""
    rule = RULES[study]
    by_seed = {m: {d.name: n for d, n in zip(runs[m], numbers[m])} for m in (arm, "ttrl")}
    rows, shown = verdict_rows(by_seed[arm], by_seed["ttrl"], tail, rule)
    mark = {True: "yes", False: "no"}
    novelty = "novelty over" in rule
    extra = f" novelty last {tail} | (4) > {rule['novelty over']} |" if novelty else ""
    print(f"Verdict rule of Study {study} (docs/study.md), {METHODS[arm][0]} against TTRL, seed by seed:\n"
          f"| seed | pass@16 | TTRL pass@16 | (1) >= TTRL + {rule['pass@16 margin']} | entropy last {tail} | TTRL "
          f"entropy | (2) >= {rule['entropy ratio']:g} x TTRL | trailing last {tail} | (3) < {rule['trailing under']} |"
          f"{extra}\n" + "|---" * (11 if novelty else 9) + "|")
    for seed, p, tp, e, te, tr, *rest in rows:
        met = rest[-1]
        cells = f" {rest[0]:.3f} | {mark[met[3]]} |" if novelty else ""
        print(f"| {seed} | {p:.3f} | {tp:.3f} | {mark[met[0]]} | {e:.3f} | {te:.3f} (x{e / te:.2f}) | {mark[met[1]]} "
              f"| {tr:.3f} | {mark[met[2]]} |{cells}")
    print(f"signature shown (every criterion in every seed): {mark[shown]}")


def per_problem_pass16(runs: list[Path]) -> list[dict[str, float]]:
    """Per run, ``{problem: pass@16}`` at its last evaluation (any of its 16 samples right)."""
    return [per_problem(read_rows(last_responses(d)), "pass@16") for d in runs]


def paired_pass16(arm: list[Path], ttrl: list[Path], resamples: int = 10_000) -> tuple[float, float, float, int]:
    """Study IV's primary as pre-registered: per held-out problem at each run's last evaluation, pass@16 averaged
    over each arm's seeds; ``(mean of arm's minus TTRL's, 5th and 95th percentiles of that mean over resampled
    problems (seed 0), problems)``. The seeds' spread is not resampled: :func:`paired_pass16_seeds` resamples it."""
    import random

    def mean_over_seeds(tables: list[dict[str, float]]) -> dict[str, float]:
        return {i: statistics.fmean(t[i] for t in tables) for i in tables[0]}

    a, t = mean_over_seeds(per_problem_pass16(arm)), mean_over_seeds(per_problem_pass16(ttrl))
    gaps, g = [a[i] - t[i] for i in sorted(a)], random.Random(0)
    means = sorted(statistics.fmean(g.choices(gaps, k=len(gaps))) for _ in range(resamples))
    return statistics.fmean(gaps), means[resamples // 20], means[resamples - resamples // 20 - 1], len(gaps)


def paired_pass16_seeds(arm: list[Path], ttrl: list[Path]) -> tuple[float, float, float]:
    """The same difference paired seed by seed (``arm`` and ``ttrl`` in the same seeds' order), its 90% interval from
    the bootstrap over seeds and problems together (``evolrl.compare.paired``; docs/study.md, Study IV's addendum)."""
    matrix, _ = differences(per_problem_pass16(arm), per_problem_pass16(ttrl))
    return bootstrap(matrix, 10_000, 0.9)


def verdict_iv(numbers: dict[str, list[dict]], runs: dict[str, list[Path]], tail: int) -> str:
    """Study IV's rule (docs/study.md): TTRL's collapse in 2 of 3 seeds first, then the paired pass@16; the secondary
    criteria beside it. Returns the verdict."""
    ttrl, evol = numbers["ttrl_watch"], numbers["evol_until"]
    collapsed = [n[f"entropy last {tail}"] <= 0.4 * n[f"entropy first {tail}"] for n in ttrl]
    gap, low, high, problems = paired_pass16(runs["evol_until"], runs["ttrl_watch"])

    def ratio(key: str) -> float:
        return statistics.fmean(n.get(key, math.nan) for n in evol) / statistics.fmean(n.get(key, math.nan) for n in ttrl)

    pass1 = statistics.fmean(n["pass@1 last"] for n in evol) - statistics.fmean(n["pass@1 last"] for n in ttrl)
    entropy, novelty = ratio(f"entropy last {tail}"), ratio(f"novelty_mean last {tail}")
    rows = [(f"precondition: TTRL collapsed (entropy last {tail} <= 0.4 x first {tail}), seeds", f"{sum(collapsed)} of "
             f"{len(collapsed)}", sum(collapsed) >= 2),
            (f"primary: paired pass@16, EVOL-RL - TTRL, over {problems} problems (90% interval)",
             f"{gap:+.3f} ({low:+.3f}, {high:+.3f})", gap >= 0.05 and low > 0),
            ("primary's interval over seeds and problems together (not the rule's)",
             "{:+.3f} ({:+.3f}, {:+.3f})".format(*paired_pass16_seeds(runs["evol_until"], runs["ttrl_watch"])), ""),
            ("secondary: entropy, EVOL-RL / TTRL", f"{entropy:.2f}", entropy >= 1.5),
            ("secondary: novelty, EVOL-RL / TTRL", f"{novelty:.2f}", novelty >= 1.5),
            ("secondary: pass@1, EVOL-RL - TTRL", f"{pass1:+.3f}", pass1 >= -0.05)]
    print("\n".join(table(["Study IV (docs/study.md)", "value", "met"], [(n, v, {True: "yes", False: "no"}.get(m, "")) for n, v, m in rows])))
    return ("inconclusive at this scale" if not rows[0][2] else "shown" if rows[1][2] else "not shown")


def evaluations(scalars: dict[str, list[dict]], methods: list[str]) -> None:
    """Held-out metrics at every evaluation step, mean +- sd over the seeds of each method."""
    heads = [f"{METHODS[m][0]} {name}" for name in FINAL for m in methods]
    print(f"| step | {' | '.join(heads)} |\n" + "|---" * (len(heads) + 1) + "|")
    steps = sorted({s for runs in scalars.values() for run in runs for s, _ in run.get(f"val/{EVAL_SET}/pass@1", [])})
    for step in steps:
        cells = [mean_sd([dict(run[f"val/{EVAL_SET}/{name}"])[step] for run in scalars[m]
                          if step in dict(run.get(f"val/{EVAL_SET}/{name}", []))]) for name in FINAL for m in methods]
        print(f"| {step} | {' | '.join(cells)} |")


def curves_at_evaluations(scalars: dict[str, list[dict]], methods: list[str], tail: int) -> None:
    """At every evaluation step, the training curves' mean over the ``tail`` training steps up to it (entropy, response
    length, trailing fraction), mean +- sd over the seeds of each method: a drift into trailing text shows beside
    the entropy it buys."""
    curves = {"entropy": "entropy", "response_length": "length", "trailing_fraction": "trailing"}
    heads = [f"{METHODS[m][0]} {short}" for short in curves.values() for m in methods]
    print(f"| step | {' | '.join(heads)} |\n" + "|---" * (len(heads) + 1) + "|")
    steps = sorted({s for runs in scalars.values() for run in runs for s, _ in run.get(f"val/{EVAL_SET}/pass@1", [])})

    def before(run: dict, name: str, step: int) -> list[float]:
        return [v for s, v in run.get(f"train/{name}", []) if step - tail < s <= step]

    for step in steps[1:]:  # the first evaluation comes before any training step
        cells = [mean_sd([statistics.mean(vs) for run in scalars[m] if (vs := before(run, name, step))])
                 for name in curves for m in methods]
        print(f"| {step} | {' | '.join(cells)} |")


def per_run(scalars: dict[str, list[dict]], runs: dict[str, list[Path]], tail: int) -> None:
    """One row per run: held-out metrics at the last evaluation, training curves over the last ``tail`` steps, and
    where the entropy bottomed out (the lowest mean over ``tail`` consecutive steps)."""
    print("| run | pass@1 | pass@16 | entropy | response length | trailing fraction | label accuracy "
          "| lowest entropy (from step) |\n" + "|---" * 8 + "|")
    for m, dirs in runs.items():
        for directory, run in zip(dirs, scalars[m]):
            n = run_numbers(run, tail)
            entropy = [v for _, v in run.get("train/entropy", [])]
            windows = [sum(entropy[i:i + tail]) / tail for i in range(len(entropy) - tail + 1)] or [math.nan]
            low = min(range(len(windows)), key=windows.__getitem__)
            print(f"| {METHODS[m][0]} {directory.name} | {n.get('pass@1 last', math.nan):.3f} "
                  f"| {n.get('pass@16 last', math.nan):.3f} | {n.get(f'entropy last {tail}', math.nan):.2f} "
                  f"| {n.get(f'response_length last {tail}', math.nan):.1f} "
                  f"| {n.get(f'trailing_fraction last {tail}', math.nan):.2f} "
                  f"| {n.get(f'label_accuracy last {tail}', math.nan):.2f} | {windows[low]:.2f} ({low}) |")


def last_samples(directory: Path) -> str:
    """The last table of sampled responses the run logged (``SampleLogger``, TensorBoard's text tab)."""
    events = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    events.Reload()
    logged = events.Tensors(SAMPLES) if SAMPLES in events.Tags()["tensors"] else []
    return f"step {logged[-1].step}:\n{logged[-1].tensor_proto.string_val[0].decode()}" if logged else "(none logged)"


def summary(a: argparse.Namespace) -> None:
    out = Path(a.out)
    runs = {m: sorted(p.parent for p in (out / m).glob("seed*/done.json")) for m in a.methods}
    if not any(runs.values()):
        sys.exit(f"summary: no finished run of {', '.join(a.methods)} under {out} (a run is finished when its "
                 f"seed*/done.json exists; `study run` with the same --out goes on with an unfinished one)")
    scalars = {m: [read_scalars(d) for d in dirs] for m, dirs in runs.items()}
    numbers = {m: [run_numbers(s, a.tail) for s in runs_] for m, runs_ in scalars.items()}
    keys = list(dict.fromkeys(k for m in a.methods for n in numbers[m] for k in n))  # any method's, in order
    rows = [[key, *(mean_sd([n[key] for n in numbers[m] if key in n]) for m in a.methods)] for key in keys]
    print("\n".join(table(["metric", *(f"{METHODS[m][0]} ({len(runs[m])} seeds)" for m in a.methods)], rows)))
    minutes = [json.loads((d / "done.json").read_text())["seconds"] / 60 for dirs in runs.values() for d in dirs]
    print(f"\n{len(minutes)} runs, {sum(minutes):.0f} min in all ({min(minutes):.1f} to {max(minutes):.1f} a run)\n")
    per_run(scalars, runs, a.tail)
    print()
    if a.rule == "IV" and {"ttrl_watch", "evol_until"} <= set(a.methods):
        print(f"verdict: {verdict_iv(numbers, runs, a.tail)}\n")
    elif {"ttrl", "evol_until"} <= set(a.methods):
        verdict(numbers, runs, "evol_until", a.tail, a.rule)
        print()
    evaluations(scalars, a.methods)
    print()
    curves_at_evaluations(scalars, a.methods, a.tail)
    for m in a.methods:
        if runs[m]:
            print(f"\n{METHODS[m][0]}, {runs[m][0].name}, the last sampled responses logged, {last_samples(runs[m][0])}")
    figure = plot([d for m in a.methods for d in runs[m]], [METHODS[m][0] for m in a.methods for _ in runs[m]],
                  out=Path(a.figure or out / "curves.png"), eval_set=EVAL_SET, pass_k=16, every_seed=a.every_seed)
    print(f"figure: {figure}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tools.study.study",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["probe", "run", "summary"])
    p.add_argument("--methods", nargs="+", default=["evol", "ttrl"], choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", help="where the runs go; default runs/study, runs/study_reasoning (--task word) or "
                                 "runs/study_chain (--task chain)")
    p.add_argument("--smoke", action="store_true", help="run: 2 steps, one evaluation batch")
    p.add_argument("--steps", type=int, help="run: this many training steps instead of configs/study.yaml's 80")
    p.add_argument("--lr", type=float, help="run: this learning rate instead of configs/demo.yaml's 1e-5")
    p.add_argument("--float32", action="store_true",
                   help="run: train and sample in float32 on any CPU (Study II), not the demo's bf16")
    p.add_argument("--tail", type=int, default=10, help="summary: training curves averaged over this many steps")
    p.add_argument("--figure", help="summary: where the figure goes (default: curves.png in --out)")
    p.add_argument("--every-seed", action="store_true", help="summary: the figure draws each run, not the mean")
    p.add_argument("--rule", choices=[*RULES, "IV"], default="II",
                   help="summary: the study whose verdict rule applies (RULES; docs/study.md)")
    p.add_argument("--task", choices=list(TASKS), default="addition",
                   help="run: the task (TASKS); probe: its candidates (probe.CANDIDATES, probe.REASONING)")
    p.add_argument("--candidates", nargs="+", type=int, help="probe --task word|chain: these candidates (0-based)")
    p.add_argument("--samplings", nargs="+", choices=list(SAMPLINGS), default=list(SAMPLINGS),
                   help="probe --task word|chain: pass@k at the first, the vote and response measures at the last")
    p.add_argument("--problems", type=int, default=32, help="probe --task word|chain: problems per task")
    a = p.parse_args()
    a.out = a.out or {"addition": "runs/study", "word": "runs/study_reasoning", "chain": "runs/study_chain",
                      "chain4": "runs/study4"}[a.task]
    if a.problems < 1:
        p.error(f"--problems {a.problems}: a probe needs at least 1 problem")
    count = len(REASONING.get(a.task, {}))
    if a.candidates and (a.task == "addition" or any(not 0 <= i < count for i in a.candidates)):
        p.error(f"--candidates {a.candidates}: with --task word or chain, each is 0 to {max(count - 1, 0)} "
                "(probe.REASONING)")
    if a.lr is not None and not 0 < a.lr < 1:
        p.error(f"--lr {a.lr}: a learning rate between 0 and 1")
    if a.steps is not None and a.steps < 1:
        p.error(f"--steps {a.steps}: a run needs at least 1 training step")
    {"probe": probe, "run": run, "summary": summary}[a.command](a)


if __name__ == "__main__":
    pass_on_sigterm()
    main()
