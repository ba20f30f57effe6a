"""Regression guards a refactor must leave unchanged: a replay that holds on any x86-64 CPU, and a same-process rerun.

**Replay** (``regression/replay.json``, written by ``python tests/test_regression.py``, record mode). Rollout groups
as an engine returns them (prompt and response token ids, texts, truncation flags, a bf16 sampler's log-probs; record
mode writes answers to the data's own prompts, right or one off, boxed or not, some cut at the token limit) go
through the real pieces of a training step, in float64: ``Rollouts`` (its seeded draw of the trained G of each group's V), ``EvolReward`` with the packaged
MiniLM run in float64, group advantages, the mismatch correction (``TokenTruncate``), the old-log-prob and reference
passes, the clipped surrogate with KL and entropy, AdamW and its warm-up + cosine schedule. No token is sampled, the
initial weights are drawn from integers (``portable_init``: torch's normal initialiser goes through vectorised
log/cos whose last bits depend on the CPU), so what a machine changes is only the rounding of its kernels.

Tolerance, measured when the file was recorded (``python tests/test_regression.py --spread`` prints each row), as
the largest relative difference ``|a - b| / |b|`` over the compared quantities (a step's rewards or advantages, one
logged value over the steps, one parameter's change):

* rounding: another summation order (packed passes under a token budget instead of padded passes of 3) moves them
  by 7.9e-8; 1 thread instead of 2 by 0. Most of the step is float64, but the advantages (``RewardOutput``) and the
  mismatch weights are float32 by design, so a float64 difference can flip a float32 rounding. The same replay run
  end to end in float32 (policy and embedder), a bound on what any kernel's rounding can do, moves them by 1.9e-5.
* real changes move them by 0.67 or more: the policy-gradient sign flipped, the loss normalizer taken per pass
  instead of per mini-batch (1.6), the clip bounds swapped (0.67), the trained subset drawn from another stream.

So ``RTOL = 1e-3``: 50x above the float32 bound, 600x below the smallest real change.
``test_each_guarded_change_is_caught`` applies those changes and checks that each is caught.

**Rerun** (``test_the_sampling_path_is_deterministic_in_one_process``): sampling is exact only on one machine, so the
whole run through the CLI, sampling and evaluation included, is compared bit for bit with itself in one process.
"""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml
from helpers import make_tiny_model, scalars

from evolrl.algorithms import ClippedSurrogate, GroupAdvantages, TokenMean, TokenTruncate, policy_loss
from evolrl.models import load_policy, load_tokenizer
from evolrl.rewards import AnswerRules, EvolReward, NoveltyBands, SentenceTransformerEmbedder
from evolrl.rollout import Rollouts
from evolrl.rollout.engine import RolloutEngine, Sampling
from evolrl.rollout.seeds import Seeds
from evolrl.training.batching import Batching
from evolrl.training.loss import GRPOLoss
from evolrl.training.optim import Optimization, build_optimizer, start_schedule
from evolrl.training.scoring import score
from evolrl.training.update import GRPOUpdate
from evolrl.types import Prompt, ResponseGroup

RECORD = Path(__file__).parent / "regression" / "replay.json"
RTOL, ATOL = 1e-3, 1e-10
SEED, TEMPERATURE, STEPS, PROMPTS, V, G = 5, 0.8, 3, 2, 6, 4
LOSS = {"policy_loss": ClippedSurrogate(clip_low=0.2, clip_high=0.28, dual_clip=3.0), "kl_coef": 0.05,
        "entropy_coef": 0.01, "mismatch_correction": TokenTruncate(cap=1.05)}
OPTIM = {"lr": 3e-3, "warmup_ratio": 0.2, "weight_decay": 0.01}
PLANS = {  # the same update, split two ways: the record uses the first
    "padded passes of 3": {"mini_batch_size": 5, "micro_batch_size": 3, "logprob_chunk_size": 7},
    "packed, 200-token budget": {"mini_batch_size": 5, "micro_batch_size": 3, "max_tokens_per_micro_batch": 200,
                                "packed": True, "logprob_chunk_size": 7},
}


