"""Padding-free packing and token-budget micro-batches: the same numbers as padded, fixed-count micro-batches."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import LENGTHS, assert_same, fit, logprobs_and_grads, mixed_sequences, run_update
from torch import nn

from evolrl.algorithms import SeqMeanTokenMean, TokenMean
from evolrl.logprobs.forward import sequence_logprobs
from evolrl.logprobs.packing import check_packing, packed_logprobs
from evolrl.logprobs.sequences import Sequences
from evolrl.logprobs.sequencewise_attention import SEQUENCEWISE_SDPA, use_sequencewise_attention
from evolrl.models import load_policy
from evolrl.rollout import Sampling
from evolrl.settings import SettingError
from evolrl.training import Batching, EvolRLModule, GRPOLoss, GRPOUpdate
from evolrl.training.plan import lockstep, micro_batch_plan, pass_tokens, token_budget_plan


@pytest.fixture(scope="module")
def policy(tiny_model):
    return load_policy(tiny_model)


@pytest.mark.parametrize("attention", ["sdpa", SEQUENCEWISE_SDPA, "eager"])
def test_packed_logprobs_entropy_and_gradients_equal_the_padded_path(tiny_model, attention):
    from transformers import AutoModelForCausalLM

    assert_packed_equals_padded(AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attention))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sequencewise_attention_on_a_gpu_equals_the_padded_path(tiny_model):
    """In float32 on CUDA the varlen op has no kernel (flash takes half precision only), so each sequence's causal
    sdpa call runs without a mask (memory-efficient kernels): float32 rounding, as on a CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=SEQUENCEWISE_SDPA).cuda()
    assert_packed_equals_padded(model, "cuda")


def test_the_gpu_backend_order_is_set_inside_and_restored_after(monkeypatch):
    """What a packed row's per-sequence calls run under on a GPU (the flags are global, so readable on a CPU): flash
    first, then memory-efficient, then cuDNN's, then math, in that priority (torch's own order on an H200 put cuDNN
    first; on this CPU build it is flash, memory-efficient, math, cuDNN); a torch that cannot order backends (before 2.6) gets cuDNN's left
    out instead; both undone on exit. The GPU test below checks the kernels that run."""
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends

    from evolrl.logprobs import sequencewise_attention as attention

    before = (torch._C._get_sdp_priority_order(), _cur_sdpa_kernel_backends())
    with attention._preferring(attention.GPU_BACKENDS):
        order = [SDPBackend(b) for b in torch._C._get_sdp_priority_order()]
        assert order[:4] == attention.GPU_BACKENDS == [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                       SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
        assert set(_cur_sdpa_kernel_backends()) == set(attention.GPU_BACKENDS)
    monkeypatch.setattr(attention, "ORDERED", False)
    with attention._preferring(attention.GPU_BACKENDS):
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert (torch._C._get_sdp_priority_order(), _cur_sdpa_kernel_backends()) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sequencewise_attention_on_a_gpu_runs_flash_not_cudnn(tiny_model):
    """A packed bf16 row runs flash attention, forward and backward, not cuDNN's, which torch's own order picks on a
    Hopper card and which builds a plan for every new length (docs/performance.md, on an H200: 16 sequences of new
    lengths, 1.8 s under cuDNN, 0.013 s under flash): through the varlen op where torch has it, else through the
    per-sequence sdpa calls under ``GPU_BACKENDS``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from evolrl.logprobs import varlen

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=SEQUENCEWISE_SDPA)
    model = model.to("cuda", torch.bfloat16)
    seqs = mixed_sequences(model.config.vocab_size).to("cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        logp, _ = packed_logprobs(model, seqs, temperature=1.0, chunk_size=16)
        logp[seqs.response_mask].float().sum().backward()
        torch.cuda.synchronize()
    ops = {e.name for e in prof.events() if e.device_type == DeviceType.CPU}
    kernels = {e.name for e in prof.events() if e.device_type == DeviceType.CUDA}
    attention = ({op for op in ops if "_varlen_attn" in op} if varlen.available()
                 else {op for op in ops if "scaled_dot_product" in op})
    assert attention and not any("cudnn" in op for op in attention), attention
    assert varlen.available() or "aten::_scaled_dot_product_flash_attention" in attention, attention
    assert any("flash_fwd" in k for k in kernels) and any("flash_bwd" in k for k in kernels), kernels
    assert not any("cudnn" in k.lower() for k in kernels), kernels


def assert_packed_equals_padded(model, device: str = "cpu") -> None:
    seqs = mixed_sequences(model.config.vocab_size)
    padded, packed = (logprobs_and_grads(model, f, seqs, device) for f in (sequence_logprobs, packed_logprobs))
    assert_same(packed, padded, seqs.response_mask.to(device), zero_outside=True)


def test_a_row_of_one_sequence_is_attended_whole(tiny_model):
    """A pass of one sequence (a long one goes alone) needs no split and no concatenation, forward or backward: the
    same numbers as the padded path; a row of several is split by the per-sequence loop, and by nothing where torch's
    varlen op attends the whole row in one call (``evolrl/logprobs/varlen.py``)."""
    from torch.profiler import profile
    from transformers import AutoModelForCausalLM

    from evolrl.logprobs import varlen

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=SEQUENCEWISE_SDPA)
    splits = []
    for rows in ([2], [0, 2]):
        seqs = mixed_sequences(model.config.vocab_size).select(rows)
        with profile() as prof:
            logp, _ = packed_logprobs(model, seqs, temperature=0.7, chunk_size=16)
            logp.sum().backward()
        splits.append(sum(event.name == "aten::split_with_sizes" for event in prof.events()))
        padded = sequence_logprobs(model, seqs, temperature=0.7, chunk_size=16)[0].detach()
        mask = seqs.response_mask  # float32 summation order
        torch.testing.assert_close(logp.detach()[mask], padded[mask], rtol=1e-5, atol=1e-5)
    assert splits[0] == 0 and (splits[1] == 0 if varlen.available() else splits[1] > 0)


class FullCausalMask(nn.Module):
    """The policy given an explicit all-ones attention mask: a plain causal mask over the whole packed row (in place
    of any mask the pass gives)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, position_ids, use_cache, logits_to_keep, **kwargs):
        kwargs.pop("attention_mask", None)
        return self.model(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache,
                          logits_to_keep=logits_to_keep, attention_mask=torch.ones_like(input_ids), **kwargs)

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()


