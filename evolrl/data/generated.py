"""Prompt sources the project generates itself: additions (the demo's task) and a training set kept apart from a
held-out one (:class:`Excluding`)."""

from __future__ import annotations

import random

from evolrl.data.sources import DataError, PromptSource
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
        distinct: No addition twice (the same numbers in the same order): a held-out set of ``count`` problems.
    """

    def __init__(
        self, count: int = 64, max_operand: int = 9, seed: int = 0, instruction: str = "", terms: int = 2,
        min_operand: int = 0, distinct: bool = False,
    ) -> None:
        check_int("AdditionPrompts.count", count, 1)
        check_int("AdditionPrompts.min_operand", min_operand, 0)
        check_int("AdditionPrompts.max_operand", max_operand, min_operand)
        check_int("AdditionPrompts.seed", seed, 0)
        check_int("AdditionPrompts.terms", terms, 2)
        require(isinstance(instruction, str), "AdditionPrompts.instruction", instruction,
                allowed="a string (may be empty)")
        require(isinstance(distinct, bool), "AdditionPrompts.distinct", distinct, allowed="true or false")
        possible = (max_operand - min_operand + 1) ** terms
        require(not distinct or count <= possible, "AdditionPrompts.count", count,
                allowed=f"at most {possible} with distinct: true ({terms} numbers in [{min_operand}, {max_operand}])")
        self.count = count
        self.max_operand = max_operand
        self.min_operand = min_operand
        self.seed = seed
        self.instruction = instruction
        """Appended to each question, e.g. "Put your final answer within \\boxed{}."."""
        self.terms = terms
        self.distinct = distinct

    def load(self) -> list[Prompt]:
        rng = random.Random(self.seed)
        prompts, seen = [], set()
        while len(prompts) < self.count:
            numbers = tuple(rng.randint(self.min_operand, self.max_operand) for _ in range(self.terms))
            if self.distinct and numbers in seen:
                continue
            seen.add(numbers)
            question = f"What is {' + '.join(map(str, numbers))}? {self.instruction}".strip()
            prompts.append(Prompt(f"add-{len(prompts)}", question, answer=str(sum(numbers)), source="addition"))
        return prompts


class Excluding(PromptSource):
    """``source``'s prompts without those whose question ``exclude`` also asks: a training set that keeps a held-out
    set's problems out, whatever the two draw. Ids and order are ``source``'s.

    Args:
        source: The prompts to train on.
        exclude: The prompts kept out (e.g. the held-out evaluation set's source).
    """

    def __init__(self, source: PromptSource, exclude: PromptSource) -> None:
        for name, value in (("source", source), ("exclude", exclude)):
            require(isinstance(value, PromptSource), f"Excluding.{name}", value, allowed="a prompt source")
        self.source, self.exclude = source, exclude

    def load(self) -> list[Prompt]:
        kept_out = {p.question for p in self.exclude.load()}
        prompts = [p for p in self.source.load() if p.question not in kept_out]
        if not prompts:
            raise DataError(f"Excluding: every prompt of {type(self.source).__name__} is also in "
                            f"{type(self.exclude).__name__} (the exclude set): nothing is left to train on")
        return prompts
