"""GRPO math: known answers, and chunked paths against the naive ones."""

import torch

from evolrl.algorithms import clipped_surrogate, group_advantages, low_var_kl
from evolrl.logprobs.from_logits import logprobs_and_entropy


def test_logprobs_and_entropy_match_naive_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64) * 3
    tokens = torch.randint(0, 11, (3, 5), generator=g)
    for temperature in (1.0, 0.7):
        a = logits.clone().requires_grad_(True)
        logp, ent = logprobs_and_entropy(a, tokens, temperature, chunk_size=4)  # chunks straddle rows
        b = logits.clone().requires_grad_(True)
        dist = torch.distributions.Categorical(logits=b / temperature)
        torch.testing.assert_close(logp, dist.log_prob(tokens).float())
        torch.testing.assert_close(ent, dist.entropy().float())
        weights = torch.randn(3, 5, generator=g)
        (logp * weights + ent * weights.flip(0)).sum().backward()
        (dist.log_prob(tokens) * weights + dist.entropy() * weights.flip(0)).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)  # float32 inside vs float64


def test_logprobs_gradient_when_only_one_output_is_used():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 9, generator=g, dtype=torch.float64) * 2
    tokens = torch.randint(0, 9, (2, 4), generator=g)
    for pick in (0, 1):  # log-probs alone (entropy bonus off), entropy alone
        a = logits.clone().requires_grad_(True)
        logprobs_and_entropy(a, tokens, 0.8)[pick].sum().backward()
        b = logits.clone().requires_grad_(True)
        dist = torch.distributions.Categorical(logits=b / 0.8)
        (dist.log_prob(tokens) if pick == 0 else dist.entropy()).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)
    assert torch.equal(a.detach(), logits)  # the logits themselves are never written to


def test_logprobs_without_grad_and_bf16_logits():
    logits = torch.randn(2, 3, 7).bfloat16()
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with torch.no_grad():
        logp, ent = logprobs_and_entropy(logits, tokens)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, torch.log_softmax(logits.float(), -1)[..., 0])
    assert (ent <= torch.log(torch.tensor(7.0)) + 1e-5).all()


def test_group_advantages():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    a = group_advantages(r)
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()  # N - 1 denominator
    torch.testing.assert_close(a[0], (r[0] - 0.5) / (std + 1e-6))
    assert a[1].tolist() == [0.0] * 4  # equal rewards: zero advantage, no NaN
    assert group_advantages(torch.tensor([[3.0]])).tolist() == [[0.0]]
    torch.testing.assert_close(group_advantages(r, scale_by_std=False)[0], r[0] - 0.5)


def test_surrogate_values_and_clip_masks():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 5.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, masks = clipped_surrogate(logp, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # ratio 1.5, A>0: clipped to 1.28 -> -1.28 ; ratio 0.5, A<0: max(0.5, 0.8) = 0.8
    # ratio 1.1 inside -> -1.1 ; ratio 5, A<0: max(5, 1.28) = 5 -> dual clip min(5, 3) = 3
    torch.testing.assert_close(loss, torch.tensor([[-1.28, 0.8, -1.1, 3.0]]))
    assert masks["clip_high"].tolist() == [[True, False, False, False]]
    assert masks["clip_low"].tolist() == [[False, True, False, False]]
    assert masks["dual_clip"].tolist() == [[False, False, False, True]]


def test_surrogate_on_the_side_no_clip_bounds_and_with_advantages_other_than_one():
    logp = torch.log(torch.tensor([[0.5, 1.5, 1.5, 0.5, 5.0]]))
    adv = torch.tensor([[2.0, -2.0, 0.5, -0.5, -2.0]])
    loss, masks = clipped_surrogate(logp, torch.zeros(1, 5), adv, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # ratio 0.5, A = 2: max(-2 x 0.5, -2 x 0.8) = -1.0, the unclipped term (a worse ratio is not clipped)
    # ratio 1.5, A = -2: max(2 x 1.5, 2 x 1.28) = 3.0, below the dual bound 2 x 3 = 6
    # ratio 1.5, A = 0.5: max(-0.75, -0.5 x 1.28) = -0.64, clipped high
    # ratio 0.5, A = -0.5: max(0.25, 0.5 x 0.8) = 0.4, clipped low
    # ratio 5, A = -2: max(10, 2 x 1.28) = 10, capped by the dual clip at 2 x 3 = 6
    torch.testing.assert_close(loss, torch.tensor([[-1.0, 3.0, -0.64, 0.4, 6.0]]))
    assert masks["clip_high"].tolist() == [[False, False, True, False, False]]
    assert masks["clip_low"].tolist() == [[False, False, False, True, False]]
    assert masks["dual_clip"].tolist() == [[False, False, False, False, True]]


def test_clipping_gives_zero_gradient_on_the_clipped_side():
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    ratios = torch.tensor([[1.5, 1.1, 0.5, 0.9, 5.0]])
    logp = torch.log(ratios).requires_grad_(True)
    loss, _ = clipped_surrogate(logp, torch.zeros(1, 5), adv)
    loss.sum().backward()
    grad = logp.grad[0]
    assert grad[0] == 0  # A > 0 above 1 + clip_high
    assert grad[2] == 0  # A < 0 below 1 - clip_low
    assert grad[4] == 0  # dual clip
    assert grad[1] != 0 and grad[3] != 0  # inside the trust region
    # on the other side of each bound the gradient flows
    logp2 = torch.log(torch.tensor([[0.5, 1.5]])).requires_grad_(True)
    clipped_surrogate(logp2, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]))[0].sum().backward()
    assert (logp2.grad != 0).all()


def test_symmetric_clip_and_no_dual_clip():
    logp = torch.log(torch.tensor([[1.25, 5.0]]))
    loss, masks = clipped_surrogate(logp, torch.zeros(1, 2), advantages=torch.tensor([[1.0, -1.0]]), clip_low=0.2,
                                    clip_high=0.2, dual_clip=None)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 5.0]]))
    assert "dual_clip" not in masks


def test_low_var_kl():
    logp = torch.tensor([0.0, -1.0, -30.0])
    ref = torch.tensor([0.0, -2.0, 0.0])
    d = ref - logp
    expected = (torch.exp(d) - d - 1).clamp(-10, 10)
    torch.testing.assert_close(low_var_kl(logp, ref), expected)
    assert low_var_kl(logp, ref)[0] == 0 and low_var_kl(logp, ref)[2] == 10


def test_the_surrogate_and_advantage_settings_compute_what_the_functions_do():
    """``model.loss.policy_loss`` (ClippedSurrogate) and ``model.advantages`` (GroupAdvantages) are the functions above
    with their settings bound: bit-identical results."""
    from evolrl.algorithms import ClippedSurrogate, GroupAdvantages

    logp = torch.tensor([[-0.5, -2.0, -0.1], [-0.5, -2.0, 0.5]])
    old, adv, mask = torch.full((2, 3), -1.0), torch.tensor([[1.0], [-1.0]]), torch.ones(2, 3, dtype=torch.bool)
    for settings in ({}, {"clip_low": 0.1, "clip_high": 0.5, "dual_clip": None}):
        loss, masks = ClippedSurrogate(**settings)(logp, old, adv, mask)
        expected, expected_masks = clipped_surrogate(logp, old, adv, **settings)
        assert torch.equal(loss, expected) and masks.keys() == expected_masks.keys()
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    for scale in (True, False):
        assert torch.equal(GroupAdvantages(scale)(rewards), group_advantages(rewards, scale_by_std=scale))
