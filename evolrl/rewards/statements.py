"""Where a response first states the answer it is graded on: the place novelty stops reading (``until_answer``) and
after which any text is trailing text.

Whatever the reading rules chose (a last box, the last number, the first result), text after the first statement
restates or adds to the answer: "15 + 21 = 36 So, 15 + 21 = 36." states 36 at "= 36", and the restatement read at its
last number must not be paid as novelty.
"""

from __future__ import annotations

import re

from evolrl.rewards.answers import NUMBER_TEXT, AnswerSpan, answer_boxes, answer_offset

# A statement of a result: a number after "=", "is", "equals", "results in" or an answer marker ("answer:", "the
# answer is", "<answer>"), or opening the response ("19 So, indeed, 9 + 11 = 19."), with a few words that only qualify
# the verb in between ("is equal to 36", "is actually 44", "is calculated to be 26"), that no operator continues.
# "0 + 36 = 36" states 36 once, at its end: the first 36 is an operand.
_QUALIFIERS = (r"(?:\s+(?:equal|to|actually|indeed|exactly|just|simply|now|therefore|calculated|be|the|final|result"
               r"|sum|total))*")
STATED = re.compile(r"(?:^\s*|=|\b(?:is|equals|answer|results\s+in)\b" + _QUALIFIERS
                    + r"[\s:]*(?:is\b)?|<answer>)[\s$*:]*(" + NUMBER_TEXT + r")(?!\d|[.,]\d)(?!\s*[-+*/^×÷])", re.IGNORECASE)
"""A statement of a result; group 1 is the number stated."""


def first_statement(text: str, span: AnswerSpan) -> AnswerSpan:
    """Where ``text`` first states the answer read at ``span`` as a result: a box holding it, or the number after
    ``=``, "is", "equals" or an answer marker; ``span`` itself when nothing before it does. Whatever the reading rules
    chose (a last box, the last number, the first result), text after this point restates or adds to the answer."""
    offset = answer_offset(text)
    part = text[offset:]
    stated = [(s, e, c) for s, e, c in answer_boxes(part)] + [(m.start(1), m.end(1), m.group(1))
                                                              for m in STATED.finditer(part)]
    for start, end, said in sorted(stated):
        if offset + start > span.start:
            break
        if _same(said, span.answer):
            return AnswerSpan(span.answer, offset + start, offset + end)
    return span


def _same(said: str, answer: str) -> bool:
    """Whether a statement's content is the answer: equal as written (stripped), or as numbers (``1,000`` = 1000)."""
    said, answer = said.strip(), answer.strip()
    if said == answer:
        return True
    try:
        return float(said.replace(",", "")) == float(answer.replace(",", ""))
    except ValueError:
        return False
