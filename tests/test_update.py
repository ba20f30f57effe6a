"""The GRPO update as an object, without a Trainer: a plain optimizer, schedule and backward."""

from __future__ import annotations

import pytest
import torch
from helpers import short_sequences

from evolrl.algorithms import ClippedSurrogate
from evolrl.models import load_policy
from evolrl.training import Batching
from evolrl.training.update import GRPOLoss, GRPOUpdate


def run(tiny_model, advantages, **loss):
    policy = load_policy(tiny_model)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    reference = load_policy(tiny_model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(**loss), Batching(mini_batch_size=2, micro_batch_size=1, logprob_chunk_size=7), max_grad_norm=1.0)
    stats = update(policy, reference, short_sequences(policy.config.vocab_size, advantages), temperature=0.7,
                   optimizer=optimizer, scheduler=scheduler)
    return update, stats, before, policy, scheduler


def test_the_update_runs_without_a_trainer(tiny_model):
    update, stats, before, policy, scheduler = run(tiny_model, [1.0, -1.0, 0.5, -0.5])
    assert set(stats) >= {"loss", "pg_loss", "entropy", "kl", "grad_norm", "clip_low_frac", "clip_high_frac"}
    assert all(torch.isfinite(torch.tensor(list(stats.values()))))
    assert scheduler.last_epoch == 2  # one schedule step per mini-batch (4 sequences / 2)
    assert update.skipped_steps == 0
    after = policy.state_dict()
    assert all(not torch.equal(after[k], before[k]) for k in before)


def test_a_non_finite_mini_batch_is_skipped_and_moves_nothing(tiny_model):
    update, _, before, policy, scheduler = run(tiny_model, [float("nan")] * 4)
    assert update.skipped_steps == 2 and scheduler.last_epoch == 0
    after = policy.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_under_bf16_autocast_a_later_mini_batch_trains_on_the_weights_the_earlier_one_moved(tiny_model):
    """Lightning runs the whole training step, optimizer steps included, inside one ``torch.autocast``, whose cache
    keeps the bf16 copy of every weight it cast until the outermost autocast exits, even after the weight changed in
    place. The second mini-batch must see the weights the first optimizer step wrote: its log-probs are those of a
    fresh bf16 forward pass of those weights, not of the weights the step started from."""
    policy = load_policy(tiny_model)
    seqs = short_sequences(policy.config.vocab_size, [1.0, -1.0, 0.5, -0.5])
    moved = {}

    class Snapshot(torch.optim.SGD):
        def step(self, closure=None):
            super().step(closure)
            moved.setdefault("weights", {k: v.detach().clone() for k, v in policy.state_dict().items()})

    optimizer = Snapshot(policy.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(), Batching(mini_batch_size=2, micro_batch_size=2, logprob_chunk_size=7), max_grad_norm=1e6)
    trained, forward = [], update.forward

    def spy(model, part, temperature, **kwargs):
        out = forward(model, part, temperature, **kwargs)
        if torch.is_grad_enabled():
            trained.append(out[0].detach())
        return out

    update.forward = spy
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as Lightning's bf16-mixed wraps training_step
        update(policy, None, seqs, temperature=1.0, optimizer=optimizer, scheduler=scheduler)

    fresh = load_policy(tiny_model)
    fresh.load_state_dict(moved["weights"])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = forward(fresh, seqs.select([2, 3]), 1.0)[0]
    mask = seqs.select([2, 3]).response_mask
    torch.testing.assert_close(trained[1][mask], expected[mask], rtol=0, atol=1e-6)


def loss_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, length = 3, 7
    logp = (-torch.rand(n, length, generator=g) * 3).requires_grad_()
    entropy = (torch.rand(n, length, generator=g) * 2).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(n, length, generator=g)  # ratios on both sides of every clip
    ref = logp.detach() + 0.2 * torch.randn(n, length, generator=g)
    mask = torch.rand(n, length, generator=g) > 0.3
    return {"logp": logp, "entropy": entropy, "old": old, "ref": ref, "advantages": torch.tensor([[1.5], [-2.0], [0.5]]),
            "mask": mask, "normalizer": mask.sum().float(), "weights": torch.rand(n, length, generator=g)}


def test_an_entropy_coefficient_of_zero_leaves_the_entropy_out_of_the_gradient():
    """Reported, not differentiated: the fused head then skips the entropy's term of its backward (TTRL's loss)."""
    from evolrl.training.loss import pass_loss

    for coef in (0.0, 0.01):
        inputs = loss_inputs()
        loss, terms = pass_loss(GRPOLoss(entropy_coef=coef), **inputs)
        loss.backward()
        assert (inputs["entropy"].grad is None) == (coef == 0.0)
        assert terms["entropy"] > 0 and not terms["entropy"].requires_grad


@pytest.mark.slow  # compiling the loss: ~10-20 s a variant on 2 cores
def test_the_compiled_loss_gives_the_eager_loss_and_gradients():
    """``Batching.compile_blocks`` compiles the pass's loss (``loss._loss_of``): its value, terms and gradients
    equal the eager ones up to float32 round-off (fused reductions sum in another order: 1e-6 relative), with and
    without the KL, the mismatch weights and the entropy bonus."""
    from torch._dynamo.utils import counters

    from evolrl.training.loss import _loss_of

    torch._dynamo.reset()
    counters.clear()
    for cfg, drop in ((GRPOLoss(), ()), (GRPOLoss(ClippedSurrogate(dual_clip=None), entropy_coef=0.0), ("ref", "weights"))):
        results = []
        for compiled in (True, False):
            inputs = loss_inputs() | {k: None for k in drop}
            loss, terms = _loss_of(compiled)(cfg, **inputs)
            loss.backward()
            results.append((loss.detach(), terms, inputs["logp"].grad, inputs["entropy"].grad))
        (loss, terms, grad, grad_entropy), (eager_loss, eager_terms, eager_grad, eager_grad_entropy) = results
        torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=1e-7)
        assert terms.keys() == eager_terms.keys()
        for name, value in terms.items():
            torch.testing.assert_close(value, eager_terms[name], rtol=1e-6, atol=1e-7, msg=name)
        torch.testing.assert_close(grad, eager_grad, rtol=1e-6, atol=1e-7)
        assert (grad_entropy is None) == (eager_grad_entropy is None) == (cfg.entropy_coef == 0)
        if grad_entropy is not None:
            torch.testing.assert_close(grad_entropy, eager_grad_entropy, rtol=1e-6, atol=1e-7)
    assert counters["stats"]["unique_graphs"] >= 2 and not counters["graph_break"], dict(counters)
