"""Rendering a question into the prompt the policy sees."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

PAPER_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
"""The system prompt of the paper (from SimpleRL-Zoo)."""


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str, system_prompt: str | None) -> list[int]:
    """Token ids of the chat-formatted prompt, generation prompt included.

    Uses the tokenizer's chat template (system message, then the question as the user
    message); without a template, a plain ``system:/user:/assistant:`` layout.
    """
    if tokenizer.chat_template:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": question}
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = (f"system: {system_prompt}\n" if system_prompt else "") + f"user: {question}\nassistant:"
    return tokenizer(text)["input_ids"]
