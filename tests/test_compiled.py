"""Batching.compile_blocks: each decoder block's forward through torch.compile (evolrl/logprobs/compiled.py).

The compiled blocks must give the uncompiled log-probs, entropies and gradients (float32: inductor's fused kernels
sum in another order, so equal to ~1e-6 of each tensor's scale, not bit for bit), serve packed passes of any number
of sequences without a new trace each time, and leave the state dict's keys as they were.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from helpers import assert_same, fit, logprobs_and_grads, mixed_sequences, one_process_group
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

from evolrl.logprobs import Passes
from evolrl.logprobs.compiled import check_compiler, compile_blocks
from evolrl.logprobs.forward import sequence_logprobs
from evolrl.logprobs.packing import packed_logprobs
from evolrl.logprobs.sequences import Sequences
from evolrl.logprobs.sequencewise_attention import SEQUENCEWISE_SDPA
from evolrl.rollout import Sampling
from evolrl.settings import SettingError
from evolrl.training import Batching, GRPOLoss, GRPOUpdate
from evolrl.training.build import Dtypes, build_models

pytestmark = pytest.mark.slow  # compiling a block takes ~10-30 s on 2 cores


def test_compiled_blocks_give_the_uncompiled_logprobs_and_gradients(tiny_model):
    """Packed (sequence-wise attention, left out of the graph) and padded passes, under gradient checkpointing (the
    recomputation calls the compiled block again); then a packed row of another length and count of sequences."""
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=SEQUENCEWISE_SDPA)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    keys = list(model.state_dict())
    seqs = mixed_sequences(model.config.vocab_size)
    fewer = Sequences(seqs.input_ids[:3], seqs.attention_mask[:3], response_mask=seqs.response_mask[:3],
                      advantages=seqs.advantages[:3])
    cases = [(packed_logprobs, seqs), (sequence_logprobs, seqs), (packed_logprobs, fewer)]
    eager = [logprobs_and_grads(model, f, s) for f, s in cases]
    compile_blocks(model)
    counters.clear()
    compiled = [logprobs_and_grads(model, f, s) for f, s in cases]
    assert counters["stats"]["unique_graphs"] > 0, dict(counters["stats"])  # the blocks did run compiled
    for (_, s), c, e in zip(cases, compiled, eager):  # float32, summation order: 1e-5 relative, 1e-6 of the largest
        assert_same(c, e, s.response_mask, rtol=1e-5, scale=1e-6)
    assert list(model.state_dict()) == keys  # checkpoints and weight syncs see the same names


def test_a_compiled_packed_run_gives_the_uncompiled_losses(tiny_model):
    """Through Lightning and the module's build (policy and reference compiled): one step, the same losses."""
    runs = []
    for compiled in (False, True):
        torch._dynamo.reset()
        settings = {"max_tokens_per_micro_batch": 250, "packed": True, "compile_blocks": compiled}
        module, _, recorder = fit(tiny_model, module_kwargs=settings, sampling=Sampling(max_new_tokens=12))
        runs.append(recorder.losses)
        blocks = module.policy.model.layers
        assert all(("forward" in vars(block)) == compiled for block in blocks)  # the instance's compiled forward
    # float32 rounding through one optimizer step's losses; both runs sample from the same seed, and the compiled
    # blocks' rounding (~1e-6 of a probability) would change a sampled token only at a boundary that close
    assert runs[1] == pytest.approx(runs[0], rel=1e-4)


