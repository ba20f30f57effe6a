"""LoRA (``model.lora``): adapters train, the base stays frozen, checkpoints hold adapters, resume is exact, the
engine's merged weights and the export compute the trained policy."""

from __future__ import annotations

import pytest
import torch
from helpers import Recorder, fit_checkpointed

from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.lora import AdaptersOff, LoRA, linear_names, merged_tensors
from evolrl.models import load_policy
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import HFEngine, Sampling
from evolrl.training import Batching, EvolRLModule, GRPOLoss, Optimization

ADAPTERS = LoRA(rank=4, alpha=8.0)


def lora_run(tiny_model: str, directory, ckpt_path=None, epochs: int = 2, kl_coef: float = 0.05):

    module = EvolRLModule(tiny_model, reward=MajorityVoteReward(), batching=Batching(6, 2), lora=ADAPTERS,
                          loss=GRPOLoss(kl_coef=kl_coef), optim=Optimization(lr=5e-2, warmup_ratio=0.3))
    data = RolloutDataModule(AdditionPrompts(count=8), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=4, trained_samples=3, sampling=Sampling(max_new_tokens=6))
    return fit_checkpointed(module, data, directory, Recorder(), ckpt_path, max_epochs=epochs), module


def test_only_the_adapters_train_and_the_checkpoint_holds_them_alone(tmp_path, tiny_model):
    _, module = lora_run(tiny_model, tmp_path / "run", epochs=1)
    base = load_policy(tiny_model).state_dict()
    trainable = {n for n, p in module.policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    counts = [p.numel() for p in module.policy.parameters()]
    assert sum(p.numel() for p in module.policy.parameters() if p.requires_grad) < 0.1 * sum(counts)
    optimized = {id(p) for group in module.optimizers().param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.policy.parameters() if p.requires_grad}
    for name, tensor in module.policy.state_dict().items():  # the base has not moved
        if ".lora_" not in name:
            assert torch.equal(tensor, base[name.replace(".base_layer.", ".")]), name
    assert any(not torch.equal(t, torch.zeros_like(t)) for n, t in module.policy.state_dict().items() if "lora_B" in n)
    saved = torch.load(tmp_path / "run" / "step=4.ckpt", weights_only=True)
    assert saved["state_dict"] and all(".lora_" in k for k in saved["state_dict"])
    assert set(saved["state_dict"]) == {f"policy.{n}" for n in trainable}

    # The export: the merged model loads with plain transformers, the adapter alone with peft; both compute the policy.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from evolrl.training.export import export_checkpoint

    export_checkpoint(str(tmp_path / "run" / "step=4.ckpt"), str(tmp_path / "merged"), dtype="float32",
                      adapter_dir=str(tmp_path / "adapter"))
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    policy = module.policy.eval()
    with torch.no_grad():
        expected = torch.log_softmax(policy(input_ids=ids).logits, -1)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
        # float32 round-off of the merge, W + s * B @ A summed in another order than the adapter's forward
        torch.testing.assert_close(torch.log_softmax(merged(input_ids=ids).logits, -1), expected, rtol=1e-5, atol=1e-5)
        adapted = PeftModel.from_pretrained(load_policy(tiny_model), tmp_path / "adapter").eval()
        torch.testing.assert_close(torch.log_softmax(adapted(input_ids=ids).logits, -1), expected, rtol=0, atol=0)


def test_a_resumed_lora_run_continues_exactly(tmp_path, tiny_model):
    full, full_module = lora_run(tiny_model, tmp_path / "full")
    assert len(full.losses) == 8
    resumed, module = lora_run(tiny_model, tmp_path / "resumed", ckpt_path=tmp_path / "full" / "step=3.ckpt")
    assert resumed.versions == full.versions[3:] and resumed.losses == full.losses[3:]
    final, expected = module.policy.state_dict(), full_module.policy.state_dict()
    assert all(torch.equal(final[k], expected[k]) for k in expected)


def test_merged_weights_and_the_reference_compute_what_the_policy_and_its_base_do(tiny_model):
    """The engine's push (base + scaling * B @ A) gives the adapted policy's logits, and the reference (adapters off)
    the base's, up to float32 round-off of the merge (1e-5 at these logit sizes)."""
    from evolrl.lora import add_adapters

    policy, base = add_adapters(load_policy(tiny_model), ADAPTERS), load_policy(tiny_model)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        adapted, original = policy(input_ids=ids).logits, base(input_ids=ids).logits
        torch.testing.assert_close(AdaptersOff(policy)(input_ids=ids).logits, original, rtol=0, atol=0)
        base.load_state_dict(dict(merged_tensors(policy)))
        torch.testing.assert_close(base(input_ids=ids).logits, adapted, rtol=1e-5, atol=1e-5)
    assert (adapted - original).abs().max() > 1e-3  # the adapters change something


@pytest.mark.parametrize(("settings", "key", "allowed"), [
    ({"rank": 0}, "LoRA.rank=0", "an integer >= 1"),
    ({"rank": -2}, "LoRA.rank=-2", "an integer >= 1"),
    ({"alpha": 0.0}, "LoRA.alpha=0.0", "> 0.0"),
    ({"dropout": 1.0}, "LoRA.dropout=1.0", "in [0.0, 1.0)"),
    ({"target_modules": []}, "LoRA.target_modules=[]", "a non-empty list"),
    ({"base_dtype": "float16"}, "LoRA.base_dtype='float16'", "one of 'auto'"),
])
def test_an_out_of_range_lora_setting_fails_when_built(settings, key, allowed):
    from evolrl.settings import SettingError

    with pytest.raises(SettingError) as err:
        LoRA(**settings)
    assert key in str(err.value) and allowed in str(err.value), str(err.value)


def test_linear_names_list_the_model_s_layers(tiny_model):
    assert linear_names(load_policy(tiny_model)) == ["down_proj", "gate_proj", "k_proj", "lm_head", "o_proj",
                                                     "q_proj", "up_proj", "v_proj"]
