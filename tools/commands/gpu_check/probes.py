"""The in-process measurement of the GPU check: the KL reference at long positions.

KL: the policy and its reference as ``evolrl.training.build.build_models`` makes them for a ``bf16-mixed`` run
(float32 master weights, reference in ``reference_dtype`` bfloat16), at identical weights, both scored under bf16
autocast as the update scores them (``sequence_logprobs``, the fused head) over one long sequence of random tokens.
Any difference is numerics; one that grows with position is rotary angles computed from rounded frequencies.

The update's speed and memory at a paper-like shape are ``tools.bench.gpu_update``'s (its sections 2-4).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from tools.bench.bench_update import make_sequences

def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def keep_buffers_fp32(policy):
    """A reference with only its parameters in bfloat16 (the buffers, rotary frequencies among them, float32)."""
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    for p in reference.parameters():
        p.data = p.data.to(torch.bfloat16)
    return reference


def kl_at_positions(model_dir: Path, length: int, bands: list[tuple[int, int]], device: torch.device,
                    reference=None) -> dict:
    """Mean |log p_policy - log p_reference| per band of positions, k3 KL per band and overall, and the reference's
    rotary dtype. ``reference``: a function of the policy that makes the reference; default the project's own
    (``build_models``)."""
    from evolrl.algorithms import low_var_kl
    from evolrl.logprobs.forward import sequence_logprobs
    from evolrl.training.build import Dtypes, build_models

    policy, built = build_models(str(model_dir), Dtypes.resolve("bf16-mixed", "float32"), with_reference=True)
    ref = (reference(policy) if reference is not None else built).to(device)
    policy = policy.to(device).eval()
    seqs = make_sequences([length], 1, policy.config.vocab_size, seed=0).to(device)  # every position scored
    with torch.no_grad(), autocast(device):
        mine = sequence_logprobs(policy, seqs, temperature=1.0, chunk_size=1024)[0][0].float()
        theirs = sequence_logprobs(ref, seqs, temperature=1.0, chunk_size=1024)[0][0].float()
    gap, k3 = (mine - theirs).abs(), low_var_kl(mine, theirs)
    rotary = {str(b.dtype) for name, b in ref.named_buffers() if "inv_freq" in name}
    return {"bands": [(lo, hi, float(gap[lo:hi].mean()), float(k3[lo:hi].mean())) for lo, hi in bands],
            "k3": float(k3.mean()), "rotary": ", ".join(sorted(rotary)) or "none", "mean_logp": float(mine.mean())}