def test_compiled_blocks_under_fsdp2_give_the_uncompiled_update(tiny_model):
    """The GPU run's build on a CPU: FSDP2 over a one-process gloo mesh, blocks compiled after sharding (FSDP2's
    gathers stay outside the graphs), gradient checkpointing, packed passes, KL to the reference; one update with
    SGD (parameters linear in the gradients). float32: equal to float rounding."""
    from torch.distributed.device_mesh import init_device_mesh

    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        with one_process_group("gloo"):
            policy, reference = build_models(tiny_model, Dtypes.resolve("32-true", "float32"), with_reference=True,
                                             mesh=init_device_mesh("cpu", (1,)), gradient_checkpointing=True,
                                             passes=Passes(packed=True, compiled=compiled))
            optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
            update = GRPOUpdate(GRPOLoss(kl_coef=0.05), Batching(mini_batch_size=4, max_tokens_per_micro_batch=64,
                                                                 packed=True, compile_blocks=compiled),
                                max_grad_norm=1.0)
            counters.clear()
            stats = update(policy, reference, mixed_sequences(policy.config.vocab_size), temperature=0.7,
                           optimizer=optimizer, scheduler=scheduler)
            assert (counters["stats"]["unique_graphs"] > 0) == compiled
            results.append((stats, {n: p.full_tensor().detach().clone() for n, p in policy.named_parameters()}))
    (stats, params), (compiled_stats, compiled_params) = results
    assert compiled_stats == pytest.approx(stats, rel=1e-4, abs=1e-7)
    for name, value in params.items():
        torch.testing.assert_close(compiled_params[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_one_trace_serves_every_layer():
    """A model of 3 blocks compiles as many graphs as one of 1 block: the blocks share their traces (with a trace
    per block a large model would run past dynamo's limit and fall back to uncompiled blocks)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    graphs = []
    for layers in (1, 3):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = compile_blocks(LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                            num_hidden_layers=layers, num_attention_heads=4,
                                                            num_key_value_heads=2)))
        counters.clear()
        with torch.no_grad():
            for length in (7, 9):  # a second length: the symbolic trace
                model(torch.arange(length)[None] % 64, use_cache=False)  # as the update calls it
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] > 0, graphs


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_projections_of_one_input_run_as_one_matmul(tiny_model, family):
    """q, k, v and gate, up: one matmul per group forward and two backward, so 9 fewer per block than eager (7
    projections: 7 forward + 14 backward; fused: 4 + 8). Qwen2's q, k, v carry biases (addmm, biases concatenated
    too). float32: the same numbers up to summation order."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch._dynamo.reset()
    if family == "llama":
        model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa")
    else:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2))
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    seqs = mixed_sequences(model.config.vocab_size)

    def matmuls():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = logprobs_and_grads(model, sequence_logprobs, seqs)
        return result, sum(1 for e in prof.events() if e.name in ("aten::mm", "aten::addmm"))

    eager, eager_calls = matmuls()
    compile_blocks(model)
    logprobs_and_grads(model, sequence_logprobs, seqs)  # compiles
    compiled, calls = matmuls()
    assert calls == eager_calls - 9 * model.config.num_hidden_layers, (calls, eager_calls)
    assert_same(compiled, eager, seqs.response_mask, rtol=1e-5, scale=1e-6)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_machine_that_cannot_compile_is_refused_at_start(monkeypatch, device):
    """No C++ compiler on a CPU, no Triton on a GPU: refused with the key before any step, not inside one."""
    import torch._inductor.config
    import torch._inductor.cpp_builder
    import torch.utils._triton

    monkeypatch.setattr(torch._inductor.cpp_builder, "cpp_compiler_search",
                        torch._inductor.cpp_builder.cpp_compiler_search.__wrapped__)  # not its cached answer
    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: False)
    missing = "CPU without a C\\+\\+ compiler" if device == "cpu" else "GPU without Triton"
    refused = r"Batching\.compile_blocks=True is not allowed: false on a " + missing
    with torch._inductor.config.patch({"cpp.cxx": ("evolrl-test-no-such-compiler",)}), pytest.raises(
            SettingError, match=refused):
        check_compiler(torch.device(device))
    if device == "cpu":
        check_compiler(torch.device("cpu"))  # this machine has one


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_blocks_on_a_gpu_in_bf16(tiny_model):
    """On CUDA inductor generates Triton kernels: the same numbers as the uncompiled bf16 autocast pass within bf16
    rounding (2^-8 relative, a few roundings deep)."""
    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=SEQUENCEWISE_SDPA).cuda()
    seqs = mixed_sequences(model.config.vocab_size)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = logprobs_and_grads(model, packed_logprobs, seqs, "cuda")
        compile_blocks(model)
        compiled = logprobs_and_grads(model, packed_logprobs, seqs, "cuda")
    assert_same(compiled, eager, seqs.response_mask.cuda(), rtol=2e-2, scale=2e-2)


