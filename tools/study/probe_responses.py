"""What ``tools.study.study probe`` reads from the evaluation responses a validate run wrote (``EvalResponses``).

pass@k and maj@k come from ``PassAtK``'s table; these are the measures that need the texts: how many tokens a
response writes before its final answer (is there reasoning for novelty to act on?), and the share a constant guess
would get right (the most frequent true answer), the floor a majority label has to beat.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter
from pathlib import Path

from evolrl.rewards.answers import extract_answer, final_part, last_boxed, strip_last_boxed


def answer_start(text: str, number_fallback: bool = True) -> int | None:
    """Where the final answer ``extract_answer`` reads begins in ``text``: its last box, else its last number (with
    ``number_fallback``); ``None`` when it reads none."""
    part = final_part(text)
    offset = len(text) - len(part)  # the answer is read after the first </think>
    if last_boxed(part) is not None:  # the box starts where the text without it first differs
        return offset + len(os.path.commonprefix([part, strip_last_boxed(part)]))
    answer = extract_answer(part, number_fallback=number_fallback)
    # No digit follows the last number, so the last occurrence of its text is where it starts.
    return None if answer is None else offset + part.rfind(answer)


def tokens_before_answer(text: str, tokenizer, number_fallback: bool = True) -> int | None:
    """Tokens of ``text`` before its final answer (the tokenizer's count of that prefix); ``None`` without one."""
    start = answer_start(text, number_fallback)
    if start is None:
        return None
    return len(tokenizer(text[:start], add_special_tokens=False)["input_ids"])


def read_rows(path: Path) -> list[dict]:
    """The problems of one ``EvalResponses`` file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def response_measures(rows: list[dict], tokenizer, number_fallback: bool = True) -> dict[str, float]:
    """``guess``: share of problems whose truth is the most frequent truth; ``answered``: share of responses with an
    answer; ``tokens before answer``: median over the answered responses; ``response tokens``: median length."""
    truths = Counter(row["truth"] for row in rows)
    responses = [r for row in rows for r in row["responses"]]
    before = [n for n in (tokens_before_answer(r["text"], tokenizer, number_fallback) for r in responses)
              if n is not None]
    lengths = [len(r["tokens"]) for r in responses if r["tokens"] is not None]
    return {
        "guess": truths.most_common(1)[0][1] / len(rows) if rows else float("nan"),
        "answered": len(before) / len(responses) if responses else float("nan"),
        "tokens before answer": statistics.median(before) if before else float("nan"),
        "response tokens": statistics.median(lengths) if lengths else float("nan"),
    }
