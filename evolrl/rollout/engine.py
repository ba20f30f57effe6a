"""The rollout-engine interface: sample response groups, take new weights.

An engine is colocated with training: after every training step the module
hands it the updated policy (``load_weights``), and ``version`` counts those
hand-overs so that stale rollouts can be detected.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from evolrl.settings import check_float, check_int, require
from evolrl.types import Prompt, ResponseGroup


@dataclass(frozen=True)
class Sampling:
    """How responses are sampled (the same four numbers for vLLM and Hugging Face ``generate``)."""

    temperature: float = 1.0
    """Softmax temperature; the policy loss scores tokens under the training temperature too."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability."""
    top_k: int = -1
    """Keep the k likeliest tokens; -1 turns top-k off."""
    max_new_tokens: int = 12288
    """Longest response, in tokens."""
    stop: tuple[str, ...] = ()
    """Strings that end a response, kept in it (e.g. ``["</answer>"]``), besides the end-of-turn tokens."""

    def __post_init__(self) -> None:
        check_float("Sampling.temperature", self.temperature, 0.0, low_open=True)
        check_float("Sampling.top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        require(self.top_k == -1 or (isinstance(self.top_k, int) and self.top_k >= 1), "Sampling.top_k", self.top_k,
                allowed="-1 (off) or an integer >= 1")
        check_int("Sampling.max_new_tokens", self.max_new_tokens, 1)
        require(isinstance(self.stop, (tuple, list)) and all(isinstance(t, str) and t for t in self.stop),
                "Sampling.stop", self.stop, allowed="a list of non-empty strings")
        object.__setattr__(self, "stop", tuple(self.stop))


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's dynamic sampling (Yu et al. 2025): a group whose trained rewards all agree trains nothing, so it is
    dropped and further prompts are sampled until the step has its number of groups."""

    max_rounds: int = 3
    """Sampling rounds per step at most, the first included; then the step trains on the groups it kept."""

    def __post_init__(self) -> None:
        check_int("DynamicSampling.max_rounds", self.max_rounds, 1)


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
    stop_strings: Sequence[str] = (),
) -> ResponseGroup:
    """A :class:`ResponseGroup` from sampled ids: cut after the first stop token, or after the token that completes
    the first of ``stop_strings`` (kept), decode, flag truncation. Both engines sample up to their stop and this cut
    makes their responses end alike (vLLM's token ids run to the token completing the string; ``generate`` pads)."""
    cut, stopped = [], []
    for ids in responses:
        ids = list(ids)
        end = next((i for i, t in enumerate(ids) if t in stops), None)
        ids = ids if end is None else ids[: end + 1]
        at = _stop_string_end(ids, stop_strings, tokenizer)
        cut.append(tuple(ids[:at] if at else ids))
        stopped.append(at is not None)
    kept_logprobs = tuple(tuple(lp[: len(ids)]) for lp, ids in zip(logprobs, cut)) if logprobs else ()
    return ResponseGroup(
        prompt=prompt,
        texts=tuple(tokenizer.batch_decode(cut, skip_special_tokens=True)),
        truncated=tuple(not ids or (ids[-1] not in stops and not hit and len(ids) >= max_new_tokens)
                        for ids, hit in zip(cut, stopped)),
        prompt_ids=tuple(prompt_ids),
        response_ids=tuple(cut),
        sampler_logprobs=kept_logprobs,
    )


def _stop_string_end(ids: list[int], stop_strings: Sequence[str], tokenizer: PreTrainedTokenizerBase) -> int | None:
    """How many of ``ids`` it takes to write the first of ``stop_strings`` whole; ``None`` when none is written.
    A longer prefix writes whatever a shorter one wrote, so a bisection finds it in log2(len) decodes."""
    def written(k: int) -> bool:
        return any(t in tokenizer.decode(ids[:k], skip_special_tokens=True) for t in stop_strings)

    if not stop_strings or not written(len(ids)):
        return None
    return bisect.bisect_left(range(len(ids) + 1), True, key=written)


class RolloutEngine(ABC):
    """Samples response groups with the latest policy weights.

    The engine is told its limits and its seed once (:meth:`setup`, by :class:`~evolrl.rollout.Rollouts`),
    takes weights with :meth:`load_weights` and samples with :meth:`generate`; it derives no seeds itself.
    """

    reports_logprobs = False
    """Whether ``generate`` fills ``ResponseGroup.sampler_logprobs`` (the log-prob of each sampled token under
    ``softmax(logits / temperature)``): the update's mismatch diagnostics and correction need them."""

    def __init__(self) -> None:
        self.version = -1
        """Version of the weights the engine samples with (set by ``load_weights``); -1 before the first."""
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.max_sequences: int | None = None
        """Most sequences one ``generate`` call holds at once (prompts x n), when known."""
        self.max_tokens: int | None = None
        """Longest prompt + response, when known."""
        self.seed = 0
        """The engine's own seed (``Seeds.engine``: differs per rank)."""

    def setup(self, tokenizer: PreTrainedTokenizerBase, max_sequences: int | None = None,
              max_tokens: int | None = None, seed: int = 0) -> None:
        """Called once, before the first weights, with the policy's tokenizer, the largest call and the seed."""
        self.tokenizer = tokenizer
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.seed = seed

    @abstractmethod
    def generate(self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], sampling: Sampling,
                 n: int, seed: int) -> list[ResponseGroup]:
        """``n`` responses for each prompt, in prompt order; ``seed`` seeds this call where the engine can."""

    @abstractmethod
    def _load(self, policy: nn.Module) -> None:
        """Make the engine sample from ``policy``'s current weights."""

    def load_weights(self, policy: nn.Module, version: int | None = None) -> None:
        """Hand the engine the policy's current weights (no files written) as ``version`` (default: the next)."""
        self._load(policy)
        self.version = self.version + 1 if version is None else version

    def weights_dtype(self, policy: nn.Module) -> torch.dtype:
        """The dtype the weights are sent to a sampler process in: the policy's, so that a copy samples as the policy
        itself would, unless the engine has a dtype of its own."""
        return next(policy.parameters()).dtype

    def load_stream(self, like: nn.Module, tensors: Iterator[tuple[str, torch.Tensor]], version: int) -> None:
        """Take weights as a stream of named full tensors (a sampler process's, ``evolrl/rollout/remote``) as
        ``version``: here into ``like``, the policy's architecture, materialized by the first stream, then
        :meth:`load_weights`. An engine that can take the stream itself overrides this."""
        state = dict(like.state_dict())
        with torch.no_grad():
            for name, tensor in tensors:
                if name not in state:
                    raise KeyError(f"weight {name!r} is not a parameter of {type(like).__name__}")
                if state[name].is_meta:
                    like.load_state_dict({name: tensor.clone()}, strict=False, assign=True)
                else:
                    state[name].copy_(tensor)
        left = [n for n, p in like.named_parameters() if p.is_meta]
        if left:
            raise RuntimeError(f"the weight stream left {len(left)} parameters unset, e.g. {left[0]!r}")
        self.load_weights(like, version=version)

    def stops(self, policy_eos: int | list[int] | None = None) -> list[int]:
        if self.tokenizer is None:
            raise RuntimeError(f"{type(self).__name__}.setup(tokenizer) was not called")
        return stop_token_ids(self.tokenizer, policy_eos)
