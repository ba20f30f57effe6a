"""Does an engine sample from the policy it was handed? Compare its log-probs with the policy's own."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from evolrl.logprobs.from_logits import logprobs_and_entropy
from evolrl.rollout.engine import RolloutEngine, Sampling
from evolrl.types import Prompt


@torch.no_grad()
def sampler_logprob_gap(engine: RolloutEngine, policy: nn.Module, prompts: Sequence[Prompt],
                        prompt_ids: Sequence[Sequence[int]], sampling: Sampling, n: int = 4, seed: int = 1) -> float:
    """Largest |log-prob the engine reports for a token it samples now - the policy's log-prob of it|.

    About 1e-6 when the engine holds the policy's current weights (float32 on both sides); a stale
    or wrongly loaded engine is off by orders of magnitude more. ``n`` responses per prompt, seeded with
    ``seed``. The policy's side is scored as the trainer scores it, under ``softmax(logits / temperature)``;
    without top-p/top-k, since an engine renormalizes its log-probs over the tokens those keep.
    """
    if sampling.top_p != 1.0 or sampling.top_k != -1:
        raise ValueError(f"sampler_logprob_gap compares untruncated distributions: top_p 1 and top_k -1, got "
                         f"top_p {sampling.top_p}, top_k {sampling.top_k}")
    device = next(policy.parameters()).device
    gaps = []
    for group in engine.generate(prompts, prompt_ids, sampling=sampling, n=n, seed=seed):
        if not group.sampler_logprobs:
            raise ValueError(f"{type(engine).__name__} does not report the log-probs of the tokens it samples")
        for response, reported in zip(group.response_ids, group.sampler_logprobs):
            tokens = torch.tensor([list(group.prompt_ids) + list(response)], device=device)
            logits = policy(input_ids=tokens).logits[:, :-1]
            logp, _ = logprobs_and_entropy(logits, tokens[:, 1:], sampling.temperature)
            mine = logp[0, len(group.prompt_ids) - 1 :].cpu()
            gaps.append((mine - torch.tensor(reported)).abs().max().item())
    return max(gaps)
