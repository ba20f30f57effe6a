"""Reading a final answer out of a response, and the validity rule.

Pure string functions. The answer of a response is the content of its *last*
``\\boxed{...}`` (brace-matched), looked for in the text after the first
``</think>`` when there is one; without a box the last number in that text is
the fallback (switchable off). Validity follows the paper's appendix A.3: a
boxed answer containing a digit, with two looser rules for non-numeric tasks.
"""

from __future__ import annotations

import re
from typing import Literal

ValidRule = Literal["digit", "nonempty", "any"]
VALID_RULES: tuple[str, ...] = ("digit", "nonempty", "any")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")


def final_part(text: str) -> str:
    """The part of a response that holds its final answer: after the first ``</think>``, or all of it."""
    head, sep, tail = text.partition("</think>")
    return tail if sep else head


def _box_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every complete box command, in order of appearance."""
    spans = []
    for command in _BOX_COMMANDS:
        for match in re.finditer(re.escape(command) + r"(?![A-Za-z])", text):
            i = match.end()
            while i < len(text) and text[i] == " ":
                i += 1
            if i < len(text) and text[i] == "{":
                depth, j = 0, i
                while j < len(text):
                    depth += {"{": 1, "}": -1}.get(text[j], 0)
                    if depth == 0:
                        spans.append((match.start(), j + 1, text[i + 1 : j]))
                        break
                    j += 1
            elif i > match.end():  # "\boxed 5": one token after a space
                token = re.match(r"[^\s$]+", text[i:])
                if token:
                    spans.append((match.start(), i + token.end(), token.group().rstrip(".")))
    return sorted(spans)


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{}``/``\\fbox{}`` in ``text``; ``None`` if there is none.

    A box left unclosed (a truncated response) does not count.
    """
    spans = _box_spans(text)
    return spans[-1][2] if spans else None


def strip_last_boxed(text: str) -> str:
    """``text`` without its last complete box: the reasoning, for novelty on reasoning only."""
    spans = _box_spans(text)
    if not spans:
        return text
    start, end, _ = spans[-1]
    return text[:start] + text[end:]


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (``1,000``, ``-3.5``, ``.5``), or ``None``."""
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def extract_answer(text: str, number_fallback: bool = True) -> str | None:
    """The final answer of a response: last box content (stripped), else the last number if allowed."""
    part = final_part(text)
    boxed = last_boxed(part)
    if boxed is not None:
        return boxed.strip()
    return last_number(part) if number_fallback else None


def is_valid_response(text: str, rule: ValidRule = "digit", number_fallback: bool = False) -> bool:
    """Whether a response counts for the vote and the novelty reward.

    ``digit`` (the paper's rule): a boxed answer containing a digit. ``nonempty``:
    any non-empty boxed answer (for π, intervals, text, letters). ``any``: every
    response is valid. With ``number_fallback`` a bare last number counts as a
    boxed answer, for models that never write ``\\boxed{}``.
    """
    if rule not in VALID_RULES:
        raise ValueError(f"unknown validity rule {rule!r}; choose one of {', '.join(VALID_RULES)}")
    if rule == "any":
        return True
    answer = extract_answer(text, number_fallback=number_fallback)
    if answer is None:
        return False
    if rule == "digit":
        return any(ch.isdigit() for ch in answer)
    return answer != ""


_CHOICE_IN_BOX = re.compile(r"^\(?([A-Za-z])\)?(?:[\s.:)]|$)")
_CHOICE_IN_TEXT = re.compile(r"answer\s*(?:is|:)?\s*:?\s*\(?\b([A-Z])\b\)?", re.IGNORECASE)
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")


def extract_choice(text: str, choices: str = "ABCD", text_fallback: bool = True) -> str | None:
    """A multiple-choice letter (GPQA style), upper-cased, or ``None``.

    Taken from the last box (``\\boxed{B}``, ``\\boxed{(b)}``, ``\\boxed{\\text{C. 42}}``). Without a
    box, and if ``text_fallback``, from an explicit "answer is (C)" / "Answer: C" phrase, where only a
    capital letter counts, so the article "a" is never read as choice A.
    """
    part = final_part(text)
    boxed = last_boxed(part)
    if boxed is not None:
        content = _TEXT_WRAPPERS.sub(r"\1", boxed).strip()
        match = _CHOICE_IN_BOX.match(content)
        letter = match.group(1).upper() if match else None
        return letter if letter is not None and letter in choices else None
    if not text_fallback:
        return None
    letters = [
        m.group(1)
        for m in _CHOICE_IN_TEXT.finditer(part)
        if m.group(1).isupper() and m.group(1) in choices
    ]
    return letters[-1] if letters else None