def change_of_the_others(model, seqs: Sequences) -> float:
    """How far every other sequence's packed log-probs move when the first sequence's tokens change."""
    changed = seqs.input_ids.clone()
    changed[0, : int(seqs.lengths[0])] = (changed[0, : int(seqs.lengths[0])] + 17) % model.config.vocab_size
    with torch.no_grad():
        before = packed_logprobs(model, seqs, temperature=1.0, chunk_size=64)[0][1:]
        after = packed_logprobs(model, replace(seqs, input_ids=changed), temperature=1.0, chunk_size=64)[0][1:]
    return float((before - after).abs().max())


def test_packed_sequences_cannot_see_each_other(policy):
    seqs = mixed_sequences(policy.config.vocab_size)
    assert change_of_the_others(policy, seqs) < 1e-6  # block-diagonal: the others never saw the first sequence
    assert change_of_the_others(FullCausalMask(policy), seqs) > 1e-2  # the check sees a leak where there is one
    check_packing(policy)
    # the refusal gives the leak beside the noise floor (the same row twice): 0 on a CPU, whose kernels give the
    # same numbers for the same inputs in one process
    with pytest.raises(SettingError, match=r"Batching.packed=True is not allowed: .*a probe.*and by 0 when it did not"):
        check_packing(FullCausalMask(policy))
    odd = SimpleNamespace(config=SimpleNamespace(_attn_implementation="paged_attention"))
    with pytest.raises(SettingError, match=r"Batching.packed=True .*attention is 'paged_attention'"):
        check_packing(odd)


