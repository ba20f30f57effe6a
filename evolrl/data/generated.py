"""Prompt sources the project generates itself, so a run needs no data files."""

from __future__ import annotations

import random

from evolrl.data.sources import PromptSource
from evolrl.settings import check_int, require
from evolrl.types import Prompt


class AdditionPrompts(PromptSource):
    """``count`` additions of two numbers in ``[0, max_operand]``, generated from ``seed``.

    The demo task: SmolLM2-135M solves single-digit sums about half the time, so majority
    voting has something to work with.

    Args:
        count: How many additions (>= 1).
        max_operand: Largest operand (>= 0); 9 gives single-digit sums.
        seed: Seed of the generator (>= 0).
        instruction: Appended to each question.
    """

    def __init__(
        self, count: int = 64, max_operand: int = 9, seed: int = 0, instruction: str = "",
    ) -> None:
        check_int("AdditionPrompts.count", count, 1)
        check_int("AdditionPrompts.max_operand", max_operand, 0)
        check_int("AdditionPrompts.seed", seed, 0)
        require(isinstance(instruction, str), "AdditionPrompts.instruction", instruction, "a string (may be empty)")
        self.count = count
        self.max_operand = max_operand
        self.seed = seed
        self.instruction = instruction
        """Appended to each question, e.g. "Put your final answer within \\boxed{}."."""

    def load(self) -> list[Prompt]:
        rng = random.Random(self.seed)
        prompts = []
        for i in range(self.count):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            question = f"What is {a} + {b}? {self.instruction}".strip()
            prompts.append(Prompt(f"add-{i}", question, str(a + b), "addition"))
        return prompts
