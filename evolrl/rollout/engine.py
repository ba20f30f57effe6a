"""The rollout-engine interface: sample response groups, take new weights.

An engine is colocated with training: after every training step the module
hands it the updated policy (``load_weights``), and ``version`` counts those
hand-overs so that stale rollouts can be detected.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn
from transformers import PreTrainedTokenizerBase

from evolrl.types import Prompt, ResponseGroup


@dataclass(frozen=True)
class Sampling:
    """How responses are sampled."""

    n: int = 64
    """Responses per prompt (the vote samples V)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 turns top-k off."""
    max_new_tokens: int = 12288
    seed: int = 0


END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>")


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, eos_token_id: int | list[int] | None = None) -> list[int]:
    """Every end-of-turn token the tokenizer defines (e.g. both ``<|im_end|>`` and ``<|endoftext|>``)."""
    ids = set()
    for value in (tokenizer.eos_token_id, eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in END_OF_TURN_TOKENS if token in vocab)
    return sorted(ids)


def build_group(
    prompt: Prompt,
    prompt_ids: Sequence[int],
    responses: Sequence[Sequence[int]],
    stops: Sequence[int],
    max_new_tokens: int,
    tokenizer: PreTrainedTokenizerBase,
    logprobs: Sequence[Sequence[float]] | None = None,
) -> ResponseGroup:
    """A :class:`ResponseGroup` from sampled ids: cut after the first stop token, decode, flag truncation."""
    cut = []
    for ids in responses:
        ids = list(ids)
        end = next((i for i, t in enumerate(ids) if t in stops), None)
        cut.append(tuple(ids if end is None else ids[: end + 1]))
    kept_logprobs = tuple(tuple(lp[: len(ids)]) for lp, ids in zip(logprobs, cut)) if logprobs else ()
    return ResponseGroup(
        prompt=prompt,
        texts=tuple(tokenizer.batch_decode(cut, skip_special_tokens=True)),
        truncated=tuple(not ids or (ids[-1] not in stops and len(ids) >= max_new_tokens) for ids in cut),
        prompt_ids=tuple(prompt_ids),
        response_ids=tuple(cut),
        sampler_logprobs=kept_logprobs,
    )


class RolloutEngine(ABC):
    """Samples response groups with the latest policy weights."""

    def __init__(self) -> None:
        self.version = -1
        """Version of the weights the engine samples with (set by ``load_weights``); -1 before the first."""
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.max_sequences: int | None = None
        """Most sequences one ``generate`` call holds at once (prompts x n), when the data module says."""
        self.max_tokens: int | None = None
        """Longest prompt + response, when the data module says."""
        self.stream = 0
        """This process's random stream (its data-parallel rank), so that ranks draw different samples."""

    def setup(self, tokenizer: PreTrainedTokenizerBase, max_sequences: int | None = None,
              max_tokens: int | None = None, stream: int = 0) -> None:
        """Called once by the data module with the policy's tokenizer, the largest call it will make and its rank."""
        self.tokenizer = tokenizer
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.stream = stream

    @abstractmethod
    def generate(
        self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], sampling: Sampling
    ) -> list[ResponseGroup]:
        """``sampling.n`` responses for each prompt, in prompt order."""

    @abstractmethod
    def _load(self, policy: nn.Module) -> None:
        """Make the engine sample from ``policy``'s current weights."""

    def load_weights(self, policy: nn.Module, version: int | None = None) -> None:
        """Hand the engine the policy's current weights (no files written) as ``version`` (default: the next)."""
        self._load(policy)
        self.version = self.version + 1 if version is None else version

    def seed_for(self, sampling: Sampling) -> int:
        """The seed of a ``generate`` call: a function of the weights version (so a resumed run samples alike)
        and of the stream (so ranks differ)."""
        return sampling.seed + 7919 * (self.version + 1) + 1_000_003 * self.stream

    def stops(self, policy_eos: int | list[int] | None = None) -> list[int]:
        if self.tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}.setup(tokenizer) was not called")
        return stop_token_ids(self.tokenizer, policy_eos)
