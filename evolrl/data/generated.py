"""Prompt sources the project generates itself, so a run needs no data files."""

from __future__ import annotations

import random

from evolrl.data.sources import PromptSource
from evolrl.settings import check_int, require
from evolrl.types import Prompt


class AdditionPrompts(PromptSource):
    """``count`` additions of ``terms`` numbers in ``[min_operand, max_operand]``, generated from ``seed``.

    The demo task: SmolLM2-135M solves single-digit sums of two numbers about half the time, so
    majority voting has something to work with.

    Args:
        count: How many additions (>= 1).
        max_operand: Largest operand (>= min_operand); 9 gives single-digit operands.
        seed: Seed of the generator (>= 0).
        instruction: Appended to each question.
        terms: Numbers per addition (>= 2): "What is 3 + 5 + 8?".
        min_operand: Smallest operand (>= 0); 10 with ``max_operand`` 99 gives two-digit operands.
    """

    def __init__(
        self, count: int = 64, max_operand: int = 9, seed: int = 0, instruction: str = "", terms: int = 2,
        min_operand: int = 0,
    ) -> None:
        check_int("AdditionPrompts.count", count, 1)
        check_int("AdditionPrompts.min_operand", min_operand, 0)
        check_int("AdditionPrompts.max_operand", max_operand, min_operand)
        check_int("AdditionPrompts.seed", seed, 0)
        check_int("AdditionPrompts.terms", terms, 2)
        require(isinstance(instruction, str), "AdditionPrompts.instruction", instruction,
                allowed="a string (may be empty)")
        self.count = count
        self.max_operand = max_operand
        self.min_operand = min_operand
        self.seed = seed
        self.instruction = instruction
        """Appended to each question, e.g. "Put your final answer within \\boxed{}."."""
        self.terms = terms

    def load(self) -> list[Prompt]:
        rng = random.Random(self.seed)
        prompts = []
        for i in range(self.count):
            numbers = [rng.randint(self.min_operand, self.max_operand) for _ in range(self.terms)]
            question = f"What is {' + '.join(map(str, numbers))}? {self.instruction}".strip()
            prompts.append(Prompt(f"add-{i}", question, answer=str(sum(numbers)), source="addition"))
        return prompts
