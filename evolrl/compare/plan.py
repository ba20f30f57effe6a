"""``compare plan``: every run's configuration resolved and written before any run, frozen once one has started.

``<out>/plan.json`` holds the spec, the decision rule (with its baseline filled in), the seeds, the commit the plan
was made at and each run's resolved configuration; ``<out>/plan/<arm>/seed<S>.yaml`` is the file each run's
``fit`` reads. Planning again before any run rewrites both. Once a run has started (its directory exists) a plan
that differs in anything a run or the rule depends on is refused, each difference named (a changed overlay file
shows as the settings it changed); the same plan is kept as it was, with its commit. A pre-registration is only
worth what stops it from moving.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from evolrl.provenance import commit
from evolrl.compare.resolve import changes, class_names, resolve, run_settings
from evolrl.compare.spec import METRIC, CompareError, Spec, arm_args

PLAN = "plan.json"


def run_dir(out: Path, arm: str, seed: int) -> Path:
    """Where a run writes: its curves, held-out responses, saved config, record, console and checkpoints."""
    return out / "runs" / arm / f"seed{seed}"


def input_file(out: Path, arm: str, seed: int) -> Path:
    """The configuration a run's ``fit`` reads (the plan's, resolved)."""
    return out / "plan" / arm / f"seed{seed}.yaml"


def run_keys(plan: dict) -> list[tuple[str, int]]:
    """``(arm, seed)`` of every run, seed by seed: the arms of a seed run one after the other (at one commit)."""
    return [(arm, seed) for seed in plan["seeds"] for arm in plan["arms"]]


def check_arm(spec: Spec, arm: str, config: dict) -> bool:
    """The arm's configuration logs the held-out set, with pass@k (``PassAtK``) and enough samples for the rule;
    whether the runs need ``EvalResponses`` added (the paired differences read its files)."""
    names = [(s.get("init_args") or {}).get("name") for s in (config.get("data") or {}).get("eval_sets") or []]
    if spec.eval_set not in names:
        raise CompareError(f"compare: eval_set={spec.eval_set!r}: arm {arm} evaluates {names or 'no set'} "
                           "(data.eval_sets' names)")
    if "PassAtK" not in class_names(config):
        raise CompareError(f"compare: arm {arm} has no evolrl.callbacks.PassAtK in trainer.callbacks: the report reads "
                           f"val/{spec.eval_set}/pass@k from it")
    k, samples = int(METRIC.fullmatch(spec.rule.metric).group(2)), config["data"].get("eval_samples")
    if samples is not None and samples < k:
        raise CompareError(f"compare: rule.metric={spec.rule.metric!r} needs at least {k} samples per held-out "
                           f"problem; arm {arm} draws data.eval_samples={samples}")
    return "EvalResponses" not in class_names(config)


def make_plan(spec: Spec) -> dict:
    """The plan of ``spec`` (resolving each arm once, then each of its runs)."""
    spec.check()
    out = Path(spec.out).resolve()
    runs = {}
    for arm, items in spec.arms.items():
        args = arm_args(spec.configs, items)
        add_responses = check_arm(spec, arm, resolve(args, f"arm {arm}"))
        for seed in spec.seeds:
            extra = run_settings(run_dir(out, arm, seed), seed, spec.checkpoint_every, add_responses)
            runs[f"{arm}/seed{seed}"] = resolve(args + extra, f"arm {arm}, seed {seed}")
    return {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": commit(), "spec": spec.as_dict(),
            "arms": list(spec.arms), "seeds": list(spec.seeds), "eval_set": spec.eval_set,
            "rule": asdict(spec.rule) | {"baseline": spec.baseline}, "runs": runs}


def load_plan(out: Path) -> dict | None:
    path = Path(out) / PLAN
    return json.loads(path.read_text()) if path.exists() else None


def started(out: Path, plan: dict) -> list[str]:
    """The runs of ``plan`` whose directory exists."""
    return [f"{arm}/seed{seed}" for arm, seed in run_keys(plan) if run_dir(Path(out), arm, seed).exists()]


def plan_changes(old: dict, new: dict) -> list[str]:
    """What ``new`` changes in ``old``: the rule, the seeds, the set, the arms, and each arm's resolved settings (once
    for an arm where every seed changed alike)."""
    lines = [f"{key}: {json.dumps(old[key])} -> {json.dumps(new[key])}" for key in ("arms", "seeds", "eval_set")
             if old[key] != new[key]]
    lines += [f"rule.{line}" for line in changes(old["rule"], new["rule"])]
    for arm in dict.fromkeys(old["arms"] + new["arms"]):
        seeds = [s for s in dict.fromkeys(old["seeds"] + new["seeds"]) if f"{arm}/seed{s}" in old["runs"]
                 and f"{arm}/seed{s}" in new["runs"]]
        per_seed = {s: changes(old["runs"][f"{arm}/seed{s}"], new["runs"][f"{arm}/seed{s}"]) for s in seeds}
        alike = len({tuple(c) for c in per_seed.values()}) == 1
        for seed, diff in per_seed.items():
            lines += [f"arm {arm}{'' if alike else f' seed {seed}'}: {line}" for line in diff]
            if alike:
                break
    return lines


def write_plan(spec: Spec) -> tuple[dict, list[str]]:
    """Plans ``spec`` into its ``out`` folder; ``(the plan, what it changed in an earlier one)``. A
    :class:`CompareError` naming every change once a run has started."""
    out = Path(spec.out).resolve()
    new, old = make_plan(spec), load_plan(out)
    diff = plan_changes(old, new) if old else []
    begun = started(out, old) if old else []
    if begun and diff:
        raise CompareError(f"compare plan: {len(begun)} run(s) have started ({', '.join(begun)}), so the plan in "
                           f"{out / PLAN} cannot change; this spec changes:\n  " + "\n  ".join(diff)
                           + "\nUndo these changes, or plan the new comparison in another out folder.")
    if old and not diff:
        return old, []
    for arm, seed in run_keys(new):
        path = input_file(out, arm, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(new["runs"][f"{arm}/seed{seed}"], sort_keys=False))
    (out / PLAN).write_text(json.dumps(new, indent=1))
    return new, diff


def current_plan(spec: Spec) -> dict:
    """The plan in ``spec.out``, refused where the spec differs from the one it was made from."""
    out = Path(spec.out).resolve()
    plan = load_plan(out)
    if plan is None:
        raise CompareError(f"compare: no plan in {out}: run `python -m evolrl compare plan` with this spec first")
    diff = changes(plan["spec"], spec.as_dict())
    if diff:
        raise CompareError(f"compare: the spec differs from the plan in {out / PLAN}:\n  " + "\n  ".join(diff)
                           + "\nRun `python -m evolrl compare plan` with it (refused once a run has started).")
    return plan