def portable_init(model: torch.nn.Module, seed: int, eos_token_id: int) -> None:
    """Every parameter from integers (mt19937, the same bits on every machine), uniform with the std of a normal
    init at 0.02; norms stay 1. The head's bias-like first column makes the end token likely (lengths vary)."""
    generator = torch.Generator().manual_seed(seed)
    scale = 0.02 * math.sqrt(3.0) / 2**20
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                continue
            ints = torch.randint(-(2**20), 2**20 + 1, param.shape, generator=generator)
            param.copy_(ints.to(torch.float64) * scale)
        head = model.get_output_embeddings().weight
        head[:, 0] = 0.0
        head[eos_token_id, 0] = 4.0


class ReplayEngine(RolloutEngine):
    """Hands out recorded response groups, one recorded step per weights version."""

    reports_logprobs = True

    def __init__(self, steps: list[list[ResponseGroup]]) -> None:
        super().__init__()
        self.steps = steps

    def _load(self, policy) -> None:
        pass

    def generate(self, prompts, prompt_ids, sampling, n, seed):
        groups = self.steps[self.version]
        assert [g.prompt.id for g in groups] == [p.id for p in prompts] and n == len(groups[0].texts)
        return list(groups)


def groups_from_record(record: dict) -> list[list[ResponseGroup]]:
    return [[ResponseGroup(prompt=Prompt(**g["prompt"]), texts=tuple(g["texts"]), truncated=tuple(g["truncated"]),
                           prompt_ids=tuple(g["prompt_ids"]), response_ids=tuple(map(tuple, g["response_ids"])),
                           sampler_logprobs=tuple(map(tuple, g["sampler_logprobs"])))
             for g in step] for step in record["groups"]]


def summary(delta: torch.Tensor, seed: int) -> list[float]:
    """Sum, absolute sum, squared sum and a fixed random projection of a parameter's change."""
    weights = torch.randint(-8, 9, delta.shape, generator=torch.Generator().manual_seed(seed)).to(delta.dtype)
    return [float(delta.sum()), float(delta.abs().sum()), float(delta.square().sum()), float((delta * weights).sum())]


def replay(tiny_dir: str, record: dict, embedder, dtype: torch.dtype = torch.float64,
           plan: str = "padded passes of 3") -> dict:
    """The recorded groups through reward -> advantages -> update; per-step outcomes and the parameters' change."""
    tokenizer = load_tokenizer(tiny_dir)
    policy = load_policy(tiny_dir).to(dtype)
    portable_init(policy, record["init_seed"], tokenizer.eos_token_id)
    reference = load_policy(tiny_dir).to(dtype).eval().requires_grad_(False)
    reference.load_state_dict(policy.state_dict())
    initial = {k: v.clone() for k, v in policy.state_dict().items()}

    steps = groups_from_record(record)
    sampling = Sampling(temperature=TEMPERATURE, max_new_tokens=record["max_new_tokens"])
    rollouts = Rollouts(ReplayEngine(steps), sampling, sampling, prompts_per_step=PROMPTS, vote_samples=V,
                        trained_samples=G, eval_samples=1, eval_prompts_per_batch=1, seeds=Seeds(SEED))
    rollouts.setup(tokenizer, longest_prompt=64, evaluates=False)
    answers = AnswerRules(valid_rule="digit", number_fallback=False)
    reward = EvolReward(NoveltyBands(embedder=embedder, alpha=0.3), answers)
    update = GRPOUpdate(GRPOLoss(**LOSS), Batching(**PLANS[plan]), max_grad_norm=1.0)
    optimizer, scheduler = build_optimizer(list(policy.parameters()), Optimization(**OPTIM))
    start_schedule(scheduler, STEPS * update.optimizer_steps(PROMPTS * G))
    outcomes = []
    rollouts.push(policy, new_version=False)
    for step in steps:
        batch = rollouts.sample([g.prompt for g in step], [g.prompt_ids for g in step])
        scored = score(reward, GroupAdvantages(), batch, torch.device("cpu"), vocabulary=len(tokenizer),
                       policy_pass=lambda seqs, temperature: update.policy_pass(policy, seqs, temperature))
        stats = update(policy, reference, scored.seqs, temperature=TEMPERATURE, optimizer=optimizer,
                       scheduler=scheduler)
        outcomes.append({"trained": batch.trained.tolist(), "rewards": scored.rewards.rewards.tolist(),
                         "advantages": scored.advantages.tolist(), "stats": stats})
        rollouts.push(policy)
    params = {name: summary(value.double() - initial[name].double(), seed=i)
              for i, (name, value) in enumerate(policy.state_dict().items())}
    return {"steps": outcomes, "params": params}


