"""Whether a step's rewards differ within any group (else every advantage is 0), counted over the run (the counts
are kept in checkpoints)."""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor


class FlatRewardCheck:
    """Warns when no group of a step has reward variance: every advantage is 0 (not NaN), only KL/entropy act."""

    def __init__(self) -> None:
        self.steps_seen = 0
        self.steps_without_variance = 0

    def __call__(self, advantages: Tensor) -> None:
        """Count the step whose ``[P, G]`` advantages these are; warn, with the rate so far, when all are 0."""
        self.steps_seen += 1
        if bool((advantages == 0).all()):
            self.steps_without_variance += 1
            rank_zero_warn(
                f"training step {self.steps_seen - 1}: all {advantages.shape[0]} groups have equal rewards "
                f"(e.g. every response invalid or identical), so every advantage is 0; "
                f"{self.steps_without_variance} of {self.steps_seen} steps so far had no reward variance"
            )

    def state_dict(self) -> dict[str, int]:
        return {"steps_seen": self.steps_seen, "steps_without_variance": self.steps_without_variance}

    def load_state_dict(self, state: dict) -> None:
        self.steps_seen = state["steps_seen"]
        self.steps_without_variance = state["steps_without_variance"]
