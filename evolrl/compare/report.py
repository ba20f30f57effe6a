"""``compare report``: the finished runs of the plan, read back and compared as the rule says.

Printed and written to ``<out>/report.md``, with the figure beside it (``<out>/curves.png``):
- the runs: each one's state, the commits and processors its starts recorded (a line names any seed whose arms
  ran at different commits or on different processors), and the runs left out: missing or
  unfinished, or refused because their saved configuration (``config.yaml``, what ``fit`` ran) differs from the
  plan's in anything (a run's arm and seed are already its own in the plan, so any difference is something else);
- per arm at every evaluation, mean +- sd over its seeds: held-out pass@1, pass@K, maj@K, the training entropy and
  response length over the training steps between the evaluation before and this one, and the collapse step
  (``CollapseMonitor``);
- the rule: each arm against the baseline, the paired difference per problem at the last evaluation, each seed's
  own mean, and the interval from the bootstrap over seeds and problems (``paired.py``), then the outcome.
A seed counts in the paired difference when both arms finished it, were accepted and last evaluated at one step.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import yaml

from evolrl.checkpoints.record import finished, read_record
from evolrl.compare.curves import mean_sd, read_scalars, table
from evolrl.compare.paired import (bootstrap, differences, evaluated_step, last_responses, outcome, per_problem,
                                   read_rows)
from evolrl.compare.plan import run_dir, run_keys
from evolrl.compare.resolve import IGNORED, changes
from evolrl.compare.spec import METRIC, CompareError

FIGURE = "curves.png"


def run_states(plan: dict, out: Path) -> dict[tuple[str, int], tuple[str, list[str]]]:
    """``(arm, seed) -> (state, details)``: ``finished`` (accepted), ``refused`` (the configuration's differences),
    ``unfinished`` or ``missing``."""
    states = {}
    for arm, seed in run_keys(plan):
        directory = run_dir(out, arm, seed)
        if not directory.exists():
            states[arm, seed] = ("missing", [])
        elif not finished(directory) or not (directory / "config.yaml").exists():
            states[arm, seed] = ("unfinished", [])
        else:
            saved = yaml.safe_load((directory / "config.yaml").read_text())
            diff = changes(plan["runs"][f"{arm}/seed{seed}"], {k: v for k, v in saved.items() if k not in IGNORED})
            states[arm, seed] = ("refused", diff) if diff else ("finished", [])
    return states


def runs_table(states: dict, out: Path, plan_commit: str) -> list[str]:
    rows = []
    for (arm, seed), (state, _) in states.items():
        entries = read_record(run_dir(out, arm, seed))
        starts, ends = ([r for r in entries if r["event"] == event] for event in ("start", "end"))
        rows.append([arm, seed, state, len(starts), ends[-1]["step"] if ends else "-",
                     ", ".join(dict.fromkeys(r["commit"] for r in starts)) or "-",
                     ", ".join(dict.fromkeys(r["processor"] for r in starts)) or "-"])
    lines = table(["arm", "seed", "state", "starts", "steps", "commit", "processor"], rows)
    for column, how in ((5, "at different commits"), (6, "on different processors")):  # kernels differ between CPUs
        seeds = {}
        for row in rows:
            if row[2] == "finished":
                seeds.setdefault(row[1], set()).add(row[column])
        mixed = [seed for seed, values in seeds.items() if len(values) > 1]
        if mixed:
            lines.append(f"\nThe arms of seed(s) {mixed} ran {how}.")
    return [f"Plan made at commit {plan_commit}.", "", *lines]


def at_evaluations(plan: dict, scalars: dict[str, list[dict]]) -> list[str]:
    """Per arm, one row per evaluation step (module docstring)."""
    eval_set, k = plan["eval_set"], METRIC.fullmatch(plan["rule"]["metric"]).group(2)
    names = ["pass@1", f"pass@{k}", f"maj@{k}"]
    lines = []
    for arm, runs in scalars.items():
        if not runs:
            continue
        steps = sorted({s for run in runs for s, _ in run.get(f"val/{eval_set}/pass@1", [])})
        collapse = [run["collapse/step"][0][1] if run.get("collapse/step") else float("nan") for run in runs]
        rows = []
        for before, step in zip([None, *steps], steps):
            def since(run: dict, tag: str) -> list[float]:
                # A training step's curves are logged at the step count before it: those behind this evaluation.
                return [v for s, v in run.get(tag, []) if (before is None or s >= before) and s < step]

            cells = [seeds_mean([dict(run[f"val/{eval_set}/{n}"])[step] for run in runs
                                 if step in dict(run.get(f"val/{eval_set}/{n}", []))], len(runs)) for n in names]
            cells += [mean_sd([statistics.fmean(v) for run in runs if (v := since(run, f"train/{tag}"))], digits)
                      for tag, digits in (("entropy", 3), ("response_length", 1))]
            rows.append([step, *cells])
        lines += [f"{arm} ({len(runs)} seeds), on {eval_set}; collapse step: {mean_sd(collapse, 0)}", "",
                  *table(["step", *names, "entropy", "length"], rows), ""]
    return lines


def seeds_mean(values: list[float], seeds: int) -> str:
    """``mean +- sd``, and how many of the arm's seeds it covers where an evaluation is missing from some."""
    return mean_sd(values) + (f" ({len(values)} of {seeds} seeds)" if len(values) < seeds else "")


def scored(run: Path, metric: str, eval_set: str) -> dict[str, float]:
    """``{problem: metric}`` at the run's last evaluation; a :class:`CompareError` where it wrote no responses."""
    path = last_responses(run)
    scores = per_problem(read_rows(path), metric, eval_set) if path is not None else {}
    if not scores:
        raise CompareError(f"compare report: {run} holds no held-out responses of {eval_set!r} "
                           "(val_responses_step*.jsonl, written by evolrl.callbacks.EvalResponses)")
    return scores


def paired(plan: dict, out: Path, arm: str, base: str, seeds: list[int], metric: str
           ) -> tuple[np.ndarray, list[str], tuple[float, float, float]]:
    """``arm - base`` in ``metric`` per seed and problem at the last evaluation, the problems, and the matrix's mean
    and interval from the bootstrap over seeds and problems (the plan's rule's resamples and confidence)."""
    scores = {a: [scored(run_dir(out, a, s), metric, plan["eval_set"]) for s in seeds] for a in (arm, base)}
    matrix, problems = differences(scores[arm], scores[base])
    return matrix, problems, bootstrap(matrix, plan["rule"]["resamples"], plan["rule"]["confidence"])


def rule_section(plan: dict, out: Path, states: dict) -> list[str]:
    """Each arm against the baseline, paired (module docstring), and the rule's outcome."""
    rule, base = plan["rule"], plan["rule"]["baseline"]
    sign = ">=" if rule["direction"] == "greater" else "<="
    threshold = rule["threshold"] if rule["direction"] == "greater" else -rule["threshold"]
    level = f"{rule['confidence']:.0%}"
    lines = [f"Rule: {rule['metric']} per held-out problem at the last evaluation, each arm - {base}, paired by seed "
             f"and problem; shown when the mean is {sign} {threshold:+g} and the {level} interval (bootstrap over "
             f"seeds and problems, {rule['resamples']} replicates) excludes 0 on that side.", ""]
    rows, notes = [], []
    for arm in plan["arms"]:
        if arm == base:
            continue
        seeds = [s for s in plan["seeds"] if states[arm, s][0] == states[base, s][0] == "finished"]
        for seed in list(seeds):  # a pair is read at one step, or not at all
            steps = {a: evaluated_step(last_responses(run_dir(out, a, seed))) for a in (arm, base)}
            if steps[arm] != steps[base]:
                seeds.remove(seed)
                notes.append(f"- {arm} - {base}, seed {seed}: left out, its last evaluations are at different steps "
                             f"({', '.join(f'{a} {s}' for a, s in steps.items())})")
        if not seeds:
            rows.append([arm, 0, "-", "-", "-", "-", "no seed finished in both arms at one step"])
            continue
        matrix, problems, (gap, low, high) = paired(plan, out, arm, base, seeds, rule["metric"])
        shown = outcome(gap, low, high, rule["direction"], rule["threshold"])
        per_seed = ", ".join(f"{s}: {m:+.3f}" for s, m in zip(seeds, matrix.mean(axis=1)))
        rows.append([arm, len(seeds), len(problems), f"{gap:+.3f}", f"({low:+.3f}, {high:+.3f})", per_seed,
                     "shown" if shown else "not shown"])
    return lines + table([f"arm - {base}", "seeds", "problems", f"mean {rule['metric']}", f"{level} interval",
                          "per seed", "outcome"], rows) + (["", *notes] if notes else [])


def report(plan: dict, out: Path) -> tuple[str, Path | None]:
    """The report's text and its figure (``None`` without a finished run)."""
    from evolrl.compare.figure import plot

    states = run_states(plan, out)
    left = [f"- {arm} seed {seed}: {state}" + "".join(f"\n    {d}" for d in details)
            for (arm, seed), (state, details) in states.items() if state != "finished"]
    accepted = {arm: [run_dir(out, a, s) for (a, s), (state, _) in states.items() if a == arm and state == "finished"]
                for arm in plan["arms"]}
    scalars = {arm: [read_scalars(d) for d in dirs] for arm, dirs in accepted.items()}
    lines = ["# Comparison", "", *runs_table(states, out, plan["commit"]), ""]
    if left:
        lines += ["Left out of the comparison (a refused run's settings: plan -> run):", *left, ""]
    lines += [*at_evaluations(plan, scalars), *rule_section(plan, out, states)]
    figure = None
    if any(accepted.values()):
        k = int(METRIC.fullmatch(plan["rule"]["metric"]).group(2))
        figure = plot([d for dirs in accepted.values() for d in dirs],
                      [arm for arm, dirs in accepted.items() for _ in dirs], out / FIGURE,
                      eval_set=plan["eval_set"], pass_k=k if k > 1 else None)
        lines += ["", f"Figure: {figure}"]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text, figure
