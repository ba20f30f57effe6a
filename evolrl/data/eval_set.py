"""A labelled evaluation set: prompts with ground truth, a name for the metrics, a grader."""

from __future__ import annotations

from evolrl.data.sources import DataError, PromptSource
from evolrl.metrics.grading import Grader, MathGrader
from evolrl.settings import require
from evolrl.types import Prompt, unanswered


class EvalSet:
    """A labelled evaluation set: its prompts, a name for the metrics, and how to grade it.

    Args:
        source: Where the problems come from (every prompt needs a ground-truth answer).
        name: Name in metric tags, e.g. ``math500`` -> ``val/math500/pass@1`` (non-empty, no ``/``).
        grader: How a response is graded, chosen by ``class_path``: ``evolrl.metrics.grading.MathGrader``
            (equivalent final answer; ``None`` means this one) or ``evolrl.metrics.grading.ChoiceGrader``
            (a letter, GPQA).
    """

    def __init__(self, source: PromptSource, name: str, grader: Grader | None = None) -> None:
        require(isinstance(source, PromptSource), "EvalSet.source", source,
                allowed="a prompt source (evolrl.data.PromptFile, HubDataset or AdditionPrompts)")
        require(isinstance(name, str) and bool(name.strip()) and "/" not in name, "EvalSet.name", name,
                allowed="a non-empty name without '/', e.g. 'math500'")
        require(grader is None or isinstance(grader, Grader), "EvalSet.grader", grader,
                allowed="an evolrl.metrics.grading.Grader (MathGrader, ChoiceGrader), or null for MathGrader")
        self.source = source
        self.name = name
        self.grader: Grader = grader if grader is not None else MathGrader()

    def load(self) -> list[Prompt]:
        prompts = self.source.load()
        missing = unanswered(prompts)
        if missing:
            raise DataError(f"evaluation set {self.name!r}: {missing}; evaluation needs ground truth (set "
                            "answer_field to the field that holds it)")
        return prompts
