"""Two CPU processes with FSDP2 (Lightning's ModelParallelStrategy, gloo), and the per-rank prompt split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evolrl.data.loader import PromptLoader
from evolrl.rollout import Seeds

TOOLS = Path(__file__).parent.parent / "tools"


def test_each_rank_gets_disjoint_whole_batches():
    items = list(range(11))
    loaders = [PromptLoader(items, 2, list, seeds=Seeds(3), rank=r, world_size=2) for r in (0, 1)]
    assert [len(loader) for loader in loaders] == [2, 2]  # 11 // (2 * 2)
    batches = [list(loader) for loader in loaders]
    seen = [i for per_rank in batches for batch in per_rank for i in batch]
    assert len(seen) == len(set(seen)) == 8
    single = list(PromptLoader(items, 2, list, seeds=Seeds(3)))
    assert batches[0][0] == single[0] and batches[1][0] == single[1]  # the same shuffled order, dealt out


def fsdp_check(out: Path, model: str, *args: str) -> list[dict]:
    """Run tools/fsdp_check.py; the per-rank reports."""
    launcher = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in launcher}, "HF_HUB_OFFLINE": "1"}  # a fresh group
    result = subprocess.run([sys.executable, str(TOOLS / "fsdp_check.py"), model, str(out), *args],
                            check=False, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny_model):
    """3 steps on 2 FSDP ranks, a sharded checkpoint after each, then an evaluation: (output dir, reports)."""
    out = tmp_path_factory.mktemp("fsdp")
    return out, fsdp_check(out, tiny_model, "--checkpoints")


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
    resumed = fsdp_check(tmp_path, tiny_model, "--resume", str(checkpoint))
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
    sys.path.insert(0, str(TOOLS))
    from fsdp_check import digest

    assert digest(model.state_dict()) == ranks[0]["final"]


@pytest.mark.vllm
def test_one_vllm_engine_per_rank_samples_from_the_gathered_weights(tmp_path, tiny_model):
    pytest.importorskip("vllm")
    ranks = fsdp_check(tmp_path, tiny_model, "--engine", "vllm")
    for report in ranks:
        assert report["engine_version"] == 3 and report["engine_received"] == report["final"]
        assert report["engine_logprob_gap"] < 1e-4  # float32 engine and policy: ~5e-7 when the weights match
    assert ranks[0]["final"] == ranks[1]["final"]


def test_two_ranks_give_the_single_process_gradient_on_the_union_of_their_data(tmp_path, tiny_model):
    """1 prompt on each of 2 FSDP ranks vs both prompts in 1 process: the same first gradient."""
    grads = {}
    for devices, per_step in ((2, 1), (1, 2)):
        out = tmp_path / f"devices{devices}"
        fsdp_check(out, tiny_model, "--scripted", "--devices", str(devices), "--prompts-per-step", str(per_step))
        grads[devices] = torch.load(out / "grads.pt")
    assert grads[1].keys() == grads[2].keys()
    assert sum(g.abs().sum() for g in grads[1].values()) > 0
    for name, g in grads[1].items():
        torch.testing.assert_close(grads[2][name], g, rtol=1e-4, atol=1e-7, msg=name)
