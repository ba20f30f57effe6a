"""``python -m tools.study.study leak``: Study II's restatement leak, recomputed from its run records (docs/study.md).

Reads the responses the until-the-answer arm's runs logged (``SampleLogger``: four a step, TensorBoard's text tab)
over the last ``--tail`` steps, and for each response where it first states a result (the first number after ``=``,
"is", "equals" or an answer marker, ``evolrl/rewards/statements.py``): the share with a letter or digit after that
statement, and of those the share ending on a number (read by the last-number rule up to there, so embedded and paid
as novelty before the leak was closed) and ending in words; the share of bare answers (nothing after it). Beside
them, the run's training curves over the same steps: mean novelty (and over the first steps), the share of groups
whose rewards all agree, the majority label's accuracy.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.rewards.answers import WORD
from evolrl.rewards.statements import STATED
from tools.common import read_scalars

SAMPLES = "train/samples/text_summary"
_CELL = re.compile(r"(?<!\\)\|")


def logged_responses(run: Path, tail: int) -> list[str]:
    """The responses ``run`` logged over its last ``tail`` logged steps."""
    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    tables = events.Tensors(SAMPLES)[-tail:]
    responses = []
    for table in tables:
        for line in table.tensor_proto.string_val[0].decode().splitlines()[2:]:  # past the header and its rule
            cells = [c.strip().replace("\\|", "|") for c in _CELL.split(line.strip().strip("|"))]
            responses.append("|".join(cells[1:-2]))  # prompt | response | answer | reward
    return responses


def after_first_statement(text: str) -> str | None:
    """The text after the first result a response states; ``None`` when it states none."""
    stated = STATED.search(text)
    return None if stated is None else text[stated.end(1):]


def leak_figures(run: Path, tail: int = 10) -> dict[str, float]:
    """The shares of module docstring over ``run``'s last ``tail`` steps, and its curves there."""
    rests = [after_first_statement(t) for t in logged_responses(run, tail)]
    stating = [r for r in rests if r is not None]
    trailing = [r for r in stating if WORD.search(r)]
    ends_number = [r for r in trailing if re.search(r"\d[\s.!?$*)]*$", r)]
    scalars = read_scalars(run)

    def mean(tag: str, first: bool = False) -> float:
        values = [v for _, v in scalars.get(tag, [])]
        values = values[:tail] if first else values[-tail:]
        return statistics.mean(values) if values else float("nan")

    n = len(rests)
    return {"responses": n, "stating a result": len(stating) / n, "text after it": len(trailing) / n,
            "ending on a number": len(ends_number) / n, "ending in words": (len(trailing) - len(ends_number)) / n,
            "bare": (len(stating) - len(trailing)) / n, "novelty first": mean("train/novelty_mean", first=True),
            "novelty last": mean("train/novelty_mean"), "groups agreeing": mean("train/zero_variance_groups"),
            "label accuracy": mean("train/label_accuracy")}


def report(out: Path, arm: str, tail: int) -> str:
    rows = []
    for run in sorted((out / arm).glob("seed*/done.json")):
        f = leak_figures(run.parent, tail)
        rows.append(f"| {run.parent.name} | {f['responses']} | {f['text after it']:.0%} | {f['ending on a number']:.0%} "
                    f"| {f['ending in words']:.0%} | {f['bare']:.0%} | {f['novelty first']:.3f} -> "
                    f"{f['novelty last']:.3f} | {f['groups agreeing']:.1%} | {f['label accuracy']:.2f} |")
    head = (f"| run | responses logged (last {tail} steps) | text after the first stated result | of all: ending on a "
            f"number | ending in words | bare answers | novelty, first -> last {tail} steps | groups whose rewards "
            f"all agree | label accuracy |\n" + "|---" * 9 + "|")
    return head + "\n" + "\n".join(rows)