def test_sequencewise_attention_keeps_packed_sequences_apart_without_the_mask(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa")
    seqs = mixed_sequences(model.config.vocab_size)
    assert change_of_the_others(FullCausalMask(model), seqs) > 1e-2  # sdpa reads the (leaky) mask
    use_sequencewise_attention(model)
    assert model.config._attn_implementation == SEQUENCEWISE_SDPA
    # one sdpa call per sequence: the mask is never read, so even a leaky one keeps the sequences apart
    assert change_of_the_others(FullCausalMask(model), seqs) < 1e-6
    with torch.no_grad():  # every other pass is sdpa with its mask: padded log-probs as before
        torch.testing.assert_close(sequence_logprobs(model, seqs, temperature=0.7, chunk_size=16)[0],
                                   sequence_logprobs(load_policy(tiny_model), seqs, temperature=0.7, chunk_size=16)[0],
                                   rtol=0, atol=0)
    eager = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="eager")
    use_sequencewise_attention(eager)  # only sdpa is switched
    assert eager.config._attn_implementation == "eager"


def test_sequencewise_attention_keeps_sliding_windows(tiny_model):
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    vocab = AutoModelForCausalLM.from_pretrained(tiny_model).config.vocab_size
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, use_sliding_window=True,
                         sliding_window=4, layer_types=["sliding_attention", "full_attention"], max_window_layers=0,
                         attn_implementation=SEQUENCEWISE_SDPA)
    model = Qwen3ForCausalLM(config)
    seqs = mixed_sequences(vocab)
    mask = seqs.response_mask
    with torch.no_grad():  # sequences longer than the window: the sliding layer must still see only 4 keys
        padded, packed = (logprobs(model, seqs, temperature=1.0, chunk_size=16)[0]
                          for logprobs in (sequence_logprobs, packed_logprobs))
        torch.testing.assert_close(packed[mask], padded[mask], rtol=1e-5, atol=1e-5)
        model.config.sliding_window = 64  # the window matters here: a wider one gives other numbers
        other = sequence_logprobs(model, seqs, temperature=1.0, chunk_size=16)[0]
        assert (other[mask] - padded[mask]).abs().max() > 1e-3


def test_sequencewise_attention_under_autocast_casts_each_row_once_with_the_same_numbers():
    """Under bf16 autocast the row is cast before it is split; each sdpa call would have made the same cast of its
    own slice, so outputs and gradients are equal bit for bit (one machine, the same kernels either way)."""
    from torch.profiler import ProfilerActivity, profile
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from evolrl.logprobs.sequencewise_attention import PackedLengths, sequencewise_sdpa

    module = SimpleNamespace(is_causal=True, num_key_value_groups=1, training=False)
    lengths = [3, 5, 2]
    torch.manual_seed(0)
    rows = [torch.randn(1, 2, sum(lengths), 8, requires_grad=True) for _ in range(3)]  # float32 q, k, v

    def per_sequence(q, k, v):  # the cast inside every sdpa call, as autocast makes it
        parts = [sdpa_attention_forward(module, *x, None, is_causal=True)[0]
                 for x in zip(*(t.split(lengths, dim=2) for t in (q, k, v)))]
        return torch.cat(parts, dim=1)

    results = []
    for attend in (per_sequence, lambda q, k, v: sequencewise_sdpa(module, q, k, v, None,
                                                                   packed_lengths=PackedLengths(lengths))[0]):
        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.autocast("cpu", dtype=torch.bfloat16):
            out = attend(*rows)
        grads = torch.autograd.grad(out.float().square().sum(), rows)
        casts = sum(1 for e in prof.events() if e.name == "aten::_to_copy")
        results.append((out, grads, casts))
    (reference, reference_grads, per_call_casts), (out, grads, casts) = results
    assert out.dtype == torch.bfloat16 and torch.equal(out, reference)
    assert all(torch.equal(g, r) for g, r in zip(grads, reference_grads))
    assert casts == 3 < per_call_casts  # q, k, v once each, instead of once per sequence


