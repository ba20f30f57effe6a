"""Prompt sources the project generates itself: additions (the demo's task) and a training set kept apart from a
held-out one (:class:`Excluding`), by question or by the numbers a question holds (:func:`numbers_of`)."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from typing import Literal

from evolrl.data.sources import DataError, PromptSource
from evolrl.settings import check_int, require
from evolrl.types import Prompt

NUMBER = re.compile(r"\d+")


def numbers_of(question: str) -> tuple[int, ...]:
    """The multiset of numbers ``question`` writes (every run of digits, an instruction's included), sorted: "What is
    3 + 5 + 4?" and "What is 4 + 3 + 5?" give ``(3, 4, 5)``, the same problem in another order."""
    return tuple(sorted(int(n) for n in NUMBER.findall(question)))


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
        distinct_numbers: No two additions of the same numbers in any order (3 + 5 + 4 and 4 + 3 + 5): ``count``
            multisets of numbers, each as likely as any other, each written in one of its orders at random, so that
            no held-out problem is another one reordered and the multisets left over are a random share of them all.
            Implies ``distinct``.
    """

    def __init__(
        self, count: int = 64, max_operand: int = 9, seed: int = 0, instruction: str = "", terms: int = 2,
        min_operand: int = 0, distinct: bool = False, distinct_numbers: bool = False,
    ) -> None:
        check_int("AdditionPrompts.count", count, 1)
        check_int("AdditionPrompts.min_operand", min_operand, 0)
        check_int("AdditionPrompts.max_operand", max_operand, min_operand)
        check_int("AdditionPrompts.seed", seed, 0)
        check_int("AdditionPrompts.terms", terms, 2)
        require(isinstance(instruction, str), "AdditionPrompts.instruction", instruction,
                allowed="a string (may be empty)")
        require(isinstance(distinct, bool), "AdditionPrompts.distinct", distinct, allowed="true or false")
        require(isinstance(distinct_numbers, bool), "AdditionPrompts.distinct_numbers", distinct_numbers,
                allowed="true or false")
        values = max_operand - min_operand + 1
        possible = values ** terms
        require(not distinct or count <= possible, "AdditionPrompts.count", count,
                allowed=f"at most {possible} with distinct: true ({terms} numbers in [{min_operand}, {max_operand}])")
        multisets = math.comb(values + terms - 1, terms)
        require(not distinct_numbers or count <= multisets, "AdditionPrompts.count", count,
                allowed=f"at most {multisets} with distinct_numbers: true ({terms} numbers in [{min_operand}, "
                        f"{max_operand}] in any order)")
        self.count = count
        self.max_operand = max_operand
        self.min_operand = min_operand
        self.seed = seed
        self.instruction = instruction
        """Appended to each question, e.g. "Put your final answer within \\boxed{}."."""
        self.terms = terms
        self.distinct = distinct
        self.distinct_numbers = distinct_numbers

    def load(self) -> list[Prompt]:
        rng = random.Random(self.seed)
        prompts, seen = [], set()
        while len(prompts) < self.count:
            numbers = tuple(rng.randint(self.min_operand, self.max_operand) for _ in range(self.terms))
            # a multiset with m orders is drawn m times as often as one with a single order: kept with chance 1 / m
            if self.distinct_numbers and rng.random() * self.orders(numbers) >= 1:
                continue
            key = tuple(sorted(numbers)) if self.distinct_numbers else numbers
            if (self.distinct or self.distinct_numbers) and key in seen:
                continue
            seen.add(key)
            question = f"What is {' + '.join(map(str, numbers))}? {self.instruction}".strip()
            prompts.append(Prompt(f"add-{len(prompts)}", question, answer=str(sum(numbers)), source="addition"))
        return prompts

    def orders(self, numbers: tuple[int, ...]) -> int:
        """How many orders of ``numbers`` differ: 6 for 3 + 5 + 4, 3 for 3 + 3 + 4, 1 for 4 + 4 + 4."""
        return math.factorial(self.terms) // math.prod(math.factorial(c) for c in Counter(numbers).values())


class Excluding(PromptSource):
    """``source``'s prompts without those whose question ``exclude`` also asks: a training set that keeps a held-out
    set's problems out, whatever the two draw. Ids and order are ``source``'s.

    With ``match: numbers`` a prompt is kept out when its question holds the same numbers as a kept-out one, in any
    order (:func:`numbers_of`): "What is 4 + 3 + 5?" goes when "What is 3 + 5 + 4?" is held out, since it is the
    same sum. ``questions`` keeps further questions out, matched the same way: the worked examples shown in the
    prompt (``data.examples``), so that none of them is a training problem either.

    Args:
        source: The prompts to train on.
        exclude: The prompts kept out (e.g. the held-out evaluation set's source).
        match: ``question``: the same question text; ``numbers``: the same numbers in any order.
        questions: Further questions kept out (e.g. the worked examples'); ``null``: none.
    """

    def __init__(self, source: PromptSource, exclude: PromptSource,
                 match: Literal["question", "numbers"] = "question", questions: list[str] | None = None) -> None:
        for name, value in (("source", source), ("exclude", exclude)):
            require(isinstance(value, PromptSource), f"Excluding.{name}", value, allowed="a prompt source")
        require(match in ("question", "numbers"), "Excluding.match", match, allowed="question or numbers")
        require(questions is None or (isinstance(questions, (list, tuple))
                                      and all(isinstance(q, str) for q in questions)),
                "Excluding.questions", questions, allowed="a list of questions, or null")
        self.source, self.exclude = source, exclude
        self.match = match
        self.questions = list(questions or [])

    def key(self, question: str) -> str | tuple[int, ...]:
        """What two questions share when one keeps the other out: the text, or its numbers (``match``)."""
        return numbers_of(question) if self.match == "numbers" else question

    def load(self) -> list[Prompt]:
        kept_out = {self.key(q) for q in [p.question for p in self.exclude.load()] + self.questions}
        prompts = [p for p in self.source.load() if self.key(p.question) not in kept_out]
        if not prompts:
            raise DataError(f"Excluding: every prompt of {type(self.source).__name__} is also in "
                            f"{type(self.exclude).__name__} (the exclude set): nothing is left to train on")
        return prompts
