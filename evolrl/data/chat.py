"""Rendering a question into the prompt the policy sees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning.pytorch.utilities import rank_zero_warn
from transformers import PreTrainedTokenizerBase

from evolrl.settings import require
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


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt], system_prompt: str | None,
                   examples: Sequence[Example], max_tokens: int,
                   what: str) -> tuple[list[tuple[Prompt, tuple[int, ...]]], int]:
    """Rendered, tokenized prompts within ``max_tokens``, and how many were dropped (with a warning naming
    ``what``): a longer prompt is dropped, never truncated."""
    encoded = [(p, tuple(render_prompt(tokenizer, p.question, system_prompt, examples))) for p in prompts]
    kept = [(p, ids) for p, ids in encoded if len(ids) <= max_tokens]
    dropped = len(encoded) - len(kept)
    if dropped:
        rank_zero_warn(f"{what}: dropped {dropped} of {len(encoded)} prompts longer than "
                       f"max_prompt_tokens={max_tokens}")
    return kept, dropped