def test_token_budget_plan_bins_each_mini_batch_under_the_budget():
    assert micro_batch_plan(7, 5, 3) == [[[0, 1, 2], [3, 4]], [[5, 6]]]  # by count: consecutive rows
    for packed in (False, True):
        plan = token_budget_plan(LENGTHS + [40], 4, budget=30, packed=packed)
        assert [sorted(r for micro in mini for r in micro) for mini in plan] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
        for micro in (micro for mini in plan for micro in mini):
            assert micro == sorted(micro)
            assert pass_tokens([(LENGTHS + [40])[r] for r in micro], packed) <= 30 or len(micro) == 1
        assert plan[-1] == [[8]]  # longer than the budget: alone
    assert token_budget_plan([14, 6, 21, 9], 4, 30, packed=True) == [[[2, 3], [0, 1]]]  # 21 + 9, 14 + 6
    assert token_budget_plan([14, 6, 21, 9], 4, 30, packed=False) == [[[2], [0, 3], [1]]]  # 2 x 14 fits, 3 x 14 not
    assert lockstep([[[0], []]], torch.device("cpu")) == [[[0], []]]  # one process: unchanged


@pytest.mark.parametrize("aggregation", [TokenMean(), SeqMeanTokenMean()], ids=repr)
def test_token_budget_and_packing_give_the_fixed_count_update(tiny_model, policy, aggregation):
    seqs = mixed_sequences(policy.config.vocab_size)
    runs = {name: run_update(tiny_model, seqs, loss={"aggregation": aggregation}, **settings) for name, settings in {
        "count": {"micro_batch_size": 2}, "count packed": {"micro_batch_size": 2, "packed": True},
        "budget": {"micro_batch_size": 1, "max_tokens_per_micro_batch": 45},
        "budget packed": {"micro_batch_size": 1, "max_tokens_per_micro_batch": 45, "packed": True},
        "budget packed, no-grad passes as large": {"micro_batch_size": 1, "max_tokens_per_micro_batch": 45,
                                                   "packed": True, "no_grad_pass_multiple": 1},
        "budget packed, no-grad passes 4x": {"micro_batch_size": 1, "max_tokens_per_micro_batch": 45, "packed": True,
                                             "no_grad_pass_multiple": 4}}.items()}
    plans = {name: plan for name, (plan, _, _) in runs.items()}
    assert plans["count"] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    # 45 tokens, lengths 14 6 21 9 | 17 7 11 25. Padded (rows x longest): 21+14 is 2 x 21 = 42, a third row 63.
    assert plans["budget"] == [[[0, 2], [1, 3]], [[7], [4, 6], [5]]]
    assert plans["budget packed"] == [[[0, 2, 3], [1]], [[4, 7], [5, 6]]]  # 21 + 14 + 9 = 44; 25 + 17 = 42
    _, expected_stats, expected = runs["count"]
    for name, (_, stats, params) in runs.items():
        assert stats.keys() == expected_stats.keys()
        for key, value in expected_stats.items():
            assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (name, key)
        for param, value in expected.items():  # steps of 4e-6 to 1e-3; float32 rounding leaves ~4e-9
            torch.testing.assert_close(params[param], value, rtol=1e-6, atol=1e-8, msg=f"{name}: {param}")
    initial = load_policy(tiny_model).state_dict()
    assert min(float((value - initial[param]).abs().max()) for param, value in expected.items()) > 1e-6


def test_passes_without_gradients_span_the_step_at_a_multiple_of_a_training_pass(tiny_model, policy):
    """The reference's and the old log-probs' passes: binned over the whole step (they run before any optimizer step),
    at ``no_grad_pass_multiple`` times the training pass's tokens or rows; fewer passes, the same rows each once."""
    seqs = mixed_sequences(policy.config.vocab_size)  # lengths 14 6 21 9 | 17 7 11 25

    def passes(rows=range(8), **settings):
        update = GRPOUpdate(GRPOLoss(), Batching(mini_batch_size=4, micro_batch_size=1, **settings), 1.0)
        return update.no_grad_plan(seqs, list(rows))

    budget = {"max_tokens_per_micro_batch": 45, "packed": True}
    # 90 tokens: 25 + 21 + 17 + 14 + 11 = 88, then 9 + 7 + 6, across the two mini-batches
    assert passes(**budget) == [[0, 2, 4, 6, 7], [1, 3, 5]]
    assert passes(**budget, no_grad_pass_multiple=1) == [[4, 7], [0, 2, 3], [1, 5, 6]]  # 42, 44, 24 tokens
    assert passes(rows=range(4, 8), **budget) == [[4, 5, 6, 7]]  # the second mini-batch's old log-probs: 60 tokens
    assert passes(max_tokens_per_micro_batch=45, packed=False) == [[2, 4, 7], [0, 1, 3, 5, 6]]  # 3 x 25, 5 x 14
    assert passes(no_grad_pass_multiple=3) == [[0, 1, 2], [3, 4, 5], [6, 7]]  # by count: 3 x micro_batch_size
    assert passes(rows=[], **budget) == []

    calls = []
    update = GRPOUpdate(GRPOLoss(kl_coef=0.05), Batching(mini_batch_size=4, micro_batch_size=1, **budget), 1.0)
    forward = update.forward
    update.forward = lambda model, part, *args, **kwargs: calls.append(torch.is_grad_enabled()) or forward(
        model, part, *args, **kwargs)
    trained, reference = load_policy(tiny_model), load_policy(tiny_model).eval().requires_grad_(False)
    optimizer = torch.optim.SGD(trained.parameters(), lr=1e-2)
    update(trained, reference, seqs, temperature=0.7, optimizer=optimizer,
           scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))
    # 4 training passes (21+14+9 | 6, 25+17 | 11+7); without gradients 2 reference passes + 1 of old log-probs
    assert calls.count(True) == 4 and calls.count(False) == 3


