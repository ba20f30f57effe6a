"""``python -m tools.study.study probe``: the untrained model on candidate tasks, before any study run.

``--task addition``: every ``CANDIDATES`` task in one validate run per sampling; pass@1, pass@8, pass@16 and maj@16 at
the evaluation sampling, maj@16 at the training sampling (how often the majority label is right). ``--task word`` and
``--task chain``: each ``REASONING`` candidate, every response written (``EvalResponses``): pass@k and maj@16 at the
first sampling, at the last the vote's accuracy beside a constant guess, answered and closed shares, the median tokens
before the answer and the ways a majority answer is reached (``probe_responses.py``). A finished validate is not run
again: delete its folder under ``<out>/probe*`` to measure it anew.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tools.common import ROOT

DEMO = "configs/demo.yaml"
INSTRUCTION = "Put your final answer within \\boxed{}."
CANDIDATES = {
    "2 terms, 0-9": {"max_operand": 9},
    "2 terms, 0-19": {"max_operand": 19},
    "2 terms, 0-29": {"max_operand": 29},
    "2 terms, 0-99": {"max_operand": 99},
    "3 terms, 0-9": {"max_operand": 9, "terms": 3},
}
"""Candidate tasks for ``probe --task addition``: ``AdditionPrompts`` settings."""
SAMPLINGS = {"evaluation": (0.6, 0.95), "training": (0.7, 1.0)}
"""Sampling name -> (temperature, top-p): the held-out evaluation's and one training group's."""


def shown(question_numbers: tuple[int, ...], steps: str) -> dict:
    """A worked example of a chained sum written out as ``steps`` (an order of its own), then the answer marker."""
    total = sum(question_numbers)
    return {"question": f"What is {' + '.join(map(str, question_numbers))}?",
            "response": f"{steps} <answer>{total}</answer>"}


def worked(*numbers: int) -> dict:
    """A worked example of a chained sum: each step adds the next number, left to right."""
    totals = [sum(numbers[:i + 1]) for i in range(len(numbers))]
    return shown(numbers, " ".join(f"{t} + {n} = {t + n}." for t, n in zip(totals, numbers[1:])))


def tens_then_ones(a: int, b: int) -> dict:
    """A worked example of a two-term sum: add the second number's tens, then its ones."""
    tens = b - b % 10
    return shown((a, b), f"{a} + {tens} = {a + tens}. {a + tens} + {b % 10} = {a + b}.")


def _word(steps: int, max_number: int, system_prompt: str | None) -> dict:
    return {"source": {"class_path": "evolrl.data.WordProblems",
                       "init_args": {"steps": steps, "max_number": max_number, "instruction": "Think step by step."}},
            "data": {"prompt": {"system": system_prompt}}, "sampling": {"max_new_tokens": 192}}


def _chain(examples: list[dict], terms: int, max_operand: int, min_operand: int = 0, distinct: bool = False,
           distinct_numbers: bool = False) -> dict:
    return {"source": {"class_path": "evolrl.data.AdditionPrompts",
                       # the question alone: an instruction left empty here would keep the demo's (config merge)
                       "init_args": {"terms": terms, "max_operand": max_operand, "min_operand": min_operand,
                                     "instruction": "", **({"distinct": True} if distinct else {}),
                                     **({"distinct_numbers": True} if distinct_numbers else {})}},
            "data": {"prompt": {"system": None, "examples": examples, "max_tokens": 512}},  # the examples' turns
            "sampling": {"max_new_tokens": 64, "stop": ["</answer>"]}}


STEP_BY_STEP = "Solve the problem step by step. Then write the final answer as a number."
THREE = [worked(3, 8, 4), worked(7, 2, 9), worked(5, 6, 1), worked(9, 4, 7)]
ORDERS_3 = [shown((3, 8, 4), "3 + 8 = 11. 11 + 4 = 15."),  # left to right
            shown((7, 2, 9), "2 + 9 = 11. 11 + 7 = 18."),  # the last two first
            shown((5, 6, 1), "5 + 1 = 6. 6 + 6 = 12."),  # the first and the last first
            shown((4, 7, 9), "7 + 9 = 16. 16 + 4 = 20.")]  # the two largest first
ORDERS_4 = [shown((3, 8, 4, 6), "3 + 8 = 11. 11 + 4 = 15. 15 + 6 = 21."),  # left to right
            shown((7, 2, 9, 5), "7 + 2 = 9. 9 + 5 = 14. 9 + 14 = 23."),  # in pairs
            shown((5, 6, 1, 8), "1 + 8 = 9. 6 + 9 = 15. 5 + 15 = 20."),  # right to left
            shown((4, 9, 2, 7), "9 + 7 = 16. 16 + 4 = 20. 20 + 2 = 22.")]  # the largest first
