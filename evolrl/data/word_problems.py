"""Short arithmetic stories the project generates: a task where a small model writes steps before its answer."""

from __future__ import annotations

import random

from evolrl.data.sources import PromptSource
from evolrl.settings import check_int, require
from evolrl.types import Prompt

NAMES = ("Sam", "Mia", "Leo", "Ava", "Ben", "Zoe", "Tom", "Eva")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "coins", "books", "shells")
GAINS = ("buys {n} more", "finds {n} more", "gets {n} more from a friend")
"""Steps that add ``n``: each reads "<name> <step>."."""
LOSSES = ("gives away {n}", "loses {n}", "uses {n}")
"""Steps that take ``n`` away; never more than the count at that point, so every answer is a count >= 0."""


class WordProblems(PromptSource):
    """``count`` stories of a start and ``steps`` additions or take-aways, numbers in ``[1, max_number]``.

    "Sam has 7 apples. Sam buys 5 more. Then Sam gives away 3. How many apples does Sam have now?" (answer 9).
    Each step adds or takes away with equal odds; a take-away is at most the count it applies to (a step that
    would have nothing to take adds instead), so the answer is always a whole count. Generated from ``seed``,
    so a data set is the same on every machine.

    Args:
        count: How many stories (>= 1).
        steps: Additions or take-aways after the start (>= 1).
        max_number: Largest number in a story (>= 1); the answer is at most ``(steps + 1) * max_number``.
        seed: Seed of the generator (>= 0).
        instruction: Appended to each question.
    """

    def __init__(
        self, count: int = 64, steps: int = 2, max_number: int = 9, seed: int = 0, instruction: str = "",
    ) -> None:
        check_int("WordProblems.count", count, 1)
        check_int("WordProblems.steps", steps, 1)
        check_int("WordProblems.max_number", max_number, 1)
        check_int("WordProblems.seed", seed, 0)
        require(isinstance(instruction, str), "WordProblems.instruction", instruction,
                allowed="a string (may be empty)")
        self.count = count
        self.steps = steps
        self.max_number = max_number
        self.seed = seed
        self.instruction = instruction
        """Appended to each question, e.g. "Put your final answer within \\boxed{}."."""

    def story(self, rng: random.Random) -> tuple[str, int]:
        """One story and its answer."""
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        total = rng.randint(min(2, self.max_number), self.max_number)  # "has 1 apples" reads badly
        sentences = [f"{name} has {total} {item}."]
        for i in range(self.steps):
            n = rng.randint(1, self.max_number)
            take = rng.random() < 0.5 and total >= 1
            n = min(n, total) if take else n
            total += -n if take else n
            step = rng.choice(LOSSES if take else GAINS).format(n=n)
            sentences.append(f"{'Then ' if i == self.steps - 1 and i else ''}{name} {step}.")
        sentences.append(f"How many {item} does {name} have now?")
        return " ".join(sentences), total

    def load(self) -> list[Prompt]:
        rng = random.Random(self.seed)
        prompts = []
        for i in range(self.count):
            question, answer = self.story(rng)
            prompts.append(Prompt(f"word-{i}", f"{question} {self.instruction}".strip(), answer=str(answer),
                                  source="word problems"))
        return prompts
