"""tools.bench.update_profile: the busy-time arithmetic and the GPU's idle time by hand, the named shapes."""

from __future__ import annotations

import json

import pytest
import torch

from evolrl.models import load_policy
from tools.bench.update_profile import QWEN3, covered, kernel_summary, write_random_model


def test_covered_counts_overlaps_once():
    assert covered([]) == 0
    assert covered([(0, 2), (1, 3)]) == 3  # overlapping: [0, 3]
    assert covered([(5, 6), (0, 1), (0.5, 0.75)]) == 2  # nested and unsorted
    assert covered([(0, 1), (1, 2), (4, 6)]) == 4  # touching, then a gap


def test_kernel_summary_by_hand():
    # two streams: gemm [0, 400] us and [300, 500] us overlap; a norm kernel [600, 700] us; wall 1 ms
    kernels = [("gemm", 0.0, 400.0), ("gemm", 300.0, 500.0), ("norm", 600.0, 700.0)]
    s = kernel_summary(kernels, launches=3, wall_s=1e-3, top=5)
    assert s["busy_s"] == pytest.approx(600e-6) and s["busy_fraction"] == pytest.approx(0.6)
    assert s["launches"] == 3 and s["kernels"] == 3
    (name, calls, seconds, share), second = s["top"]
    assert (name, calls) == ("gemm", 2) and seconds == pytest.approx(600e-6) and share == pytest.approx(1.0)
    assert second[:2] == ("norm", 1)
    assert kernel_summary(kernels, 3, wall_s=1e-4, top=5)["busy_fraction"] == 1.0  # capped: profiler-free wall


def test_named_shapes_are_qwen3s_published_sizes(tmp_path, monkeypatch):
    """Parameter counts of the named shapes against the published sizes (0.6B ... 8B), built on the meta device; and
    one written with random weights loads as the policy (the smallest, shrunk to 2 layers to keep it quick)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tools.commands.gpu_budget import QWEN3_COMMON

    published = {"qwen3-0.6b": 0.6e9, "qwen3-1.7b": 1.7e9, "qwen3-4b": 4.0e9, "qwen3-8b": 8.2e9}
    for name, fields in QWEN3.items():
        with torch.device("meta"):
            model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_COMMON, **fields))
        params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
        assert params == pytest.approx(published[name], rel=0.05), (name, params)
    monkeypatch.setitem(QWEN3, "qwen3-0.6b", {**QWEN3["qwen3-0.6b"], "num_hidden_layers": 2})
    directory = write_random_model("qwen3-0.6b", tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["tie_word_embeddings"] is True
    policy = load_policy(str(directory))
    assert policy.get_output_embeddings().weight is policy.get_input_embeddings().weight


def test_gpu_idle_is_charged_to_the_innermost_cpu_event_of_the_gap():
    """By hand, times in microseconds: kernels cover [0, 10] and [40, 50]; the CPU events span [0, 100]. The gap
    [10, 40] (middle 25) falls inside `cudaStreamSynchronize` inside `aten::item` inside `Optimizer.step` (a named
    region); the gap [50, 100] (middle 75) inside no event (`Optimizer.step` ended at 70): no operator. A second
    thread's event that began earlier and is still open at 25 (`autograd`, [5, 30]) is not the innermost."""
    from types import SimpleNamespace

    from tools.bench.update_profile import NO_OPERATOR, idle_by_cpu

    def event(name, start, end, parent=None):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), cpu_parent=parent)

    step = event("Optimizer.step", 0, 70)
    inner = event("aten::item", 20, 35, step)
    sync = event("cudaStreamSynchronize", 21, 34, inner)
    other_thread = event("autograd", 5, 30)
    idle = idle_by_cpu([(0, 10), (40, 50), (45, 48)], [sync, step, other_thread, inner, event("late", 95, 100)],
                       top=5)
    assert idle["operator"] == [(NO_OPERATOR, 50e-6), ("cudaStreamSynchronize", 30e-6)]
    assert idle["place"] == [(NO_OPERATOR, 50e-6), ("Optimizer.step", 30e-6)]