DISJOINT_3 = [shown((3, 5, 2), "3 + 5 = 8. 8 + 2 = 10."),  # left to right
              shown((1, 6, 5), "6 + 5 = 11. 11 + 1 = 12."),  # the last two first
              shown((6, 1, 2), "6 + 2 = 8. 8 + 1 = 9."),  # the first and the last first
              shown((3, 4, 6), "4 + 6 = 10. 10 + 3 = 13.")]  # the two largest first
"""Study V's worked examples: multisets that neither candidate holds out (configs/study5.yaml keeps them out of
training)."""
REASONING = {
    "word": {
        "2 steps, 1-9, step-by-step system prompt": _word(2, 9, STEP_BY_STEP),
        "3 steps, 1-9, step-by-step system prompt": _word(3, 9, STEP_BY_STEP),
        "2 steps, 1-9, the model's system prompt": _word(2, 9, None),
        "2 steps, 1-20, step-by-step system prompt": _word(2, 20, STEP_BY_STEP),
    },
    "chain": {
        "3 terms, 0-9, one worked example": _chain(THREE[:1], terms=3, max_operand=9),
        "3 terms, 0-9, four worked examples": _chain(THREE, terms=3, max_operand=9),
        "4 terms, 0-9, four worked examples": _chain(
            [worked(3, 8, 4, 6), worked(7, 2, 9, 5), worked(5, 6, 1, 8), worked(9, 4, 7, 2)], terms=4, max_operand=9),
        "2 terms, 0-29, tens then ones, four worked examples": _chain(
            [tens_then_ones(17, 25), tens_then_ones(23, 14), tens_then_ones(8, 19), tens_then_ones(6, 27)],
            terms=2, max_operand=29),
        "3 terms, 10-29, four worked examples": _chain(
            [worked(12, 25, 17), worked(21, 14, 28), worked(16, 23, 11), worked(27, 19, 24)],
            terms=3, max_operand=29, min_operand=10),
        # The second round (docs/study.md): the same tasks, each example adding in an order of its own.
        "3 terms, 0-9, four worked examples in different orders": _chain(ORDERS_3, terms=3, max_operand=9),
        "4 terms, 0-9, four worked examples in different orders": _chain(ORDERS_4, terms=4, max_operand=9),
        # Study IV's first round (docs/study.md): no zero to state the answer early, distinct held-out problems.
        "3 terms, 1-5, four worked examples in different orders": _chain(
            [shown((3, 5, 4), "3 + 5 = 8. 8 + 4 = 12."), shown((2, 4, 5), "4 + 5 = 9. 9 + 2 = 11."),
             shown((5, 1, 3), "5 + 3 = 8. 8 + 1 = 9."), shown((1, 4, 3), "4 + 3 = 7. 7 + 1 = 8.")],
            terms=3, max_operand=5, min_operand=1, distinct=True),
        "3 terms, 1-9, four worked examples in different orders": _chain(
            ORDERS_3, terms=3, max_operand=9, min_operand=1, distinct=True),
        # Study V's first round (docs/study.md): one order of each held-out multiset, the examples in neither set.
        "3 terms, 1-6, one order per multiset, four worked examples in neither set": _chain(
            DISJOINT_3, terms=3, max_operand=6, min_operand=1, distinct_numbers=True),
        "3 terms, 1-7, one order per multiset, four worked examples in neither set": _chain(
            DISJOINT_3, terms=3, max_operand=7, min_operand=1, distinct_numbers=True),
    },
}
"""Candidate reasoning tasks of ``probe --task word|chain``: each a prompt source, data settings (the system prompt,
``None`` for the model's own, and worked examples shown as chat turns) and the sampling's length and stop strings.
The word problems are Study II's; the chained sums Study III's (docs/study.md)."""


def probe_overlay(out: Path, name: str, temperature: float, top_p: float, sets: list[dict] | None = None,
                  sampling: dict | None = None, **data) -> dict:
    """A validate run's overlay: ``sets`` (default: every addition candidate) at this sampling (``sampling``: its
    further settings, default 48 new tokens), 16 samples each, its pass@k and maj@16 table and (with ``data``:
    further data settings) every response written beside it."""
    if sets is None:
        sets = [{"class_path": "evolrl.data.EvalSet", "init_args": {"name": f"task{i}", "source": {
            "class_path": "evolrl.data.AdditionPrompts",
            "init_args": {"count": 32, "seed": 1, "instruction": INSTRUCTION, **settings}}}}
                for i, settings in enumerate(CANDIDATES.values())]
    callbacks = [{"class_path": "evolrl.callbacks.PassAtK", "init_args": {"pass_ks": [1, 8, 16], "maj_ks": [16]}}]
    if data:
        callbacks.append({"class_path": "evolrl.callbacks.EvalResponses"})
    return {
        "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": str(out), "name": name}},
                    "callbacks": callbacks},
        "data": {"eval_sets": sets, "eval_samples": 16,
                 "eval_sampling": {"temperature": temperature, "top_p": top_p,
                                   **({"max_new_tokens": 48} | (sampling or {}))},
                 **data},
    }


