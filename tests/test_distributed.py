"""Two CPU processes with FSDP2 (Lightning's ModelParallelStrategy, gloo), and the per-rank prompt split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import tied_qwen3

from evolrl.data.loader import PromptLoader
from evolrl.rollout import Seeds

ROOT = Path(__file__).parent.parent


def test_each_rank_gets_disjoint_whole_batches():
    items = list(range(11))
    loaders = [PromptLoader(items, 2, list, seeds=Seeds(3), rank=r, world_size=2) for r in (0, 1)]
    assert [len(loader) for loader in loaders] == [2, 2]  # 11 // (2 * 2)
    batches = [list(loader) for loader in loaders]
    seen = [i for per_rank in batches for batch in per_rank for i in batch]
    assert len(seen) == len(set(seen)) == 8
    single = list(PromptLoader(items, 2, list, seeds=Seeds(3)))
    assert batches[0][0] == single[0] and batches[1][0] == single[1]  # the same shuffled order, dealt out


def fsdp_ranks(out: Path, model: str, *args: str) -> list[dict]:
    """Run ``tests/fsdp_ranks.py``; the per-rank reports."""
    launcher = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in launcher}, "HF_HUB_OFFLINE": "1"}  # a fresh group
    result = subprocess.run([sys.executable, "tests/fsdp_ranks.py", model, str(out), *args],
                            check=False, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny_model):
    """3 steps on 2 FSDP ranks, a sharded checkpoint after each, then an evaluation: (output dir, reports)."""
    out = tmp_path_factory.mktemp("fsdp")
    return out, fsdp_ranks(out, tiny_model, "--checkpoints")


def test_fsdp_on_two_processes_ends_with_identical_full_weights_in_the_engine(two_ranks):
    _, ranks = two_ranks
    assert [r["world_size"] for r in ranks] == [2, 2]
    for report in ranks:
        assert report["sharded_params"] > 0
        assert report["local_numel"] * 2 == report["full_numel"]  # really sharded
        assert report["engine_received"] == report["final"]  # the engine got the gathered final weights
        assert report["engine_version"] == 3 and len(report["prompts"]) == 3
    assert ranks[0]["final"] == ranks[1]["final"]
    assert not set(ranks[0]["prompts"]) & set(ranks[1]["prompts"])  # groups never span ranks


def weights_digest(model_dir: str, dtype: torch.dtype = torch.float32, linear_only: bool = False) -> str:
    """Digest (fsdp_ranks') of the model's weights as loaded whole, in ``dtype`` (``linear_only``: only the linear
    weights, as the KL reference stores them: ``build.parameters_in``), read back in float32."""
    from evolrl.models import load_policy
    from evolrl.training.build import parameters_in
    from fsdp_ranks import digest

    model = parameters_in(load_policy(model_dir), str(dtype).removeprefix("torch."), linear_only=linear_only)
    return digest({k: v.float() for k, v in model.state_dict().items()})


def test_every_rank_receives_its_shards_of_the_file_weights_from_rank_0(two_ranks, tiny_model):
    _, ranks = two_ranks
    loaded = weights_digest(tiny_model)
    for report in ranks:  # built on the meta device, filled from rank 0's copy: exactly the file's weights
        assert report["initial"] == report["reference"] == loaded
        assert report["reference_dtype"] == report["policy_dtype"] == report["compute_dtype"] == "torch.float32"


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory, tiny_model):
    """Scripted first step under bf16-mixed, on 2 FSDP ranks and in 1 process: {devices: (reports, gradients)}."""
    runs = {}
    for devices, per_step in ((2, 1), (1, 2)):
        out = tmp_path_factory.mktemp(f"bf16-devices{devices}")
        reports = fsdp_ranks(out, tiny_model, "--scripted", "--precision", "bf16-mixed", "--devices", str(devices),
                             "--prompts-per-step", str(per_step))
        runs[devices] = reports, torch.load(out / "grads.pt")
    return runs


def test_bf16_fsdp_computes_with_bf16_copies_of_float32_master_weights(bf16_runs, tiny_model):
    ranks, _ = bf16_runs[2]
    for report in ranks:
        assert report["compute_dtype"] == "torch.bfloat16"  # FSDP all-gathered bf16 copies for the forward
        assert report["policy_dtype"] == report["grad_dtype"] == "torch.float32"  # the shards the optimizer updates
        assert report["initial"] == weights_digest(tiny_model)  # not rounded to bf16
        assert report["reference_dtype"] == "torch.bfloat16"  # its linear weights; embeddings and norms as loaded
        assert report["reference_embedding_dtype"] == "torch.float32"
        assert report["reference"] == weights_digest(tiny_model, torch.bfloat16, linear_only=True)
    single, _ = bf16_runs[1]  # one process: autocast on the float32 policy; the reference in bf16 as well
    assert single[0]["compute_dtype"] == "torch.float32" and single[0]["reference_dtype"] == "torch.bfloat16"


def test_two_bf16_fsdp_ranks_give_the_single_process_gradient_up_to_bf16_rounding(bf16_runs):
    (_, sharded), (_, single) = bf16_runs[2], bf16_runs[1]
    assert sharded.keys() == single.keys()
    for name, g in single.items():
        # bf16 keeps 8 significant bits: each rounding is off by up to 2^-8 ~ 4e-3 (relative). FSDP's bf16 copies
        # also round the weights, embeddings and residual stream that one process under autocast keeps in float32
        # (it rounds only matmul inputs); over the ~20 roundings between a weight and the loss (2 blocks, forward
        # and backward) the differences add up like a random walk: measured <= 2e-2 per tensor, as large as one
        # process's own bf16-vs-float32 gradient difference (1.2e-2). 5e-2 still fails a wrong gradient scale or a
        # rank's missing data (0.5 or more). Elementwise tolerances would trip on near-zero entries: norms instead.
        error = (sharded[name] - g).norm() / g.norm()
        assert error < 5e-2, f"{name}: relative error {error:.2e}"


def test_evaluation_is_split_across_ranks_and_each_problem_counted_once(two_ranks):
    _, ranks = two_ranks
    evaluated = [set(r["evaluated"]) for r in ranks]
    assert len(evaluated[0]) == len(evaluated[1]) == 3  # 5 problems dealt to 2 ranks (one padded repeat)
    assert len(evaluated[0] | evaluated[1]) == 5
    table = ranks[0]["eval_table"]["add"]
    assert table["problems"] == 5 and table["samples"] == 2 and 0 <= table["pass@1"] <= table["pass@2"] <= 1
    assert ranks[1]["eval_table"] == ranks[0]["eval_table"]  # every rank reports the same numbers


def test_resuming_a_sharded_checkpoint_gives_the_uninterrupted_weights(two_ranks, tiny_model, tmp_path):
    out, ranks = two_ranks
    checkpoint = out / "checkpoints" / "step=2.ckpt"
    assert checkpoint.is_dir() and (checkpoint / "meta.pt").is_file()  # ModelParallelStrategy's sharded format
    resumed = fsdp_ranks(tmp_path, tiny_model, "--resume", str(checkpoint))
    for before, after in zip(ranks, resumed):
        assert after["prompts"] == before["prompts"][2:]  # only the third step is trained again
        assert after["engine_version"] == 3
        assert after["final"] == before["final"]


def test_a_sharded_checkpoint_exports_to_the_final_weights(two_ranks, tmp_path):
    from transformers import AutoModelForCausalLM

    from evolrl.training.export import export_checkpoint

    out, ranks = two_ranks
    export_checkpoint(str(out / "checkpoints" / "step=3.ckpt"), str(tmp_path / "hf"), dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    from fsdp_ranks import digest

    assert digest(model.state_dict()) == ranks[0]["final"]


@pytest.mark.vllm
def test_one_vllm_engine_per_rank_samples_from_the_gathered_weights(tmp_path, tiny_model):
    pytest.importorskip("vllm")
    ranks = fsdp_ranks(tmp_path, tiny_model, "--engine", "vllm")
    for report in ranks:
        assert report["engine_version"] == 3 and report["engine_received"] == report["final"]
        assert report["engine_logprob_gap"] < 1e-4  # float32 engine and policy: ~5e-7 when the weights match
    assert ranks[0]["final"] == ranks[1]["final"]


def test_two_ranks_give_the_single_process_gradient_on_the_union_of_their_data(tmp_path, tiny_model):
    """1 prompt on each of 2 FSDP ranks vs both prompts in 1 process: the same first gradient."""
    grads = {}
    for devices, per_step in ((2, 1), (1, 2)):
        out = tmp_path / f"devices{devices}"
        fsdp_ranks(out, tiny_model, "--scripted", "--devices", str(devices), "--prompts-per-step", str(per_step))
        grads[devices] = torch.load(out / "grads.pt")
    assert grads[1].keys() == grads[2].keys()
    assert sum(g.abs().sum() for g in grads[1].values()) > 0
    for name, g in grads[1].items():
        torch.testing.assert_close(grads[2][name], g, rtol=1e-4, atol=1e-7, msg=name)


def test_token_budget_ranks_run_in_lockstep_and_give_the_single_process_weights(tmp_path, tiny_model):
    """Packed micro-batches under a token budget, responses whose lengths differ by prompt: the ranks split their
    mini-batches into different numbers of passes, and the one with fewer pads with filler passes. Both end with
    the same weights, which are those of one process with both ranks' prompts (plain SGD, so that the final
    weights compare as tightly as the gradients; AdamW would amplify float noise in near-zero gradients)."""
    args = ("--scripted", "--uneven", "--sgd", "--packed", "--max-tokens", "200")  # ~75 to ~200 tokens a sequence
    ranks = fsdp_ranks(tmp_path / "two", tiny_model, *args)
    single = fsdp_ranks(tmp_path / "one", tiny_model, *args, "--devices", "1", "--prompts-per-step", "2")
    assert ranks[0]["final"] == ranks[1]["final"]
    assert ranks[0]["passes"] == ranks[1]["passes"]  # per step and mini-batch: the same number of passes...
    assert any(f != [0] for r in ranks for f in r["fillers"])  # ...of which some were fillers on one rank
    assert all(f == [0] for f in single[0]["fillers"])
    expected = torch.load(tmp_path / "one" / "final.pt")
    final = torch.load(tmp_path / "two" / "final.pt")
    assert final.keys() == expected.keys()
    for name, weights in expected.items():
        torch.testing.assert_close(final[name], weights, rtol=1e-4, atol=1e-7, msg=name)


def test_a_sequence_mask_on_two_ranks_gives_the_single_process_weights_and_counts(tmp_path, tiny_model):
    """The mismatch correction under FSDP, with packed token-budget micro-batches of uneven lengths: sequences are
    masked on one rank and not the other (the scripted engine reports log-probs that make long third responses
    unlikely), the masked tokens stay in the global normalizer, and both ranks end with the weights of one process
    with both prompts. The mismatch numbers are summed over the ranks: every rank reports the one-process values."""
    args = ("--scripted", "--uneven", "--sgd", "--packed", "--max-tokens", "200", "--mismatch", "sequence_mask")
    ranks = fsdp_ranks(tmp_path / "two", tiny_model, *args)
    single = fsdp_ranks(tmp_path / "one", tiny_model, *args, "--devices", "1", "--prompts-per-step", "2")
    assert ranks[0]["final"] == ranks[1]["final"]
    masked = [step["mismatch/masked_seq_frac"] for step in single[0]["mismatch"]]
    assert any(0 < m < 1 for m in masked), masked  # some steps mask some sequences, not all
    for step, (one, r0, r1) in enumerate(zip(single[0]["mismatch"], ranks[0]["mismatch"], ranks[1]["mismatch"])):
        assert r0 == r1, step  # the same global numbers on every rank...
        assert r0.keys() == one.keys() and all(r0[k] == pytest.approx(v, rel=1e-5, abs=1e-9) for k, v in one.items())
    expected = torch.load(tmp_path / "one" / "final.pt")
    final = torch.load(tmp_path / "two" / "final.pt")
    for name, weights in expected.items():
        torch.testing.assert_close(final[name], weights, rtol=1e-4, atol=1e-7, msg=name)


def test_a_tied_qwen3_trains_checkpoints_resumes_and_exports_on_two_ranks(tmp_path, tiny_model):
    """Qwen3-4B ties its input and output embeddings. Under FSDP2 the tie must survive building on the meta device,
    sharding, training, the sharded (DCP) checkpoint, resuming and the export: one tensor, equal under both names."""
    from transformers import AutoModelForCausalLM

    from evolrl.training.export import export_checkpoint

    model = tied_qwen3(tmp_path / "qwen3", tiny_model)
    ranks = fsdp_ranks(tmp_path / "run", model, "--checkpoints")
    assert ranks[0]["initial"] == weights_digest(model) and ranks[0]["final"] == ranks[1]["final"]
    final = torch.load(tmp_path / "run" / "final.pt")
    assert torch.equal(final["lm_head.weight"], final["model.embed_tokens.weight"])
    assert ranks[0]["final"] != ranks[0]["initial"]  # it trained
    resumed = fsdp_ranks(tmp_path / "resume", model, "--resume", str(tmp_path / "run" / "checkpoints" / "step=2.ckpt"))
    assert [r["final"] for r in resumed] == [r["final"] for r in ranks]
    export_checkpoint(str(tmp_path / "run" / "checkpoints" / "step=3.ckpt"), str(tmp_path / "hf"), dtype="float32")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert exported.lm_head.weight is exported.model.embed_tokens.weight
    assert torch.equal(exported.lm_head.weight.detach(), final["lm_head.weight"])


def test_two_ranks_train_lora_adapters_on_a_frozen_sharded_base(tmp_path, tiny_model):
    """FSDP2 shards the frozen base and the float32 adapters alike; only the adapters move, both ranks end with the
    same merged weights, and the engine got them (the base with the adapters merged in). A sharded checkpoint keeps
    the whole state, and a run resumed from it ends with the uninterrupted run's weights."""
    ranks = fsdp_ranks(tmp_path / "run", tiny_model, "--lora", "--checkpoints")
    resumed = fsdp_ranks(tmp_path / "resumed", tiny_model, "--lora", "--resume",
                         str(tmp_path / "run" / "checkpoints" / "step=2.ckpt"))
    assert [r["final"] for r in resumed] == [r["final"] for r in ranks]
    assert [r["world_size"] for r in ranks] == [2, 2]
    for report in ranks:
        assert report["local_numel"] * 2 == report["full_numel"]  # the base is sharded too
        assert report["trainable"] and all(".lora_" in name for name in report["trainable"])
        assert report["base_unchanged"]
        assert report["engine_received"] == report["final"]
    assert ranks[0]["final"] == ranks[1]["final"]
    assert ranks[0]["final"] != weights_digest(tiny_model)  # the adapters changed the policy


