"""Validation and test steps: sample each evaluation problem's responses and grade them.

``PassAtK`` (evolrl.callbacks) turns the graded answers into pass@k and maj@k per evaluation set.
"""

from __future__ import annotations

from evolrl.data.datamodule import RolloutRequest
from evolrl.metrics.grading import grade


class EvaluationSteps:
    """Mixed into the LightningModule; uses its ``push_weights`` and ``_engine_loaded``."""

    def on_validation_start(self) -> None:
        if not self._engine_loaded:  # `validate`/`test` without `fit`
            self.push_weights(new_version=False)

    on_test_start = on_validation_start

    def validation_step(self, request: RolloutRequest, batch_idx: int, dataloader_idx: int = 0) -> dict:
        """``{dataset, answers, correct, rollouts}``; answers and correctness are ``[problems][n]``."""
        rollouts = request.sample()
        graded = [[grade(text, group.prompt.answer, request.grader) for text in group.texts]
                  for group in rollouts.groups]
        return {
            "dataset": request.dataset,
            "answers": [[a for a, _ in row] for row in graded],
            "correct": [[c for _, c in row] for row in graded],
            "rollouts": rollouts,
        }

    test_step = validation_step
