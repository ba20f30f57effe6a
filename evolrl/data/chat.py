"""Rendering a question into the prompt the policy sees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning.pytorch.utilities import rank_zero_warn
from transformers import PreTrainedTokenizerBase

from evolrl.settings import check_int, require
from evolrl.types import Prompt

PAPER_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
"""The system prompt of the paper (from SimpleRL-Zoo)."""


@dataclass(frozen=True)
class Example:
    """A worked example shown before every question: a user turn and the assistant's answer to it.

    A small model follows a response format it has seen answered in the chat far more often than one it was only
    told about (docs/study.md, Study III's probe), so few-shot examples are chat turns, not prompt text.
    """

    question: str
    """The example's user turn, e.g. "What is 3 + 8 + 4?"."""
    response: str
    """The assistant's answer to it, e.g. "3 + 8 = 11. 11 + 4 = 15. <answer>15</answer>"."""

    def __post_init__(self) -> None:
        for field in ("question", "response"):
            value = getattr(self, field)
            require(isinstance(value, str) and value.strip() != "", f"Example.{field}", value,
                    allowed="a non-empty string")


@dataclass(frozen=True)
class PromptFormat:
    """How a question becomes the prompt the policy reads, in training and evaluation alike (``data.prompt``)."""

    system: str | None = PAPER_SYSTEM_PROMPT
    """System message; ``null`` for none (the model's own default, where its chat template has one)."""
    examples: tuple[Example, ...] | None = ()
    """Worked examples shown as chat turns before every question (few-shot); empty or ``null``: none."""
    max_tokens: int = 1024
    """Longer prompts are dropped (and counted in a warning), never truncated."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "examples", tuple(self.examples or ()))
        require(all(isinstance(e, Example) for e in self.examples), "data.prompt.examples", self.examples,
                allowed="a list of {question: ..., response: ...}")
        check_int("data.prompt.max_tokens", self.max_tokens, 1)

    def render(self, tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
        """:func:`render_prompt` of ``question`` in this format."""
        return render_prompt(tokenizer, question, self.system, self.examples)


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str, system_prompt: str | None,
                  examples: Sequence[Example] = ()) -> list[int]:
    """Token ids of the chat-formatted prompt, generation prompt included.

    Uses the tokenizer's chat template (system message, each example's user and assistant turns, then the question
    as the user message); without a template, a plain ``system:/user:/assistant:`` layout of the same turns.
    """
    turns = [(role, text) for e in examples for role, text in (("user", e.question), ("assistant", e.response))]
    turns.append(("user", question))
    if tokenizer.chat_template:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": role, "content": text} for role, text in turns
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = (f"system: {system_prompt}\n" if system_prompt else "") + "".join(f"{r}: {t}\n" for r, t in turns)
    return tokenizer(text + "assistant:")["input_ids"]


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], form: PromptFormat,
                   what: str) -> tuple[list[tuple[Prompt, tuple[int, ...]]], int]:
    """Prompts rendered in ``form`` and tokenized, those within its ``max_tokens``, and how many were dropped (with a
    warning naming ``what``): a longer prompt is dropped, never truncated."""
    encoded = [(p, tuple(form.render(tokenizer, p.question))) for p in prompts]
    kept = [(p, ids) for p, ids in encoded if len(ids) <= form.max_tokens]
    dropped = len(encoded) - len(kept)
    if dropped:
        rank_zero_warn(f"{what}: dropped {dropped} of {len(encoded)} prompts longer than "
                       f"data.prompt.max_tokens={form.max_tokens}")
    return kept, dropped
