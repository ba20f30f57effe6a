"""Two CPU processes with FSDP2 (Lightning's ModelParallelStrategy, gloo), and the per-rank prompt split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from evolrl.data.loader import PromptLoader

TOOLS = Path(__file__).parent.parent / "tools"


def test_each_rank_gets_disjoint_whole_batches():
    items = list(range(11))
    loaders = [PromptLoader(items, 2, list, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert [len(loader) for loader in loaders] == [2, 2]  # 11 // (2 * 2)
    batches = [list(loader) for loader in loaders]
    seen = [i for per_rank in batches for batch in per_rank for i in batch]
    assert len(seen) == len(set(seen)) == 8
    single = list(PromptLoader(items, 2, list, seed=3))
    assert batches[0][0] == single[0] and batches[1][0] == single[1]  # the same shuffled order, dealt out


def test_fsdp_on_two_processes_ends_with_identical_full_weights_in_the_engine(tmp_path, tiny_model):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, str(TOOLS / "fsdp_check.py"), tiny_model, str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    for report in ranks:
        assert report["sharded_params"] > 0
        assert report["local_numel"] * 2 == report["full_numel"]  # really sharded
        assert report["engine_received"] == report["final"]  # the engine got the gathered final weights
        assert report["engine_version"] == 3 and len(report["prompts"]) == 3
    assert ranks[0]["final"] == ranks[1]["final"]
    assert not set(ranks[0]["prompts"]) & set(ranks[1]["prompts"])  # groups never span ranks


def test_two_ranks_give_the_single_process_gradient_on_the_union_of_their_data(tmp_path, tiny_model):
    """1 prompt on each of 2 FSDP ranks vs both prompts in 1 process: the same first gradient."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    grads = {}
    for devices, per_step in ((2, 1), (1, 2)):
        out = tmp_path / f"devices{devices}"
        cmd = [sys.executable, str(TOOLS / "fsdp_check.py"), tiny_model, str(out), "--scripted",
               "--devices", str(devices), "--prompts-per-step", str(per_step)]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        grads[devices] = torch.load(out / "grads.pt")
    assert grads[1].keys() == grads[2].keys()
    assert sum(g.abs().sum() for g in grads[1].values()) > 0
    for name, g in grads[1].items():
        torch.testing.assert_close(grads[2][name], g, rtol=1e-4, atol=1e-7, msg=name)
