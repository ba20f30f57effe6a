"""``python -m tools.study.study5 --out DIR``: Study V's readings that ``compare report`` does not make
(docs/study.md, Study V), from the runs of the ``compare`` plan in ``DIR``.

- The pilots' two readings: has TTRL *collapsed* (mean ``train/entropy`` over its last 10 steps at most 0.4 times
  that over its first 10), has an EVOL-RL arm *broken down* (held-out pass@1 at its last evaluation below half its
  value at step 0).
- The verdict's precondition (TTRL collapsed in at least 3 of 4 seeds), each EVOL-RL arm's verdict from the primary
  (``compare report``'s paired interval, recomputed here with the same functions), and the secondaries: entropy and
  novelty over the last 10 steps against TTRL's, held-out pass@1 against TTRL's with the same interval.
- Reported outside the rule: the floor arm against the paper's arm, each arm's novelty spread, maj@16, response length
  and collapse step, and every run's pass@16.

Only runs ``compare report`` accepts (finished, configured as planned) are read.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from evolrl.compare.curves import mean_sd, read_scalars, table
from evolrl.compare.paired import outcome
from evolrl.compare.plan import load_plan, run_dir
from evolrl.compare.report import paired, run_states

WINDOW = 10
"""Training steps at each end of a run that the collapse and the secondaries read."""
COLLAPSED = 0.4
"""TTRL has collapsed when its last steps' mean entropy is at most this share of its first steps'."""
BROKEN = 0.5
"""An EVOL-RL arm has broken down when its last held-out pass@1 is below this share of its step-0 value."""
SECONDARY_RATIO = 1.5
"""The secondaries' entropy and novelty: an EVOL-RL arm's at least this many times TTRL's."""
PASS1_MARGIN = 0.05
"""The secondary on held-out pass@1: an EVOL-RL arm at most this far below TTRL."""
FLOOR_AGAINST = ("evol", "evol_floor")
"""``configs/study5_compare.yaml``'s paper arm and floor arm, compared outside the rule."""


def ends(curve: list[tuple[int, float]]) -> tuple[float, float]:
    """The mean of a training curve over its first and its last ``WINDOW`` steps."""
    values = [v for _, v in sorted(curve)]
    if len(values) < 2 * WINDOW:
        raise ValueError(f"{len(values)} training steps, fewer than {2 * WINDOW}")
    return statistics.fmean(values[:WINDOW]), statistics.fmean(values[-WINDOW:])


def run_readings(run: Path, eval_set: str) -> dict[str, float]:
    """One run's numbers: the entropy at each end, the novelty and its spread and length over the last steps, the
    held-out metrics at step 0 and at the last evaluation, and the collapse step (NaN where it never fired)."""
    scalars = read_scalars(run)
    first, last = ends(scalars["train/entropy"])
    held = {name: dict(scalars[f"val/{eval_set}/{name}"]) for name in ("pass@1", "pass@16", "maj@16")}
    steps = sorted(held["pass@1"])
    numbers = {"entropy_first": first, "entropy_last": last, "entropy_ratio": last / first,
               "pass@1_start": held["pass@1"][steps[0]], "last_eval": steps[-1],
               **{f"{name}_last": values[steps[-1]] for name, values in held.items()},
               "collapse_step": scalars["collapse/step"][0][1] if scalars.get("collapse/step") else math.nan}
    for tag in ("novelty_mean", "novelty_spread_mean", "response_length"):
        numbers[tag] = ends(scalars[f"train/{tag}"])[1] if f"train/{tag}" in scalars else math.nan
    return numbers


def has_collapsed(reading: dict) -> bool:
    """TTRL's reading: its last steps' mean entropy at most ``COLLAPSED`` times its first steps'."""
    return reading["entropy_ratio"] <= COLLAPSED


def has_broken_down(reading: dict) -> bool:
    """An EVOL-RL arm's reading: its last held-out pass@1 below ``BROKEN`` times its step-0 value."""
    return reading["pass@1_last"] < BROKEN * reading["pass@1_start"]


def verdict(precondition: bool, shown: bool, high: float) -> str:
    """The rule's word for one arm; "worse" only beside it, where the interval's upper end lies below 0."""
    word = "inconclusive at this scale" if not precondition else "shown" if shown else "not shown"
    return word + ("; worse than TTRL (upper end below 0)" if high < 0 else "")


def pilot_lines(readings: dict[str, dict[int, dict]], baseline: str) -> list[str]:
    """Each pilot's reading and what it says under the rule."""
    rows = []
    for arm, seeds in readings.items():
        for seed, r in seeds.items():
            if arm == baseline:
                said = "collapsed" if has_collapsed(r) else "not collapsed"
            else:
                said = "broken down" if has_broken_down(r) else "held"
            rows.append([arm, seed, f"{r['entropy_first']:.3f}", f"{r['entropy_last']:.3f}",
                         f"{r['entropy_ratio']:.2f}", f"{r['pass@1_start']:.3f}", f"{r['pass@1_last']:.3f}",
                         f"{r['pass@16_last']:.3f}", said])
    return table(["arm", "seed", f"entropy, first {WINDOW}", f"entropy, last {WINDOW}", "last / first",
                  "pass@1 step 0", "pass@1 last", "pass@16 last", "reading"], rows)