def differences(now: dict, recorded: dict) -> dict[str, float]:
    """Relative difference ``|a - b| / |b|`` (Euclidean norms) of each compared quantity: a step's rewards, its
    advantages, one logged value over the steps, one parameter's change (its four summaries)."""

    def rel(a, b) -> float:
        a, b = torch.tensor(a, dtype=torch.float64).flatten(), torch.tensor(b, dtype=torch.float64).flatten()
        return float((a - b).norm() / b.norm().clamp_min(ATOL))

    out = {}
    for i, (a, b) in enumerate(zip(now["steps"], recorded["steps"], strict=True)):
        out[f"step {i} trained"] = 0.0 if a["trained"] == b["trained"] else math.inf
        out[f"step {i} rewards"] = rel(a["rewards"], b["rewards"])
        out[f"step {i} advantages"] = rel(a["advantages"], b["advantages"])
    keys = recorded["steps"][0]["stats"].keys()
    assert all(s["stats"].keys() == keys for s in now["steps"]), f"logged {sorted(now['steps'][0]['stats'])}"
    for key in keys:
        out[key] = rel([s["stats"][key] for s in now["steps"]], [s["stats"][key] for s in recorded["steps"]])
    assert now["params"].keys() == recorded["params"].keys()
    for name in recorded["params"]:
        out[f"param {name}"] = rel(now["params"][name], recorded["params"][name])
    return out


def worst(diffs: dict[str, float]) -> tuple[str, float]:
    return max(diffs.items(), key=lambda kv: kv[1])


@pytest.fixture(scope="module")
def minilm64():
    """The packaged all-MiniLM-L6-v2 in float64: embeddings that no kernel's rounding moves at RTOL."""
    embedder = SentenceTransformerEmbedder(device="cpu", dtype="float64")
    embedder.embed(["warm up"])
    return embedder


@pytest.fixture(scope="module")
def record():
    return json.loads(RECORD.read_text())


@pytest.mark.parametrize("plan", list(PLANS))
def test_recorded_rollouts_replay_to_the_recorded_update(tiny_model, minilm64, record, plan):
    now = replay(tiny_model, record, minilm64, plan=plan)
    name, value = worst(differences(now, record["expected"]))
    assert value <= RTOL, f"{name}: relative difference {value:.3g} > {RTOL} (the replay is no longer the recorded one)"


@contextmanager
def changed(what: str, monkeypatch):
    """One deliberate change of the kind the replay exists to catch."""
    with monkeypatch.context() as patch:
        if what == "policy-gradient sign":
            surrogate = policy_loss.clipped_surrogate
            patch.setattr("evolrl.algorithms.policy_loss.clipped_surrogate",
                          lambda logp, old_logp, **k: surrogate(logp, old_logp,
                                                                **{**k, "advantages": -k["advantages"]}))
        elif what == "normalizer per pass":
            token_mean = TokenMean.__call__
            patch.setattr(TokenMean, "__call__", lambda self, values, mask, normalizer: token_mean(self, values, mask))
        elif what == "clip bound on the other side":
            surrogate = policy_loss.clipped_surrogate
            patch.setattr("evolrl.algorithms.policy_loss.clipped_surrogate",
                          lambda logp, old_logp, clip_low, clip_high, **k: surrogate(
                              logp, old_logp, clip_low=clip_high, clip_high=clip_low, **k))
        elif what == "another trained-subset stream":
            patch.setattr(Seeds, "trained_subset", lambda self, version: self.seed * 1_000_003 + version + 1)
        yield


CHANGES = ["policy-gradient sign", "normalizer per pass", "clip bound on the other side",
           "another trained-subset stream"]