PLAIN_COMPILE = torch.compile


def recorded_graphs(monkeypatch) -> list:
    """From here on (dynamo's caches reset) ``torch.compile`` hands each graph dynamo traces to the list returned, with
    whether gradients were on as it traced, and runs the graph uncompiled (the blocks' compile options dropped)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append((gm, torch.is_grad_enabled()))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn, dynamic, options=None: PLAIN_COMPILE(fn, dynamic=dynamic,
                                                                                         backend=record))
    torch._dynamo.reset()
    return graphs


def test_under_fsdp2_a_compiled_block_takes_its_modules_integers_as_constants(tiny_model, monkeypatch):
    """FSDP2 makes a block's modules FSDP-managed, whose integer attributes dynamo would trace as symbols (the
    attention's head width: a symbolic head count, which inductor's FlexAttention lowering fails on). Recorded
    graphs of a packed forward under a one-process gloo mesh: no integer input comes from the module (``l_self_*``),
    the lengths stay symbolic, and as many graphs are traced as with dynamo's default (``GUARDED`` undone), which
    took the head width as an input."""
    from torch.distributed.device_mesh import init_device_mesh

    from evolrl.logprobs import compiled, varlen

    def traced(guarded: bool) -> list:
        monkeypatch.setattr(compiled, "GUARDED", compiled.GUARDED if guarded else (lambda forward: forward))
        graphs = recorded_graphs(monkeypatch)
        with one_process_group("gloo"):
            policy, _ = build_models(tiny_model, Dtypes.resolve("32-true", "float32"), with_reference=False,
                                     mesh=init_device_mesh("cpu", (1,)), gradient_checkpointing=False,
                                     passes=Passes(packed=True, compiled=True))
            with torch.no_grad():
                packed_logprobs(policy, mixed_sequences(policy.config.vocab_size), temperature=1.0, chunk_size=16)
        return [[n.name for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("example_value"),
                                                                                      torch.SymInt)]
                for gm, _ in graphs]

    guarded, default = traced(True), traced(False)
    assert len(guarded) == len(default) > 0
    assert any(guarded)  # the row's length is a symbol
    assert not [s for symbols in guarded for s in symbols if s.lower().startswith("l_self")], guarded
    if not varlen.available():  # what GUARDED changes, met by the per-sequence path (sdpa reads the head width)
        assert [s for symbols in default for s in symbols if s.lower().startswith("l_self")]


def test_a_checkpointed_training_pass_runs_its_blocks_compiled(tiny_model, monkeypatch):
    """With gradient checkpointing a training pass's blocks run compiled, whichever transformers checkpoints them
    (in ``__call__``, or, from about 5.20, in a wrapper around the class's ``forward``, which traced whole ran the
    blocks eagerly: a graph break inside a checkpoint). Recorded graphs: one with a block's projection weights
    among its inputs is traced with gradients on (the training pass; the checkpoint's recomputation calls it too)."""
    graphs = recorded_graphs(monkeypatch)
    policy, _ = build_models(tiny_model, Dtypes.resolve("32-true", "float32"), with_reference=False,
                             gradient_checkpointing=True, passes=Passes(packed=True, compiled=True))
    policy.train()
    logp, _ = packed_logprobs(policy, mixed_sequences(policy.config.vocab_size), temperature=1.0, chunk_size=16)
    logp.sum().backward()
    traced = [(grad, any("q_proj" in n.name for n in gm.graph.nodes if n.op == "placeholder")) for gm, grad in graphs]
    assert (True, True) in traced, traced
    assert all(p.grad is not None for p in policy.parameters() if p.requires_grad)
