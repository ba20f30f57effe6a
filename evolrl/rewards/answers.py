"""Reading a final answer out of a response, where it was read, and the validity rule.

Pure string functions. The answer of a response is the content of its *last* non-empty
``\\boxed{...}`` (brace-matched) or ``<answer>...</answer>`` marker, looked for in the text after the first ``</think>``
when there is one;
without one, a number is the fallback (switchable off): by default the last number, or with
``fallback_rule="first_result"`` the result of the first equation. :func:`read_answer` says where the
answer was read (:class:`AnswerSpan`); everything that needs the answer's place (the text before it for
novelty, trailing text after it) takes that span, so it cannot disagree with the answer voted on.
Validity follows the paper's appendix A.3: a boxed answer containing a digit, with two looser rules for
non-numeric tasks.

Why ``first_result``: a one-line answer ("9 + 11 = 20") followed by generated text ("Your final answer
is 10.") is read by the last-number rule as 10, so trailing text can cast the vote. The first equation's
result ("= N" with N not followed by an operator, so "= 10 + 10 = 20" reads 20) is what such a response
states. In a reasoning trace the first equation is an intermediate step and the last number is usually the
answer, hence ``last_number`` stays the default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ValidRule = Literal["digit", "nonempty", "any"]
VALID_RULES: tuple[str, ...] = ("digit", "nonempty", "any")
FallbackRule = Literal["last_number", "first_result"]
FALLBACK_RULES: tuple[str, ...] = ("last_number", "first_result")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_MARKER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NUMBER_TEXT = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"
_NUMBER = re.compile(NUMBER_TEXT)
# "= N" where N is a whole number (no digit may follow, so the match cannot stop inside one) that no operator
# continues: the result of an equation, not the start of another expression ("= 10 + 10 = 20" reads 20).
_RESULT = re.compile(r"=[\s$*]*(" + NUMBER_TEXT + r")(?!\d|[.,]\d)(?!\s*[-+*/^×÷])")
WORD = re.compile(r"[^\W_]")  # a letter or digit: what makes text after the answer "trailing text"
_CLOSING = re.compile(r"\s*</\w+>")


@dataclass(frozen=True)
class AnswerSpan:
    """Where a response's final answer was read: ``response[start:end]`` is the box command (``\\boxed{20}``)
    or the number; ``answer`` is what was read there (the box content stripped, or the number)."""

    answer: str
    start: int
    end: int


def final_part(text: str) -> str:
    """The part of a response that holds its final answer: after the first ``</think>``, or all of it."""
    head, sep, tail = text.partition("</think>")
    return tail if sep else head


def _box_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every complete box command and ``<answer>...</answer>`` marker, in order of
    appearance (a marker is read as a box is)."""
    spans = [(m.start(), m.end(), m.group(1)) for m in _MARKER.finditer(text)]
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


def answer_boxes(text: str) -> list[tuple[int, int, str]]:
    """The boxes that hold an answer: an empty ``\\boxed{}`` (often the instruction echoed) holds none, so it
    neither hides an earlier box nor blocks the number fallback."""
    return [span for span in _box_spans(text) if span[2].strip()]


def last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{}``/``\\fbox{}`` in ``text``; ``None`` if there is none.

    A box left unclosed (a truncated response) does not count.
    """
    spans = answer_boxes(text)
    return spans[-1][2] if spans else None


def strip_last_boxed(text: str) -> str:
    """``text`` without its last non-empty box (text after it stays)."""
    spans = answer_boxes(text)
    if not spans:
        return text
    start, end, _ = spans[-1]
    return text[:start] + text[end:]


def _fallback_number(text: str, rule: FallbackRule) -> re.Match | None:
    """The match of the number the fallback reads: see the module docstring."""
    if rule == "first_result":
        result = _RESULT.search(text)
        if result is not None:
            return result
    elif rule != "last_number":
        raise ValueError(f"unknown fallback rule {rule!r}; choose one of {', '.join(FALLBACK_RULES)}")
    numbers = list(_NUMBER.finditer(text))
    return numbers[-1] if numbers else None


def answer_offset(text: str) -> int:
    """Where :func:`final_part` starts in ``text``."""
    return len(text) - len(final_part(text))


def read_answer(text: str, number_fallback: bool, fallback_rule: FallbackRule) -> AnswerSpan | None:
    """The final answer of a response and where it was read; ``None`` without one.

    The last non-empty box of :func:`final_part` (its content stripped); without one, if ``number_fallback``, the
    number ``fallback_rule`` picks there (``last_number`` or ``first_result``, module docstring).
    """
    offset = answer_offset(text)
    part = text[offset:]
    boxes = answer_boxes(part)
    if boxes:
        start, end, content = boxes[-1]
        return AnswerSpan(content.strip(), offset + start, offset + end)
    if not number_fallback:
        return None
    number = _fallback_number(part, fallback_rule)
    if number is None:
        return None
    group = number.lastindex or 0  # first_result's match holds the number in group 1
    return AnswerSpan(number.group(group), offset + number.start(group), offset + number.end(group))


def has_trailing_text(text: str, span: AnswerSpan | None, graded: AnswerSpan | None = None) -> bool:
    """Whether a letter or digit follows the answer stated at ``span`` (whitespace, punctuation, closing math
    delimiters such as ``.`` or ``$`` and a closing tag such as ``</answer>`` do not count), apart from the box or
    marker ``graded`` that holds the answer read ("= 80. <answer>80</answer>" has none); ``False`` without one."""
    if span is None:
        return False
    rest = text[span.end :]
    if graded is not None and graded.start >= span.end:
        rest = text[span.end : graded.start] + text[graded.end :]
    closing = _CLOSING.match(rest)  # the answer marker's own closing tag is not more text
    return WORD.search(rest, closing.end() if closing else 0) is not None


def is_valid_answer(answer: str | None, rule: ValidRule) -> bool:
    """Whether a read answer (``None``: none) makes its response valid under ``rule``
    (:class:`~evolrl.rewards.AnswerRules`' ``valid_rule``)."""
    if rule not in VALID_RULES:
        raise ValueError(f"unknown validity rule {rule!r}; choose one of {', '.join(VALID_RULES)}")
    if rule == "any":
        return True
    if answer is None:
        return False
    if rule == "digit":
        return any(ch.isdigit() for ch in answer)
    return answer != ""


_CHOICE_IN_BOX = re.compile(r"^\(?([A-Za-z])\)?(?:[\s.:)]|$)")
_CHOICE_IN_TEXT = re.compile(r"answer\s*(?:is|:)?\s*:?\s*\(?\b([A-Z])\b\)?", re.IGNORECASE)
_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")


def extract_choice(text: str, choices: str, text_fallback: bool) -> str | None:
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
