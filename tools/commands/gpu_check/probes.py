"""The in-process measurements of the GPU check: the KL reference at long positions, and one update.

KL: the policy and its reference as ``evolrl.training.build.build_models`` makes them for a ``bf16-mixed`` run
(float32 master weights, reference in ``reference_dtype`` bfloat16), at identical weights, both scored under bf16
autocast as the update scores them (``sequence_logprobs``, the fused head) over one long sequence of random tokens.
Any difference is numerics; one that grows with position is rotary angles computed from rounded frequencies.

Update: ``GRPOUpdate`` as ``tools.bench.bench_update`` builds it (its sequences and FLOP count), on this device:
packed passes under a token budget, gradient checkpointing, KL and entropy terms, fused AdamW.
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path

import torch

from tools.bench.bench_update import counted_weights, make_sequences, responses, update_flops
from tools.common import reset_peak, status_mib

GIB = 2**30

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


def one_update(model_dir: Path, device: torch.device, sequences: int, mini_batch: int, prompt: int, median: int,
               cap: int, budget: int, draws: int) -> dict:
    """Build as the module does, a warm-up update on two short sequences, then ``draws`` measured updates."""
    from evolrl.training import Batching, GRPOLoss, GRPOUpdate, Optimization
    from evolrl.training.build import Dtypes, build_models
    from evolrl.training.optim import build_optimizer, start_schedule

    policy, reference = build_models(str(model_dir), Dtypes.resolve("bf16-mixed", "float32"), with_reference=True,
                                     gradient_checkpointing=True, packed=True)
    policy, reference = policy.to(device), reference.to(device)
    batching = Batching(mini_batch_size=mini_batch, micro_batch_size=1, max_tokens_per_micro_batch=budget, packed=True)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.001, entropy_coef=0.003), batching, max_grad_norm=1.0)
    optimizer, scheduler = build_optimizer(list(policy.parameters()), Optimization(lr=1e-6))
    start_schedule(scheduler, 1000)
    vocab, cuda = policy.config.vocab_size, device.type == "cuda"

    def step(lengths: list[int], seed: int) -> float:
        seqs = make_sequences(lengths, prompt, vocab=vocab, seed=seed).to(device)
        sync()
        start = time.perf_counter()
        with autocast(device):
            update(policy, reference, seqs, temperature=1.0, optimizer=optimizer, scheduler=scheduler)
        sync()
        return time.perf_counter() - start

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    step([prompt + 16] * 2, seed=1)
    measured = []
    for i in range(draws):
        lengths = [prompt + r for r in responses("heavy", sequences, median=median, sigma=1.0, cap=cap, seed=i)]
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        else:
            with contextlib.suppress(OSError):
                reset_peak()
        seconds = step(lengths, seed=10 + i)
        peak = torch.cuda.max_memory_allocated(device) / GIB if cuda else status_mib("VmHWM") / 1024
        measured.append({"seconds": seconds, "tokens": sum(lengths), "longest": max(lengths), "peak_gib": peak,
                         "flops": update_flops(counted_weights(policy), lengths, prompt=prompt, mini_batch=mini_batch,
                                               kl=True)})
    params = sum(p.numel() for p in policy.parameters())
    return {"draws": measured, "params": params, "skipped": update.skipped_steps}
