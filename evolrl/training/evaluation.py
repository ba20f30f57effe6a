"""An evaluation batch: sample each problem's responses and grade them.

``PassAtK`` (evolrl.callbacks) turns the graded answers into pass@k and maj@k per evaluation set.
"""

from __future__ import annotations

from typing import Any

from evolrl.types import EvalOutput, RolloutBatch


def grade_request(request: Any, rollouts: RolloutBatch) -> EvalOutput:
    """A validation/test batch's ``rollouts`` graded by the grader of its ``request``'s evaluation set (answers,
    correctness ``[problems][n]``)."""
    if request.eval_set is None:
        raise ValueError("grade_request needs an evaluation batch (a request with its eval_set)")
    grader = request.eval_set.grader
    graded = [[grader(text, group.prompt.answer) for text in group.texts] for group in rollouts.groups]
    return EvalOutput(dataset=request.eval_set.name, answers=[[a for a, _ in row] for row in graded],
                      correct=[[c for _, c in row] for row in graded], rollouts=rollouts)