def verdict_lines(out: Path, plan: dict, readings: dict[str, dict[int, dict]]) -> list[str]:
    """The precondition, each EVOL-RL arm's verdict and secondaries, and what is reported outside the rule."""
    base, rule = plan["rule"]["baseline"], plan["rule"]
    collapsed = [s for s, r in readings[base].items() if has_collapsed(r)]
    needed = math.ceil(0.75 * len(plan["seeds"]))
    holds = len(collapsed) >= needed
    lines = [f"Precondition: TTRL collapsed in {len(collapsed)} of {len(readings[base])} seeds ({collapsed}); "
             f"needed {needed} of {len(plan['seeds'])}: {'holds' if holds else 'fails'}.", ""]
    rows, secondary = [], []

    def tail_mean(arm: str, key: str, seeds: list[int]) -> float:
        return statistics.fmean(readings[arm][s][key] for s in seeds)

    for arm in plan["arms"]:
        if arm == base:
            continue
        seeds = [s for s in plan["seeds"] if s in readings[arm] and s in readings[base]]
        if not seeds:
            rows.append([arm, 0, "-", "-", "no seed finished in both arms"])
            continue
        gap, low, high = paired(plan, out, arm, base, seeds, rule["metric"])[2]
        shown = outcome(gap, low, high, rule["direction"], rule["threshold"])
        rows.append([arm, len(seeds), f"{gap:+.3f}", f"({low:+.3f}, {high:+.3f})", verdict(holds, shown, high)])
        entropy = tail_mean(arm, "entropy_last", seeds) / tail_mean(base, "entropy_last", seeds)
        novelty = tail_mean(arm, "novelty_mean", seeds) / tail_mean(base, "novelty_mean", seeds)
        p_gap, p_low, p_high = paired(plan, out, arm, base, seeds, "pass@1")[2]
        secondary.append([arm, f"{entropy:.2f} ({'met' if entropy >= SECONDARY_RATIO else 'not met'})",
                          f"{novelty:.2f} ({'met' if novelty >= SECONDARY_RATIO else 'not met'})",
                          f"{p_gap:+.3f} ({p_low:+.3f}, {p_high:+.3f}) "
                          f"({'met' if p_gap >= -PASS1_MARGIN else 'not met'})"])
    lines += table([f"arm - {base}", "seeds", f"mean {rule['metric']}", f"{rule['confidence']:.0%} interval",
                    "verdict"], rows)
    lines += ["", "Secondaries (each arm / TTRL over the last 10 steps; held-out pass@1, arm - TTRL):", ""]
    lines += table(["arm", "entropy ratio (>= 1.5)", "novelty ratio (>= 1.5)", "pass@1 gap (>= -0.05)"], secondary)
    paper, floor = FLOOR_AGAINST
    seeds = [s for s in plan["seeds"] if s in readings.get(floor, {}) and s in readings.get(paper, {})]
    if seeds:
        gap, low, high = paired(plan, out, floor, paper, seeds, rule["metric"])[2]
        lines += ["", f"Outside the rule: {floor} - {paper}, paired {rule['metric']}: {gap:+.3f} "
                      f"({low:+.3f}, {high:+.3f})."]
    return lines


def arm_lines(readings: dict[str, dict[int, dict]]) -> list[str]:
    """Per arm, mean +- sd over its seeds of what is reported outside the rule, and each seed's pass@16."""
    keys = ("pass@16_last", "maj@16_last", "pass@1_last", "entropy_last", "novelty_mean", "novelty_spread_mean",
            "response_length", "collapse_step")
    digits = {"collapse_step": 0, "response_length": 1}
    rows = [[arm, len(seeds), *(mean_sd([r[k] for r in seeds.values()], digits.get(k, 3)) for k in keys),
             ", ".join(f"{s}: {r['pass@16_last']:.3f}" for s, r in seeds.items())]
            for arm, seeds in readings.items()]
    return table(["arm", "seeds", "pass@16", "maj@16", "pass@1", f"entropy, last {WINDOW}", "novelty",
                  "novelty spread", "length", "collapse step", "pass@16 by seed"], rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.study.study5", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="the compare plan's folder (results/study5[_pilot])")
    p.add_argument("--pilots", action="store_true", help="the pilots' readings only (no verdict)")
    a = p.parse_args(argv)
    plan = load_plan(a.out)
    if plan is None:
        sys.exit(f"no compare plan in {a.out} (python -m evolrl compare plan writes one)")
    states = run_states(plan, a.out)
    readings = {arm: {seed: run_readings(run_dir(a.out, arm, seed), plan["eval_set"])
                      for (arm_, seed), (state, _) in states.items() if arm_ == arm and state == "finished"}
                for arm in plan["arms"]}
    left = [f"{arm} seed {seed}: {state}" for (arm, seed), (state, _) in states.items() if state != "finished"]
    lines = [f"# Study V readings: {a.out} (plan at commit {plan['commit']})", ""]
    if left:
        lines += ["Not read: " + "; ".join(left), ""]
    lines += [*pilot_lines(readings, plan["rule"]["baseline"]), "", *arm_lines(readings)]
    if not a.pilots:
        lines += ["", *verdict_lines(a.out, plan, readings)]
    text = "\n".join(lines) + "\n"
    (a.out / "study5.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
