"""tools.bench.update_profile: the busy-time arithmetic by hand, the named shapes; bench_update's operator count (the
CPU's launch proxy) on a real update."""

from __future__ import annotations

import json
import re
from functools import partial

import pytest
import torch
from helpers import mixed_sequences

from evolrl.logprobs import varlen
from evolrl.models import load_policy
from evolrl.training import Batching, GRPOLoss
from evolrl.training.optim import Optimization, build_optimizer, start_schedule
from evolrl.training.update import GRPOUpdate
from tools.bench.bench_update import operator_times
from tools.bench.update_profile import QWEN3, computes, covered, cpu_kernel_calls, kernel_summary, write_random_model


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


def test_operator_calls_of_a_real_update_and_fewer_with_packing(tiny_model):
    """The CPU's launch-count proxy (bench_update's operator table) on the tiny model: a packed update runs one row
    where the padded one runs three micro-batches, so it makes fewer calls; the table counts forward and backward."""
    counts = {}
    for packed in (False, True):
        policy = load_policy(tiny_model)
        batching = Batching(mini_batch_size=6, micro_batch_size=2, max_tokens_per_micro_batch=2000 if packed else None,
                            packed=packed)
        update = GRPOUpdate(GRPOLoss(kl_coef=0.0), batching, max_grad_norm=1.0)
        optimizer, scheduler = build_optimizer(list(policy.parameters()), Optimization())
        start_schedule(scheduler, 10)
        seqs = mixed_sequences(policy.config.vocab_size)
        table = operator_times(partial(update, policy, None, seqs, temperature=1.0, optimizer=optimizer,
                                       scheduler=scheduler), top=50)
        assert re.search(r"^\| mm \| \d+ \|", table, re.MULTILINE) and "_backward |" in table, table
        counts[packed] = int(re.search(r"; (\d+) operator calls", table).group(1))
    assert counts[True] < counts[False], counts


def test_kernel_calls_skip_views_and_allocations():
    assert all(computes(name) for name in ("aten::mm", "aten::add_", "aten::copy_", "aten::_to_copy",
                                            "graph_0_cpp_fused_add_mul_0"))
    assert not any(computes(name) for name in ("aten::view", "aten::t", "aten::transpose", "aten::detach", "aten::to",
                                               "aten::empty", "aten::_unsafe_view", "aten::result_type"))


def test_a_multi_tensor_operator_is_one_kernel_call():
    """Gradient clipping's norms and scaling: a CPU runs ``_foreach_norm`` as one norm per tensor, a GPU as
    multi-tensor kernels; the count takes each multi-tensor operator once, whatever it calls inside."""
    grads = [torch.randn(4, 4) for _ in range(5)]
    total, calls = cpu_kernel_calls(lambda: torch._foreach_mul_(grads, torch._foreach_norm(grads)[0]), top=10)
    assert total == 2 and {c[0] for c in calls} == {"aten::_foreach_norm", "aten::_foreach_mul_"}, calls
    total, calls = cpu_kernel_calls(lambda: [torch.linalg.vector_norm(g) for g in grads], top=10)
    assert total == 5 and calls[0][:2] == ("aten::linalg_vector_norm", 5), calls  # the loop: one per tensor


@pytest.mark.skipif(not varlen.available(), reason="this torch has no varlen attention op")
def test_varlen_attention_counts_as_a_gpus_flash_kernels():
    """Torch's varlen op is one flash kernel forward and three backward on a GPU, whatever the project's CPU kernel
    runs inside it (a call per sequence, reported apart): three sequences in a row."""
    from tools.bench.update_profile import GPU_LAUNCHES, cpu_kernel_profile

    q, k, v = (torch.randn(10, heads, 8, requires_grad=True) for heads in (4, 2, 2))
    cu = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
    _, calls, _, stand_in = cpu_kernel_profile(lambda: varlen.attend(q, k, v, cu, 5, 0.3).sum().backward(), 20)
    calls = {name: n for name, n, _ in calls}
    assert {name: calls[name] for name in GPU_LAUNCHES} == GPU_LAUNCHES, calls
    assert not any("flash_attention_for_cpu" in name for name in calls), calls
    assert stand_in >= 3, stand_in  # at least the forward's three per-sequence flash calls


@pytest.mark.slow
def test_kernel_calls_of_a_function_and_of_its_compiled_form():
    """The CPU's launch proxy counts what compiled code runs: the matmul stays a library call, the rest fuses."""
    import torch._inductor.config

    weight, x = torch.randn(16, 16), torch.randn(8, 16)

    def f(x):
        return (x @ weight.t()).relu().mul(2).sum(-1)  # t() is a view: no kernel

    total, calls = cpu_kernel_calls(lambda: f(x), top=10)
    assert total >= 3 and ("aten::mm", 1) in [c[:2] for c in calls] and not any("fused" in c[0] for c in calls), calls
    # inductor's own patch, undone on exit (monkeypatch's undo deleted the key: later compiles in the process failed)
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):
        compiled = torch.compile(f, dynamic=True)
        compiled(x)
        total_compiled, calls = cpu_kernel_calls(lambda: compiled(x), top=10)
    assert sorted(c[:2] for c in calls) == [("aten::mm", 1), ("compiled (cpp_fused_*)", 1)], calls
    assert total_compiled == 2 < total


def test_named_shapes_are_qwen3s_published_sizes(tmp_path, monkeypatch):
    """Parameter counts of the named shapes against the published sizes (0.6B ... 8B), built on the meta device; and
    one written with random weights loads as the policy (the smallest, shrunk to 2 layers to keep it quick)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tools.bench.update_profile import QWEN3_COMMON

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


def test_kernel_calls_by_where_they_ran():
    """Every call is placed once; the second backward adds into the existing ``.grad`` of each of the layer's two
    parameters (the first backward assigns them), a custom function's forward is named by its class."""
    from tools.bench.update_profile import cpu_kernel_profile

    layer, x = torch.nn.Linear(4, 4), torch.randn(3, 4)

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * a

        @staticmethod
        def backward(ctx, grad):
            return grad

    def two_backwards():
        for _ in range(2):
            Square.apply(layer(x)).sum().backward()

    total, _, places, _ = cpu_kernel_profile(two_backwards, top=10)
    places = dict(places)
    assert sum(places.values()) == total, places
    assert places["backward of torch::autograd::AccumulateGrad"] == 2, places
    assert places["Square"] == 2 and places["backward of AddmmBackward0"] >= 2, places


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
