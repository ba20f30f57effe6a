"""Rollouts with Hugging Face ``generate`` on the policy itself: no copy, no vLLM needed.

With ``report_logprobs`` the engine does the sampling warps itself (transformers' own temperature, top-k and top-p
warpers, in ``generate``'s order) inside one logits processor, which keeps each sampled token's log-prob under the
warped distribution, as vLLM's ``processed_logprobs``: one ``[sequences, vocabulary]`` tensor in flight instead of
``output_scores``' one per generated token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from evolrl.distributed import world_size
from evolrl.rollout.engine import RolloutEngine, Sampling, build_group
from evolrl.settings import check_int, require
from evolrl.types import Prompt, ResponseGroup


class HFEngine(RolloutEngine):
    """Samples with ``model.generate`` on the training policy (so weight sync is free).

    Args:
        prompts_per_call: Prompts per ``generate`` call (each expands to ``n`` sequences).
        report_logprobs: Report each sampled token's log-prob (``processed_logprobs``, as vLLM): needed to train
            off-policy (``data.max_staleness``) or to weigh the mismatch; false: none, as the sampler is the policy.
    """

    def __init__(self, prompts_per_call: int = 8, report_logprobs: bool = False) -> None:
        super().__init__()
        check_int("HFEngine.prompts_per_call", prompts_per_call, 1)
        require(isinstance(report_logprobs, bool), "HFEngine.report_logprobs", report_logprobs,
                allowed="true or false")
        self.prompts_per_call = prompts_per_call
        self.reports_logprobs = report_logprobs
        self.model: nn.Module | None = None

    def _load(self, policy: nn.Module) -> None:
        self.model = policy

    @torch.no_grad()
    def generate(self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], sampling: Sampling,
                 n: int, seed: int) -> list[ResponseGroup]:
        if self.model is None:
            raise RuntimeError("HFEngine.generate before load_weights: the engine has no policy yet")
        model, tokenizer = self.model, self.tokenizer
        stops = self.stops(getattr(model.generation_config, "eos_token_id", None))
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        groups = []
        try:
            # Seeded per call (Seeds.sampling): reproducible (and resumable) without touching the global RNG.
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(seed)
                for start in range(0, len(prompts), self.prompts_per_call):
                    chunk = list(prompt_ids[start : start + self.prompts_per_call])
                    width = max(len(ids) for ids in chunk)
                    pad = tokenizer.pad_token_id
                    input_ids = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in chunk], device=device)
                    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk], device=device)
                    recorder = SampledLogprobs(sampling) if self.reports_logprobs else None
                    warps = (dict(temperature=1.0, top_p=1.0, top_k=0, logits_processor=[recorder]) if recorder else
                             dict(temperature=sampling.temperature, top_p=sampling.top_p,
                                  top_k=max(sampling.top_k, 0)))  # 0: no top-k filter
                    out = model.generate(
                        input_ids=input_ids,
                        attention_mask=attention,
                        do_sample=True,
                        **warps,
                        max_new_tokens=sampling.max_new_tokens,
                        num_return_sequences=n,
                        eos_token_id=stops,
                        stop_strings=list(sampling.stop) or None,
                        tokenizer=tokenizer if sampling.stop else None,  # generate needs it for stop strings
                        pad_token_id=pad,
                        synced_gpus=world_size() > 1,  # sharded (FSDP) ranks must forward in lockstep
                    )
                    logprobs = recorder.finish(out).tolist() if recorder else None
                    out = out[:, width:].tolist()  # [len(chunk) * n, new tokens], prompt-major
                    for i, ids in enumerate(chunk):
                        rows = slice(i * n, (i + 1) * n)
                        groups.append(
                            build_group(prompts[start + i], ids, responses=out[rows], stops=stops,
                                        max_new_tokens=sampling.max_new_tokens, tokenizer=tokenizer,
                                        stop_strings=sampling.stop, logprobs=logprobs[rows] if logprobs else None)
                        )
        finally:
            model.train(was_training)
        return groups


class SampledLogprobs(LogitsProcessor):
    """``generate``'s sampling warps, applied here, and the log-prob of each token sampled from the warped scores.

    Called once per new token with the sequences so far: the last token of each is the one drawn from the scores this
    processor returned the call before, so its log-prob is gathered then; :meth:`finish` gathers the last one's.
    """

    def __init__(self, sampling: Sampling) -> None:
        self.warpers = [TemperatureLogitsWarper(sampling.temperature)]
        if sampling.top_k > 0:
            self.warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(sampling.top_p))
        self.previous: torch.Tensor | None = None  # [sequences, vocabulary] log-probs of the last warped scores
        self.taken: list[torch.Tensor] = []  # [sequences] per generated token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather(input_ids)
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _gather(self, sequences: torch.Tensor) -> None:
        if self.previous is not None:
            self.taken.append(self.previous.gather(1, sequences[:, -1:]).squeeze(1))
            self.previous = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[sequences, generated tokens]`` log-probs (a finished sequence's padding positions hold any value)."""
        self._gather(sequences)
        return torch.stack(self.taken, dim=1).cpu()
