"""``python -m tools.study.disjoint CONFIG [CONFIG ...]``: whether a study's held-out problems are kept apart from its
training problems and its worked examples, by their text and by their numbers (docs/study.md, Study V and Study IV's
addendum).

The configs are resolved as ``python -m evolrl fit`` composes them (its parser, in this process); the training source,
the held-out evaluation set's source and the worked examples (``data.prompt.examples``) are loaded from there. Two
questions with the same numbers in any order ("What is 3 + 5 + 4?", "What is 4 + 3 + 5?") are one problem: the same
sum, the same answer (``evolrl.data.numbers_of``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from evolrl.compare.resolve import resolve as resolve_run
from evolrl.compare.spec import CompareError, arm_args
from evolrl.data import numbers_of
from evolrl.types import Prompt


def resolve(configs: list[str]) -> dict:
    """The whole config ``python -m evolrl fit`` composes from ``configs``: files, and ``--key=value`` settings
    (parsed in this process by ``evolrl.compare.resolve``, as ``compare plan`` resolves an arm)."""
    try:
        return resolve_run(arm_args([], configs), "the configs")
    except CompareError as err:
        sys.exit(str(err))


def build(spec):
    """``spec`` with every ``{class_path, init_args}`` in it made the object it names."""
    if isinstance(spec, list):
        return [build(item) for item in spec]
    if not isinstance(spec, dict):
        return spec
    if "class_path" not in spec:
        return {key: build(value) for key, value in spec.items()}
    module, _, name = spec["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**build(spec.get("init_args") or {}))


def study_sets(configs: list[str], eval_set: str = "heldout") -> tuple[list[Prompt], list[Prompt], list[str]]:
    """``(held-out prompts, training prompts, the worked examples' questions)`` of the run ``configs`` compose."""
    data = resolve(configs)["data"]
    sets = {s["init_args"]["name"]: s["init_args"]["source"] for s in data["eval_sets"]}
    if eval_set not in sets:
        sys.exit(f"no evaluation set named {eval_set!r} (the configs name {', '.join(sets)})")
    return (build(sets[eval_set]).load(), build(data["train"]).load(),
            [example["question"] for example in (data.get("prompt") or {}).get("examples") or []])


def overlap(held_out: list[Prompt], training: list[Prompt], examples: list[str]) -> dict[str, int]:
    """The counts ``main`` prints: each set's size, by question and by numbers, and what the sets share."""
    train_questions = {p.question for p in training}
    train_numbers = {numbers_of(p.question) for p in training}
    held_questions = {p.question for p in held_out}
    held_numbers = {numbers_of(p.question) for p in held_out}
    return {
        "held-out problems": len(held_out),
        "held-out problems, distinct by numbers": len(held_numbers),
        "training prompts": len(training),
        "training problems, distinct by question": len(train_questions),
        "training problems, distinct by numbers": len(train_numbers),
        "held-out problems that are a training question": sum(p.question in train_questions for p in held_out),
        "held-out problems with a training problem's numbers": sum(
            numbers_of(p.question) in train_numbers for p in held_out),
        "worked examples": len(examples),
        "worked examples that are a held-out question": sum(q in held_questions for q in examples),
        "worked examples with a held-out problem's numbers": sum(numbers_of(q) in held_numbers for q in examples),
        "worked examples with a training problem's numbers": sum(numbers_of(q) in train_numbers for q in examples),
    }


def leaks(counts: dict[str, int]) -> list[str]:
    """What keeps ``overlap``'s sets from being disjoint by numbers: a held-out problem that is a training problem
    reordered, a worked example that is a held-out or a training problem, two held-out problems that are one sum."""
    found = [f"{name}: {counts[name]}" for name in ("held-out problems with a training problem's numbers",
                                                    "worked examples with a held-out problem's numbers",
                                                    "worked examples with a training problem's numbers")
             if counts[name]]
    if counts["held-out problems, distinct by numbers"] < counts["held-out problems"]:
        found.append(f"held-out problems, distinct by numbers: {counts['held-out problems, distinct by numbers']} "
                     f"of {counts['held-out problems']}")
    return found


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("configs", nargs="+", help="the run's configs, in fit's order")
    p.add_argument("--eval-set", default="heldout", help="the held-out evaluation set's name")
    a = p.parse_args(argv)
    counts = overlap(*study_sets(a.configs, a.eval_set))
    for name, count in counts.items():
        print(f"{name}: {count}")
    found = leaks(counts)
    print("disjoint by numbers: " + (f"no ({'; '.join(found)})" if found else "yes"))


if __name__ == "__main__":
    main()
