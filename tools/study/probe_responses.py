"""What ``tools.study.study probe`` reads from the evaluation responses a validate run wrote (``EvalResponses``).

pass@k and maj@k come from ``PassAtK``'s table; these are the measures that need the texts: how many tokens a
response writes before its final answer (is there reasoning for novelty to act on?), in how many different ways a
problem's majority answer is reached (the text novelty reads up to the answer: one way leaves novelty nothing to
tell apart), how many responses close an answer box or marker, and the share a constant guess would get right (the
most frequent true answer), the floor a majority label has to beat.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter

from evolrl.rewards import AnswerRules
from evolrl.rewards.answers import answer_boxes, final_part, last_boxed, strip_last_boxed
from evolrl.rewards.statements import first_statement


def answer_start(text: str, number_fallback: bool = True) -> int | None:
    """Where the final answer ``AnswerRules(number_fallback=...)`` reads begins in ``text``: its last box, else its last number (with
    ``number_fallback``); ``None`` when it reads none."""
    part = final_part(text)
    offset = len(text) - len(part)  # the answer is read after the first </think>
    if last_boxed(part) is not None:  # the box starts where the text without it first differs
        return offset + len(os.path.commonprefix([part, strip_last_boxed(part)]))
    span = AnswerRules(number_fallback=number_fallback).read(part)
    answer = None if span is None else span.answer
    # No digit follows the last number, so the last occurrence of its text is where it starts.
    return None if answer is None else offset + part.rfind(answer)


def tokens_before_answer(text: str, tokenizer) -> int | None:
    """Tokens of ``text`` before its final answer (the tokenizer's count of that prefix); ``None`` without one."""
    start = answer_start(text)
    if start is None:
        return None
    return len(tokenizer(text[:start], add_special_tokens=False)["input_ids"])


def ways_to_majority(texts: list[str]) -> int | None:
    """How many different texts (stripped) a group's responses that give its most frequent answer write before they
    first state it (what ``until_answer`` novelty embeds); ``None`` when fewer than two give it."""
    spans = [(t, AnswerRules(number_fallback=True).read(t)) for t in texts]
    answers = Counter(s.answer for _, s in spans if s is not None)
    if not answers or answers.most_common(1)[0][1] < 2:
        return None
    majority = answers.most_common(1)[0][0]
    return len({t[:first_statement(t, s).start].strip() for t, s in spans if s is not None and s.answer == majority})


def response_measures(rows: list[dict], tokenizer) -> dict[str, float]:
    """``guess``: share of problems whose truth is the most frequent truth; ``answered``: share of responses with an
    answer; ``marked``: share whose answer is in a box or an answer marker; ``tokens before answer``: median over the
    answered responses; ``ways to majority``: mean of :func:`ways_to_majority` over the problems it counts; ``2+
    ways``: share of all problems whose majority answer is reached in two ways or more;
    ``response tokens``: median length."""
    truths = Counter(row["truth"] for row in rows)
    responses = [r for row in rows for r in row["responses"]]
    before = [n for n in (tokens_before_answer(r["text"], tokenizer) for r in responses) if n is not None]
    lengths = [len(r["tokens"]) for r in responses if r["tokens"] is not None]
    ways = [n for row in rows if (n := ways_to_majority([r["text"] for r in row["responses"]]))]
    return {
        "guess": truths.most_common(1)[0][1] / len(rows) if rows else float("nan"),
        "answered": len(before) / len(responses) if responses else float("nan"),
        "marked": sum(bool(answer_boxes(final_part(r["text"]))) for r in responses) / len(responses)
        if responses else float("nan"),
        "tokens before answer": statistics.median(before) if before else float("nan"),
        "ways to majority": statistics.mean(ways) if ways else float("nan"),
        "2+ ways": sum(n >= 2 for n in ways) / len(rows) if rows else float("nan"),  # of all groups
        "response tokens": statistics.median(lengths) if lengths else float("nan"),
    }
