"""The vLLM engine started from any context the trainer calls it from (CPU build here, the regular package on a GPU).

Lightning runs validation under ``torch.inference_mode()`` and the sanity check comes before the first training
step, so the engine's first start can fall inside inference mode while every later weight push comes from the
training step, outside it; the training step itself runs under autocast with bf16 precision.
"""

from __future__ import annotations

import gc
import itertools
import json

import pytest
import torch

pytest.importorskip("vllm")

from helpers import sampler_logprob_gap, tied_qwen3

from evolrl.data.chat import render_prompt
from evolrl.models import load_policy, load_tokenizer
from evolrl.rollout import Sampling, VLLMEngine
from evolrl.types import Prompt

pytestmark = pytest.mark.vllm

TOLERANCE = 1e-4
"""Max |engine log-prob - policy log-prob| per token, float32 engine against float32 policy (as tests/test_vllm.py)."""

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def drop_engines_at_once():
    yield
    gc.collect()  # see tests/test_vllm.py: each test's engine goes at its end


def test_an_engine_started_in_inference_mode_takes_pushes_outside_it(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    policy = load_policy(tiny_model).to(DEVICE)
    engine = VLLMEngine(dtype="float32", enforce_eager=True, kv_cache_gib=0.1, max_model_len=128,
                        gpu_memory_utilization=0.2)
    engine.setup(tokenizer)
    prompts = [Prompt("a", "What is 3 + 4?")]
    ids = [render_prompt(tokenizer, prompts[0].question, None)]
    with torch.inference_mode():  # as Lightning's sanity validation: the first start and push happen here
        engine.load_weights(policy)
        engine.generate(prompts, ids, sampling=Sampling(max_new_tokens=4), n=2, seed=0)
    with torch.no_grad():  # a training step moves the weights, then pushes them outside inference mode
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights(policy)
    sampling = Sampling(max_new_tokens=8)
    assert sampler_logprob_gap(engine, policy, prompts, prompt_ids=ids, sampling=sampling, n=4, seed=1) < TOLERANCE
    with torch.inference_mode():  # a push made inside inference mode (evaluation without training) ...
        engine.load_weights(policy)
    engine.load_weights(policy)  # ... leaves the weights open to the next training step's push


@torch.no_grad()
def policy_logprobs(policy, group) -> list[torch.Tensor]:
    """The policy's float32 log-probs of each sampled response token (temperature 1), outside any autocast."""
    out = []
    for response in group.response_ids:
        tokens = torch.tensor([list(group.prompt_ids) + list(response)], device=DEVICE)
        logp = torch.log_softmax(policy(input_ids=tokens).logits[0, :-1].float(), -1)
        out.append(logp.gather(-1, tokens[0, 1:, None])[len(group.prompt_ids) - 1 :, 0].cpu())
    return out


def test_sampling_inside_the_training_steps_autocast_keeps_the_engines_precision(tiny_model):
    """Under bf16-mixed, Lightning runs the training step, and so the sampling call, inside a bf16 autocast; a
    float32 engine must still compute in float32 there (inside the autocast its matmuls round to bf16: a gap of
    ~4e-2 on this model, measured, rather than ~1e-6)."""
    tokenizer = load_tokenizer(tiny_model)
    policy = load_policy(tiny_model).to(DEVICE)
    engine = VLLMEngine(dtype="float32", enforce_eager=True, kv_cache_gib=0.1, max_model_len=128,
                        gpu_memory_utilization=0.2)
    engine.setup(tokenizer)
    prompts = [Prompt("a", "What is 3 + 4?"), Prompt("b", "What is 1 + 2?")]
    ids = [render_prompt(tokenizer, p.question, None) for p in prompts]
    with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):
        engine.load_weights(policy)
        groups = engine.generate(prompts, ids, sampling=Sampling(max_new_tokens=8), n=4, seed=1)
    gap = max((mine - torch.tensor(reported)).abs().max().item() for group in groups
              for mine, reported in zip(policy_logprobs(policy, group), group.sampler_logprobs))
    assert gap < TOLERANCE


def test_every_prompt_gets_a_seed_of_its_own(tiny_model):
    """On a GPU every request is seeded (``_seed_requests``; on the CPU backend only where set, as here, since it
    cannot rewind a seeded generator across a split prefill, which these short prompts never need). vLLM seeds a
    prompt's n samples with seed, seed + 1, ...; one seed for the whole call gave two identical prompts identical
    samples, and Model Runner V2 correlates any two prompts of equal length that way. With a seed per prompt the
    two groups differ, and a call is still reproducible from its seed."""
    tokenizer = load_tokenizer(tiny_model)
    policy = load_policy(tiny_model).to(DEVICE)
    engine = VLLMEngine(dtype="float32", enforce_eager=True, kv_cache_gib=0.1, max_model_len=128,
                        gpu_memory_utilization=0.2)
    engine.setup(tokenizer, max_sequences=16)
    engine.load_weights(policy)
    engine._seed_requests = True
    prompts = [Prompt("a", "What is 3 + 4?"), Prompt("b", "What is 3 + 4?")]
    ids = [render_prompt(tokenizer, p.question, None) for p in prompts]
    first = [g.response_ids for g in engine.generate(prompts, ids, sampling=Sampling(max_new_tokens=12), n=8, seed=5)]
    again = [g.response_ids for g in engine.generate(prompts, ids, sampling=Sampling(max_new_tokens=12), n=8, seed=5)]
    assert first == again
    assert first[0] != first[1]
    # the largest call (16 sequences, from setup) sizes vLLM's batch, not vLLM's default of 256 or 1,024
    assert engine.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == 16