def validate(out: Path, name: str, overlay: dict, env: dict) -> Path:
    """``python -m evolrl validate`` on the demo's model with ``overlay``; the directory of its tables. A finished
    one (its ``val_metrics.json`` there) is not run again, so an interrupted probe goes on where it stopped."""
    done = list((out / name).rglob("val_metrics.json"))
    if done:
        return done[0].parent
    if (out / name).exists():
        shutil.rmtree(out / name)
    path = out / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(overlay))
    args = [sys.executable, "-m", "evolrl", "validate", "--config", DEMO, "--config", str(path)]
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        if subprocess.run(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode:
            sys.exit(f"probe ({name}) failed; see {out / f'{name}.log'}")
    print(f"{name}: {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    return next((out / name).rglob("val_metrics.json")).parent


def probe(a: argparse.Namespace) -> None:
    if a.task != "addition":
        return probe_reasoning(a)
    out = Path(a.out) / "probe"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    tables = {}
    for name, (temperature, top_p) in SAMPLINGS.items():
        directory = validate(out, name, overlay=probe_overlay(out, name, temperature=temperature, top_p=top_p), env=env)
        tables[name] = json.loads((directory / "val_metrics.json").read_text())
    print("| task | pass@1 | pass@8 | pass@16 | maj@16 | label accuracy (vote of 16 at T 0.7) |")
    print("|---|---|---|---|---|---|")
    for i, name in enumerate(CANDIDATES):
        e, t = tables["evaluation"][f"task{i}"], tables["training"][f"task{i}"]
        print(f"| {name} | {e['pass@1']:.3f} | {e['pass@8']:.3f} | {e['pass@16']:.3f} | {e['maj@16']:.3f} "
              f"| {t['maj@16']:.3f} |")
    print(f"\n32 held-out problems per task, 16 samples each (AdditionPrompts seed 1), {ROOT / DEMO}'s model")


def probe_reasoning(a: argparse.Namespace) -> None:
    """Each ``REASONING[a.task]`` candidate (or ``--candidates``) at each of ``--samplings``: one validate run each."""
    from evolrl.models import load_tokenizer
    from evolrl.compare.paired import read_rows
    from tools.study.probe_responses import response_measures

    candidates = REASONING[a.task]
    out = Path(a.out) / f"probe_{a.task}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    tokenizer = load_tokenizer(yaml.safe_load((ROOT / DEMO).read_text())["model"]["model"])
    indices = a.candidates if a.candidates else range(len(candidates))
    rows = []
    for i in indices:
        name = list(candidates)[i]
        task = candidates[name]
        source = {**task["source"], "init_args": {"count": a.problems, "seed": 1, **task["source"]["init_args"]}}
        sets = [{"class_path": "evolrl.data.EvalSet", "init_args": {"name": "task", "source": source}}]
        cells = {}
        for sampling in a.samplings:
            temperature, top_p = SAMPLINGS[sampling]
            overlay = probe_overlay(out, f"{a.task}{i}/{sampling}", temperature=temperature, top_p=top_p, sets=sets,
                                    sampling=task["sampling"], **task["data"],
                                    eval_prompts_per_batch=16)  # larger generate calls: more tokens/s on a CPU
            directory = validate(out, f"{a.task}{i}/{sampling}", overlay=overlay, env=env)
            table = json.loads((directory / "val_metrics.json").read_text())["task"]
            measures = response_measures(read_rows(next(directory.glob("val_responses_step*.jsonl"))), tokenizer)
            cells[sampling] = {**table, **measures}
        e, t = cells[a.samplings[0]], cells[a.samplings[-1]]
        rows.append(f"| {name} | {e['pass@1']:.3f} | {e['pass@16']:.3f} | {e['maj@16']:.3f} | {t['maj@16']:.3f} "
                    f"| {t['guess']:.3f} | {t['answered']:.2f} | {t['marked']:.2f} | {t['tokens before answer']:.0f} "
                    f"| {t['ways to majority']:.1f} | {t['2+ ways']:.2f} | {t['response tokens']:.0f} |")
    first, last = (f"T {SAMPLINGS[s][0]}, top-p {SAMPLINGS[s][1]}" for s in (a.samplings[0], a.samplings[-1]))
    print("| task | pass@1 | pass@16 | maj@16 | label accuracy (vote of 16) | guess (most frequent truth) | answered "
          "| marked | median tokens before the answer | ways to the majority answer | groups with 2+ ways "
          "| median response tokens |\n" + "|---" * 12 + "|")
    print("\n".join(rows))
    print(f"\n{a.problems} problems per task (seed 1), 16 samples each, {ROOT / DEMO}'s model; pass@k and maj@16 at "
          f"{first}, the rest at {last}")