@pytest.mark.parametrize("packed", [False, True])
def test_a_filler_pass_adds_exactly_nothing(tiny_model, policy, packed):
    """What a rank with fewer micro-batches runs to stay in lockstep (plan.lockstep): loss and gradient exactly 0."""
    def with_fillers(plan):
        return lambda seqs: [[[], *mini, []] for mini in plan(seqs)]

    seqs = mixed_sequences(policy.config.vocab_size)
    settings = {"micro_batch_size": 1, "max_tokens_per_micro_batch": 45, "packed": packed}
    plan, stats, params = run_update(tiny_model, seqs, **settings)
    padded_plan, padded_stats, padded_params = run_update(tiny_model, seqs, with_fillers, **settings)
    assert padded_plan == [[[], *mini, []] for mini in plan]
    assert padded_stats == stats
    assert all(torch.equal(padded_params[name], value) for name, value in params.items())


@pytest.mark.parametrize(("settings", "message"), [
    ({"max_tokens_per_micro_batch": 0}, "Batching.max_tokens_per_micro_batch=0 is not allowed: an integer >= 1"),
    ({"max_tokens_per_micro_batch": 2.5}, "Batching.max_tokens_per_micro_batch=2.5 is not allowed: an integer"),
    ({"max_tokens_per_micro_batch": True}, "Batching.max_tokens_per_micro_batch=True is not allowed"),
    ({"packed": "yes"}, "Batching.packed='yes' is not allowed: true or false"),
    ({"fused_head": 1}, "Batching.fused_head=1 is not allowed: true or false"),
    ({"compile_blocks": "yes"}, "Batching.compile_blocks='yes' is not allowed: true or false"),
    ({"no_grad_pass_multiple": 0}, "Batching.no_grad_pass_multiple=0 is not allowed: an integer >= 1"),
])
def test_bad_batching_settings_are_refused_with_their_name(tiny_model, settings, message):
    with pytest.raises(SettingError, match=message.replace(".", r"\.").replace("(", r"\(")):
        EvolRLModule(tiny_model, batching=Batching(**settings))


def test_a_token_budget_replaces_the_micro_batch_count(tiny_model):
    batching = Batching(mini_batch_size=4, micro_batch_size=8, max_tokens_per_micro_batch=64)
    assert EvolRLModule(tiny_model, batching=batching).update.batching.max_tokens_per_micro_batch == 64  # unused
    with pytest.raises(SettingError, match="Batching.micro_batch_size=8 is not allowed: at most"):
        Batching(mini_batch_size=4, micro_batch_size=8)