@pytest.mark.parametrize("what", CHANGES)
def test_each_guarded_change_is_caught(tiny_model, minilm64, record, monkeypatch, what):
    with changed(what, monkeypatch):
        now = replay(tiny_model, record, minilm64)
    name, value = worst(differences(now, record["expected"]))
    assert value > 20 * RTOL, f"{what}: the replay moved by at most {value:.3g} ({name}), not caught at RTOL"


# ---- the sampling path, on one machine -------------------------------------------------------------------------------
TAGS = ["train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/reward_mean", "train/grad_norm",
        "train/clip_high_frac", "train/novelty_mean", "val/addition/pass@1", "val/addition/maj@4"]


def fit_config(tmp_path: Path, model: str) -> Path:
    config = {
        "seed_everything": 3,
        "trainer": {
            "accelerator": "cpu", "max_epochs": 2, "limit_train_batches": 2, "log_every_n_steps": 1,
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
            "val_check_interval": 1, "num_sanity_val_steps": -1,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "regression"}},
            "callbacks": [{"class_path": "evolrl.callbacks.PassAtK", "init_args": {"pass_ks": [1, 4], "maj_ks": [4]}}],
        },
        "model": {
            "model": model,
            "reward": {"class_path": "evolrl.rewards.EvolReward",
                       "init_args": {"answers": {"valid_rule": "any", "number_fallback": True},
                                     "novelty": {"alpha": 0.3}}},
            "loss": {"policy_loss": {"class_path": "evolrl.algorithms.ClippedSurrogate",
                                     "init_args": {"clip_low": 0.2, "clip_high": 0.25}},
                     "kl_coef": 0.01, "entropy_coef": 0.002},
            "optim": {"lr": 1e-4, "warmup_ratio": 0.2},
            "batching": {"mini_batch_size": 5, "micro_batch_size": 3},
        },
        "data": {
            "train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 8}},
            "engine": {"class_path": "evolrl.rollout.HFEngine"},
            "prompts_per_step": 2, "vote_samples": 5, "trained_samples": 4,
            "sampling": {"temperature": 0.8, "max_new_tokens": 10}, "seed": 5,
            "eval_sets": [{"class_path": "evolrl.data.EvalSet", "init_args": {
                "name": "addition", "source": {"class_path": "evolrl.data.AdditionPrompts",
                                               "init_args": {"count": 4, "seed": 1}}}}],
            "eval_samples": 4, "eval_sampling": {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 6},
        },
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_sampling_path_is_deterministic_in_one_process(tmp_path, tiny_model, minilm, monkeypatch):
    """Two fits of the same config, sampling and evaluation included: the same curves and weights, bit for bit
    (exact on one machine; across machines sampled tokens may part ways, which the replay above is immune to)."""

    from evolrl.cli import main

    monkeypatch.setattr("sys.argv", ["evolrl"])
    runs = []
    for name in ("first", "second"):
        cli = main(["fit", "--config", str(fit_config(tmp_path / name, tiny_model))])
        logged = scalars(tmp_path / name)
        runs.append(({tag: logged[tag] for tag in TAGS}, cli.model.policy.state_dict()))
    (curves, weights), (curves2, weights2) = runs
    assert curves == curves2
    assert all(len(values) >= 2 for values in curves.values())
    assert weights.keys() == weights2.keys() and all(torch.equal(weights[k], weights2[k]) for k in weights)


# ---- record mode ---------------------------------------------------------------------------------------------------
TEMPLATES = [  # what a small model writes to an addition: boxed right or wrong, unboxed (invalid), trailing text
    "We add the numbers: {a} + {b} = {x}, so the result is \\boxed{{{x}}}.",
    "{a} + {b} = {x}. The answer is \\boxed{{{x}}}.",
    "The sum is \\boxed{{{x}}}.",
    "We add: {a} plus {b} equals {x}, \\boxed{{{x}}} plus the question answer sum",
    "The answer is {x}.",
    "Please reason step by step: {a} + {b} is {x}, the answer is \\boxed{{{x}}}. {a} {b} {a} {b} {a} {b} {a} {b}",
]


