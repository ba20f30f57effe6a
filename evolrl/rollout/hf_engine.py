"""Rollouts with Hugging Face ``generate`` on the policy itself: no copy, no vLLM needed."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from evolrl.distributed import world_size
from evolrl.rollout.engine import RolloutEngine, Sampling, build_group
from evolrl.settings import check_int
from evolrl.types import Prompt, ResponseGroup


class HFEngine(RolloutEngine):
    """Samples with ``model.generate`` on the training policy (so weight sync is free). Reports no sampler log-probs:
    the sampler is the policy itself, so there is no mismatch to correct.

    Args:
        prompts_per_call: Prompts per ``generate`` call (each expands to ``n`` sequences).
    """

    def __init__(self, prompts_per_call: int = 8) -> None:
        super().__init__()
        check_int("HFEngine.prompts_per_call", prompts_per_call, 1)
        self.prompts_per_call = prompts_per_call
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
                    out = model.generate(
                        input_ids=input_ids,
                        attention_mask=attention,
                        do_sample=True,
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        top_k=max(sampling.top_k, 0),  # 0: no top-k filter
                        max_new_tokens=sampling.max_new_tokens,
                        num_return_sequences=n,
                        eos_token_id=stops,
                        stop_strings=list(sampling.stop) or None,
                        tokenizer=tokenizer if sampling.stop else None,  # generate needs it for stop strings
                        pad_token_id=pad,
                        synced_gpus=world_size() > 1,  # sharded (FSDP) ranks must forward in lockstep
                    )[:, width:].tolist()  # [len(chunk) * n, new tokens], prompt-major
                    for i, ids in enumerate(chunk):
                        responses = out[i * n : (i + 1) * n]
                        groups.append(
                            build_group(prompts[start + i], ids, responses=responses, stops=stops,
                                        max_new_tokens=sampling.max_new_tokens, tokenizer=tokenizer,
                                        stop_strings=sampling.stop)
                        )
        finally:
            model.train(was_training)
        return groups