def test_a_packed_token_budget_run_gives_the_padded_gradient(tiny_model):
    """Through Lightning: sampled responses of different lengths, one step, the accumulated gradients compared."""
    class Capture(L.Callback):
        def on_train_start(self, trainer, module):
            plan = module.update.plan
            module.update.plan = lambda seqs: self.__dict__.setdefault("plan", (plan(seqs), seqs.lengths.tolist()))[0]

        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.grads = {n: p.grad.clone() for n, p in module.policy.named_parameters()}

    runs = []
    for settings in ({}, {"max_tokens_per_micro_batch": 250, "packed": True}):
        capture = Capture()
        _, _, recorder = fit(tiny_model, module_kwargs=settings, sampling=Sampling(temperature=1.5, max_new_tokens=12),
                             callbacks=[capture])
        runs.append((capture.grads, recorder.losses, capture.plan))
    (grads, losses, (plan, lengths)), (packed_grads, packed_losses, (packed_plan, _)) = runs
    assert plan == [[[0, 1], [2, 3], [4, 5]]]  # 6 sequences, 2 per pass
    # the budget's plan for the lengths this machine sampled (~80 tokens each: 3 + 3 to a pass), fewer passes than 3
    assert len(set(lengths)) > 1 and packed_plan == token_budget_plan(lengths, 6, budget=250, packed=True), (
        lengths, packed_plan)
    assert len(packed_plan[0]) < len(plan[0]), (lengths, packed_plan)
    assert packed_losses == pytest.approx(losses, rel=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()), msg=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_packed_and_padded_differ_in_bf16_by_rounding_only(tiny_model, device):
    """A peaked model (output layer x8: logits up to ~77, mean log-prob ~ -16): packed and padded log-probs agree to
    1e-10 in float64 (packing is exact), and in bf16 each path is within bf16 rounding of the float64 answer.

    The bf16 tolerance: bf16 keeps 8 significant bits, so every rounding of the logits moves them by up to 2^-9 of
    their size, and a log-prob (a logit minus the log-sum-exp) carries a few such roundings from the layers below:
    2^-6 x the largest |logit| (1.2 here; measured on a CPU: largest error 0.68, mean 0.075). On a GPU the two
    paths run different kernels (a padded batch, one packed row per sequence), so they differ by up to twice that
    (a first GPU run saw 0.30, mean 0.037, on a peaked model); on a CPU they round nearly alike (0 on a Xeon with
    AMX, up to 0.002 on an EPYC with AVX-512 BF16, where the largest error against float64 was 0.68 too)."""
    results = {}
    for dtype in (torch.float64, torch.bfloat16):
        model = load_policy(tiny_model).to(device=device, dtype=dtype)
        with torch.no_grad():
            model.lm_head.weight.mul_(8)
        seqs = mixed_sequences(model.config.vocab_size).to(device)
        with torch.no_grad():
            results[dtype] = [f(model, seqs, temperature=1.0, chunk_size=16)[0][seqs.response_mask].double().cpu()
                              for f in (sequence_logprobs, packed_logprobs)]
            if dtype == torch.float64:
                scale = float(model(input_ids=seqs.input_ids).logits.abs().max())
    (padded, packed), (padded_bf16, packed_bf16) = results[torch.float64], results[torch.bfloat16]
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-10)
    tolerance = 2**-6 * scale
    assert (padded_bf16 - padded).abs().max() <= tolerance
    assert (packed_bf16 - padded).abs().max() <= tolerance
    assert (packed_bf16 - padded_bf16).abs().max() <= 2 * tolerance
    assert (padded_bf16 - padded).abs().max() > 1e-3  # the bf16 run really rounds (not computed in float32)


def test_the_row_lengths_are_not_moved_with_a_forwards_arguments():
    """FSDP2's root forward on a GPU moves every tensor among the forward's arguments to the device (torch's
    ``_to_kwargs``, into tuples and dicts too); the lengths every attention layer reads must stay on the host, or each
    layer would wait for the device to read them back. The meta device stands in for the GPU here."""
    from torch.distributed.utils import _to_kwargs

    from evolrl.logprobs.sequencewise_attention import PackedLengths

    packed = PackedLengths(torch.tensor([3, 5, 2]).tolist())
    _, (kwargs,) = _to_kwargs((), {"packed_lengths": packed, "input_ids": torch.zeros(1, 10)}, torch.device("meta"),
                              False)
    assert kwargs["input_ids"].device.type == "meta"  # what happens to a tensor
    assert kwargs["packed_lengths"] is packed and packed.lengths == [3, 5, 2]
    assert all(type(n) is int for n in packed.lengths)
