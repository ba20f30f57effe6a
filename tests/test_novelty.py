"""The EVOL-RL reward: known answers for every rule, and the batched code against a slow oracle."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from evolrl.rewards import Embedder, NoveltyBands, band_rewards, novelty_spread, novelty_values
from evolrl.settings import SettingError
from evolrl.types import Prompt, ResponseGroup, RolloutBatch


def evol_rewards_batched(embeddings, is_majority, is_valid, alpha=0.5):
    """The rewards ``NoveltyBands`` computes from embeddings ``[P, V, D]``: novelty, then bands."""
    return band_rewards(novelty_values(embeddings, is_majority, is_valid=is_valid, alpha=alpha), is_majority, is_valid)


def evol_rewards(embeddings, is_majority, is_valid, alpha=0.5):
    """:func:`evol_rewards_batched` for one prompt: embeddings ``[V, D]``, masks ``[V]``."""
    return evol_rewards_batched(embeddings[None], is_majority[None], is_valid=is_valid[None], alpha=alpha)[0]


def oracle_rewards(emb, majority, valid, alpha=0.5):
    """docs/method.md, section 2, transcribed loop by loop, in float64, for one prompt."""
    v = len(valid)
    e = [[float(x) for x in row] for row in emb]

    def sim(i, j):
        return min(max(sum(a * b for a, b in zip(e[i], e[j])), 0.0), 1.0)

    rewards = [-1.0] * v
    kept = [i for i in range(v) if valid[i]]
    groups = {True: [i for i in kept if majority[i]], False: [i for i in kept if not majority[i]]}
    u = {}
    for i in kept:
        others = [j for j in kept if j != i]
        if not others:
            continue
        peers = [j for j in groups[bool(majority[i])] if j != i] or others
        mean = sum(sim(i, j) for j in peers) / len(peers)
        top = max(sim(i, j) for j in others)
        u[i] = 1.0 - (alpha * mean + (1.0 - alpha) * top)
    for is_major, members in groups.items():
        if not members:
            continue
        if len(members) == 1:
            z = {members[0]: 1.0}
        else:
            lo, hi = min(u[i] for i in members), max(u[i] for i in members)
            z = {i: 0.5 if hi - lo <= 1e-6 else (u[i] - lo) / (hi - lo) for i in members}
        for i in members:
            rewards[i] = 0.5 + 0.5 * z[i] if is_major else -1.0 + 0.5 * z[i]
    return rewards


def unit(rows):
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.norm(dim=-1, keepdim=True)


def flags(bits):
    return torch.tensor([bool(b) for b in bits])


@st.composite
def prompt_batches(draw):
    p = draw(st.integers(1, 3))
    v = draw(st.integers(1, 9))
    d = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    emb = torch.randn(p, v, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for _ in range(draw(st.integers(0, 3))):  # duplicated responses
        a, b = draw(st.integers(0, v - 1)), draw(st.integers(0, v - 1))
        emb[:, b] = emb[:, a]
    emb = emb / emb.norm(dim=-1, keepdim=True)
    majority = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=v, max_size=v), min_size=p, max_size=p)))
    valid = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=v, max_size=v), min_size=p, max_size=p)))
    alpha = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
    return emb, majority, valid, alpha


@settings(max_examples=300, deadline=None)
@given(prompt_batches())
def test_batched_matches_loop_oracle(case):
    emb, majority, valid, alpha = case
    got = evol_rewards_batched(emb, majority, is_valid=valid, alpha=alpha)
    for p in range(emb.shape[0]):
        want = oracle_rewards(emb[p].tolist(), majority[p].tolist(), valid=valid[p].tolist(), alpha=alpha)
        assert got[p].tolist() == pytest.approx(want, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(prompt_batches())
def test_bands_never_overlap(case):
    emb, majority, valid, alpha = case
    r = evol_rewards_batched(emb.float(), majority, is_valid=valid, alpha=alpha)
    assert torch.isfinite(r).all()
    major = majority & valid
    minor = ~majority & valid
    assert ((r[major] >= 0.5) & (r[major] <= 1.0)).all()
    assert ((r[minor] >= -1.0) & (r[minor] <= -0.5)).all()
    assert (r[~valid] == -1.0).all()


def test_novelty_never_crosses_prompts():
    g = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(3, 6, 8, generator=g), dim=-1)
    majority = torch.tensor([[1, 1, 1, 0, 0, 1]] * 3).bool()
    valid = torch.ones(3, 6, dtype=torch.bool)
    together = evol_rewards_batched(emb, majority, valid)
    alone = torch.stack([evol_rewards(emb[p], majority[p], valid[p]) for p in range(3)])
    torch.testing.assert_close(together, alone)
    emb2 = emb.clone()
    emb2[1] = emb[0]  # change another prompt's responses: prompt 0 is unaffected
    assert torch.equal(evol_rewards_batched(emb2, majority, valid)[0], together[0])


def test_singleton_groups_get_top_of_band():
    emb = unit([[1, 0, 0], [0.9, 0.1, 0], [0.8, 0.3, 0], [0, 0, 1]])
    r = evol_rewards(emb, flags([1, 0, 0, 0]), flags([1, 1, 1, 1]))
    assert r[0].item() == 1.0  # lone majority response
    r = evol_rewards(emb, flags([1, 1, 1, 0]), flags([1, 1, 1, 1]))
    assert r[3].item() == -0.5  # lone minority response


def test_single_valid_response_is_a_singleton_not_all_minus_one():
    # The authors' code scored every response -1 here.
    emb = unit([[1, 0], [0, 1], [1, 1]])
    r = evol_rewards(emb, flags([0, 1, 0]), flags([0, 1, 0]))
    assert r.tolist() == [-1.0, 1.0, -1.0]


def test_all_equal_novelty_sits_mid_band():
    emb = unit([[1, 0, 0]] * 3 + [[0, 1, 0]] * 2)
    r = evol_rewards(emb, flags([1, 1, 1, 0, 0]), flags([1, 1, 1, 1, 1]))
    assert r.tolist() == pytest.approx([0.75, 0.75, 0.75, -0.75, -0.75])


def test_duplicates_get_the_lowest_novelty():
    emb = unit([[1, 0, 0, 0], [1, 0, 0, 0], [0.6, 0.8, 0, 0], [0.6, 0, 0.8, 0], [0, 0, 0, 1]])
    r = evol_rewards(emb, flags([1, 1, 1, 1, 0]), flags([1, 1, 1, 1, 1]))
    assert r[0].item() == r[1].item() == 0.5  # bottom of the majority band
    assert (r[2:4] > 0.5).all()


def test_invalid_responses_get_minus_one_and_do_not_count():
    emb = unit([[1, 0], [1, 0.1], [0, 1], [1, 0]])
    valid = flags([1, 1, 1, 0])
    r = evol_rewards(emb, flags([1, 1, 0, 1]), valid)
    assert r[3].item() == -1.0
    # the invalid response's embedding (a duplicate of response 0) changes nothing
    emb2 = emb.clone()
    emb2[3] = unit([[0.3, 0.7]])[0]
    assert torch.equal(evol_rewards(emb2, flags([1, 1, 0, 1]), valid), r)


def test_no_valid_response():
    r = evol_rewards(unit([[1, 0], [0, 1]]), flags([0, 0]), flags([0, 0]))
    assert r.tolist() == [-1.0, -1.0]


def test_mutually_most_similar_pair_lands_mid_band_despite_float_noise():
    # Two majority responses that are each other's nearest neighbour have the same novelty
    # mathematically; float32 matmul noise must not push them to opposite ends of the band.
    g = torch.Generator().manual_seed(3)
    base = torch.randn(384, generator=g)
    emb = torch.stack([base + 0.05 * torch.randn(384, generator=g), base + 0.05 * torch.randn(384, generator=g)]
                      + [torch.randn(384, generator=g) for _ in range(4)])
    emb = torch.nn.functional.normalize(emb, dim=-1)
    r = evol_rewards(emb, flags([1, 1, 0, 0, 0, 0]), flags([1] * 6))
    assert r[:2].tolist() == [0.75, 0.75]


def test_novelty_formula_by_hand():
    # All three in the majority; S = [[1, .8, .6], [.8, 1, 0], [.6, 0, 1]].
    emb = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.6, -0.8, 0.0]], dtype=torch.float64)
    u = novelty_values(emb[None], flags([1, 1, 1])[None], flags([1, 1, 1])[None], alpha=0.5)[0]
    s01, s02, s12 = 0.8, 0.6, 0.0
    expected = [
        1 - (0.5 * (s01 + s02) / 2 + 0.5 * max(s01, s02)),
        1 - (0.5 * (s01 + s12) / 2 + 0.5 * max(s01, s12)),
        1 - (0.5 * (s02 + s12) / 2 + 0.5 * max(s02, s12)),
    ]
    assert u.tolist() == pytest.approx(expected)
    r = band_rewards(u[None], flags([1, 1, 1])[None], flags([1, 1, 1])[None])[0]
    lo, hi = min(expected), max(expected)
    assert r.tolist() == pytest.approx([0.5 + 0.5 * (x - lo) / (hi - lo) for x in expected])


class CountingEmbedder(Embedder):
    """Fixed unit vectors per text; records every call."""

    def __init__(self):
        self.calls = []

    def embed(self, texts):
        self.calls.append(list(texts))
        vectors = [torch.tensor([float(len(t)), float(sum(map(ord, t)) % 7) + 1.0, 1.0]) for t in texts]
        return torch.nn.functional.normalize(torch.stack(vectors), dim=-1)


def test_novelty_bands_embed_a_steps_valid_responses_in_one_call_and_match_the_tensor_math():
    texts = [("a \\boxed{1}", "bb \\boxed{1}", "ccc \\boxed{2}"), ("dddd \\boxed{3}", "e \\boxed{3}", "ff")]
    batch = RolloutBatch(tuple(ResponseGroup(Prompt(f"p{i}", "q"), t) for i, t in enumerate(texts)))
    valid = torch.tensor([[True, True, True], [True, True, False]])
    majority = torch.tensor([[True, True, False], [True, True, False]])
    embedder = CountingEmbedder()
    bands = NoveltyBands(embedder, alpha=0.25, novelty_text="reasoning")
    rewards, parts = bands(batch, majority, valid)
    novelty = parts["novelty"]
    assert embedder.calls == [["a ", "bb ", "ccc ", "dddd ", "e "]]  # one call, valid only, box removed
    emb = torch.zeros(2, 3, 3)
    emb[valid] = embedder.embed(["a ", "bb ", "ccc ", "dddd ", "e "])
    torch.testing.assert_close(rewards, evol_rewards_batched(emb, majority, is_valid=valid, alpha=0.25))
    torch.testing.assert_close(novelty, novelty_values(emb, majority, is_valid=valid, alpha=0.25), equal_nan=True)
    torch.testing.assert_close(parts["novelty_spread"], novelty_spread(novelty, majority, valid), equal_nan=True)


def test_min_spread_keeps_a_small_spread_small_by_hand():
    """docs/method.md section 2, step 5: below ``min_spread`` a group's ``z = 0.5 + (u - (min u + max u) / 2) /
    min_spread``; at or above it, min-max ``z = (u - min u) / (max u - min u)``; bands ``0.5 + 0.5 z`` (majority),
    ``-1 + 0.5 z`` (minority)."""
    u = torch.tensor([[0.30, 0.31, 0.32, 0.10, 0.50, float("nan")]], dtype=torch.float64)
    majority, valid = flags([1, 1, 1, 0, 0, 0])[None], flags([1, 1, 1, 1, 1, 0])[None]
    # the majority's spread 0.02 is stretched over its band by min-max: z = 0, 0.5, 1
    assert band_rewards(u, majority, valid)[0].tolist() == pytest.approx([0.5, 0.75, 1.0, -1.0, -0.5, -1.0])
    # under a floor of 0.1 it keeps its size: z = 0.5 + (0.30 - 0.31) / 0.1 = 0.4, then 0.5, 0.6; the minority's
    # spread 0.4 is above the floor, so min-max as before
    floored = band_rewards(u, majority, valid, min_spread=0.1)[0]
    assert floored.tolist() == pytest.approx([0.7, 0.75, 0.8, -1.0, -0.5, -1.0])
    # at the floor (spread 0.1) the two agree: z = 0, 0.5, 1
    wide = torch.tensor([[0.30, 0.35, 0.40]], dtype=torch.float64)
    assert band_rewards(wide, flags([1, 1, 1])[None], flags([1, 1, 1])[None], min_spread=0.1)[0].tolist() == (
        pytest.approx([0.5, 0.75, 1.0]))
    spread = novelty_spread(u, majority, valid)[0].tolist()
    assert spread[:5] == pytest.approx([0.02, 0.02, 0.02, 0.4, 0.4]) and spread[5] != spread[5]  # NaN: invalid
    # a group of one keeps the top of its band and equal novelty the middle, floor or not
    lone = band_rewards(torch.tensor([[0.2, 0.2, 0.7]]), flags([1, 1, 0])[None], flags([1, 1, 1])[None], 0.1)
    assert lone[0].tolist() == pytest.approx([0.75, 0.75, -0.5])
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(SettingError, match="NoveltyBands.min_spread"):
            NoveltyBands(CountingEmbedder(), min_spread=bad)