def make_groups(tiny_dir: str) -> dict:
    """Response groups as an engine returns them (``build_group``: cut at the stop token, decoded, truncation
    flagged) for the data's own prompts and chat rendering; the texts vary in answer (the sum or one off), box and
    length, so majority, minority, invalid and truncated responses all occur. The sampler's log-probs are those a
    bf16 copy of the initial float32 model gives the tokens: a sampler/trainer gap, growing as the policy moves."""
    import random

    from evolrl.data import AdditionPrompts
    from evolrl.data.chat import PAPER_SYSTEM_PROMPT, render_prompt
    from evolrl.logprobs.forward import sequence_logprobs
    from evolrl.logprobs.sequences import trained_sequences
    from evolrl.rollout.engine import build_group
    from evolrl.types import RolloutBatch

    tokenizer = load_tokenizer(tiny_dir)
    sampler = load_policy(tiny_dir)
    portable_init(sampler, 0, tokenizer.eos_token_id)
    sampler = sampler.to(torch.bfloat16)
    rng, max_new_tokens = random.Random(SEED), 28
    prompts = AdditionPrompts(count=PROMPTS * STEPS, seed=SEED).load()
    steps = []
    for s in range(STEPS):
        groups = []
        for prompt in prompts[s * PROMPTS : (s + 1) * PROMPTS]:
            a, b = map(int, re.findall(r"\d+", prompt.question)[:2])
            texts = [rng.choice(TEMPLATES).format(a=a, b=b, x=a + b + rng.choice([0, 0, 0, 1, -1])) for _ in range(V)]
            responses = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in texts]
            prompt_ids = render_prompt(tokenizer, prompt.question, PAPER_SYSTEM_PROMPT)
            groups.append(build_group(prompt, prompt_ids, responses=[r[:max_new_tokens] for r in responses],
                                      stops=[tokenizer.eos_token_id], max_new_tokens=max_new_tokens,
                                      tokenizer=tokenizer))
        batch = RolloutBatch(tuple(groups), trained=torch.arange(V).repeat(PROMPTS, 1))
        seqs = trained_sequences(batch, torch.zeros(PROMPTS, V), tokenizer.pad_token_id)
        with torch.no_grad():
            logp = sequence_logprobs(sampler, seqs, temperature=TEMPERATURE, chunk_size=7, fused_head=True)[0].float()
        recorded = []
        for p, group in enumerate(groups):
            start = len(group.prompt_ids) - 1
            lps = [logp[p * V + v, start : start + len(r)].tolist() for v, r in enumerate(group.response_ids)]
            recorded.append({"prompt": vars(group.prompt), "prompt_ids": list(group.prompt_ids),
                             "response_ids": [list(r) for r in group.response_ids], "texts": list(group.texts),
                             "truncated": list(group.truncated), "sampler_logprobs": lps})
        steps.append(recorded)
    return {"init_seed": 0, "max_new_tokens": max_new_tokens, "groups": steps}


if __name__ == "__main__":
    import argparse
    import os
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description="Record the replay, or (--spread) print how far rounding and real "
                                                 "changes move it from the record")
    parser.add_argument("--spread", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny_model(Path(tmp) / "tiny-llama"))
        embedder = SentenceTransformerEmbedder(device="cpu", dtype="float64")
        if not args.spread:
            record = make_groups(model)
            record["expected"] = replay(model, record, embedder)
            RECORD.parent.mkdir(exist_ok=True)
            RECORD.write_text(json.dumps(record, indent=1) + "\n")
            print(f"recorded {STEPS} steps of {PROMPTS} x {V} responses in {RECORD}")
        else:
            record = json.loads(RECORD.read_text())
            rows = {f"plan: {plan}": replay(model, record, embedder, plan=plan) for plan in PLANS}
            torch.set_num_threads(1)
            rows["1 thread"] = replay(model, record, embedder)
            torch.set_num_threads(2)
            rows["float32 end to end"] = replay(model, record, SentenceTransformerEmbedder(device="cpu"),
                                                dtype=torch.float32)
            for what in CHANGES:
                with pytest.MonkeyPatch.context() as mp, changed(what, mp):
                    rows[f"change: {what}"] = replay(model, record, embedder)
            for label, now in rows.items():
                name, value = worst(differences(now, record["expected"]))
                print(f"{label:45s} largest relative difference {value:.3g} ({name})")