def test_dynamic_sampling_on_two_ranks_agrees_on_rounds_and_groups(tmp_path, tiny_model):
    """Only even-numbered prompts' groups disagree (``fsdp_ranks --dynamic-sampling``): each rank keeps its own number
    per round, yet both take the same rounds and train as many groups (no collective waits), all of them kept ones
    unless no rank kept any."""
    ranks = fsdp_ranks(tmp_path, tiny_model, "--dynamic-sampling", "3", "--prompts-per-step", "2")
    steps = [[{k: v for k, v in step.items() if k.startswith("dynamic")} for step in r["mismatch"]] for r in ranks]
    assert [len(s) for s in steps] == [3, 3]
    for step0, step1 in zip(*steps):
        for key in ("dynamic_sampling/rounds", "dynamic_sampling/kept_groups"):
            assert step0[key] == step1[key]
    for report, per_step in zip(ranks, steps):
        trained = iter(report["prompts"])
        for step in per_step:
            kept = int(step["dynamic_sampling/kept_groups"])
            ids = [next(trained) for _ in range(kept or 2)]
            if kept:
                assert all(int(i.split("-")[1]) % 2 == 0 for i in ids), ids
    assert any(s["dynamic_sampling/rounds"] > 1 for s in steps[0])  # the check met extra rounds