def test_the_request_seeds_of_a_run_do_not_meet():
    """Every prompt of every call (versions, ranks, training and evaluation) starts its n seeds far from any other's:
    vLLM gives the i-th sample seed + i."""
    from evolrl.rollout import Seeds

    seeds = Seeds(0)
    calls = [seeds.sampling(version, rank, evaluation) for version in range(50) for rank in range(8)
             for evaluation in (False, True)]
    starts = sorted(s for call in calls for s in Seeds.requests(call, 64))
    assert len(starts) == 50 * 8 * 2 * 64
    assert min(b - a for a, b in itertools.pairwise(starts)) > 1024  # room for 1,024 samples per prompt
    assert 0 <= starts[0] and starts[-1] + 1024 < 2**63  # inside vLLM's int64
    assert Seeds.requests(7, 3) == Seeds.requests(7, 3)


def test_the_preflight_passes_a_model_vllm_can_start_and_names_what_it_cannot(tiny_model, tmp_path):
    import vllm

    from evolrl.models import model_config
    from evolrl.rollout.vllm_preflight import preflight

    config = model_config(tiny_model)
    config.save_pretrained(tmp_path / "ok")
    assert preflight(str(tmp_path / "ok"), 0.2) == vllm.__version__
    unknown = json.loads((tmp_path / "ok" / "config.json").read_text()) | {"architectures": ["NoSuchForCausalLM"]}
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps(unknown))
    with pytest.raises(ValueError, match=r"no model class for the policy's architecture \['NoSuchForCausalLM'\]"):
        preflight(str(tmp_path / "unknown"), 0.2)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    with pytest.raises(ValueError, match="could not read the policy's configuration"):
        preflight(str(tmp_path / "broken"), 0.2)


def test_a_policy_without_architectures_is_written_with_its_causal_lm_class(tiny_model, tmp_path):
    """A model loaded from a GGUF file (the packaged SmolLM2) has ``config.architectures = None``."""
    from evolrl.rollout.vllm_preflight import preflight, write_config

    policy = load_policy(tiny_model)
    policy.config.architectures = None
    write_config(policy, str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert policy.config.architectures is None  # the policy's own config is left as it was
    preflight(str(tmp_path), 0.2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_preflight_refuses_more_gpu_memory_than_is_free(tiny_model, tmp_path):
    from evolrl.models import model_config
    from evolrl.rollout.vllm_preflight import preflight

    model_config(tiny_model).save_pretrained(tmp_path)
    free = torch.cuda.mem_get_info()[0]
    held = torch.empty(int(free * 0.5), dtype=torch.uint8, device="cuda")  # the trainer's models, say
    try:
        with pytest.raises(ValueError, match="gpu_memory_utilization=0.9 asks vLLM for"):
            preflight(str(tmp_path), 0.9)
    finally:
        del held


def test_a_tied_qwen3_reaches_the_engine_after_every_push(tiny_model, tmp_path):
    """Qwen3-4B ties its input and output embeddings: the push streams the one tensor under both names, and the
    engine must sample with the trained value of it (the output layer included) after an update."""

    model_dir = tied_qwen3(tmp_path / "qwen3", tiny_model)
    tokenizer = load_tokenizer(model_dir)
    policy = load_policy(model_dir).to(DEVICE)
    assert policy.lm_head.weight is policy.model.embed_tokens.weight
    engine = VLLMEngine(dtype="float32", enforce_eager=True, kv_cache_gib=0.1, max_model_len=128,
                        gpu_memory_utilization=0.2)
    engine.setup(tokenizer)
    engine.load_weights(policy)
    prompts = [Prompt("a", "What is 3 + 4?")]
    ids = [render_prompt(tokenizer, prompts[0].question, None)]
    sampling = Sampling(max_new_tokens=8)
    assert sampler_logprob_gap(engine, policy, prompts, prompt_ids=ids, sampling=sampling, n=4, seed=1) < TOLERANCE
    with torch.no_grad():  # move the shared embedding only: the output layer moves with it
        policy.model.embed_tokens.weight.add_(0.5 * torch.randn_like(policy.model.embed_tokens.weight))
    gap = sampler_logprob_gap(engine, policy, prompts, prompt_ids=ids, sampling=sampling, n=4, seed=1)
    assert gap > 100 * TOLERANCE
    engine.load_weights(policy)
    assert sampler_logprob_gap(engine, policy, prompts, prompt_ids=ids, sampling=sampling, n=4, seed=1) < TOLERANCE
