"""LoRA adapters (``model.lora``): a frozen base, trainable low-rank adapters built by peft, merged for the engine.

Decisions:

* peft's ``inject_adapter_in_model`` puts the adapters into the policy's own modules, so the policy stays the
  transformers model the rest of evolrl drives (its forward, its head, its config, FSDP2's sharding); no ``PeftModel``
  wrapper sits in between.
* Only the adapters train, in float32 (the optimizer's master weights); the base is stored in ``base_dtype``
  (default: the run's compute dtype, bfloat16 under bf16 precision), which halves its memory on a GPU.
* The KL reference is the same model with its adapters switched off (:class:`AdaptersOff`): no second copy of the
  weights.
* The rollout engine gets merged weights, ``W + scaling * B @ A`` per adapted layer, computed one tensor at a time for
  the push (:func:`merged_tensors`): the engine needs no LoRA support of its own and samples at the base model's
  speed (vLLM's own LoRA path took 5.8x the push and sampling on a CPU: docs/demo.md), and the
  trainer's copy is never merged, so training goes on with the adapters.
* Checkpoints hold the adapters and their optimizer state, not the base, which the model string names
  (``EvolRLModule.on_save_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from evolrl.settings import check_choice, check_float, check_int, require

ADAPTER = "default"
"""peft's adapter name; a run trains one adapter."""
BASE_DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class LoRA:
    """Low-rank adapters on the policy's linear layers; the base stays frozen."""

    rank: int = 16
    """The adapters' rank r (>= 1)."""
    alpha: float = 32.0
    """Scale numerator: an adapter adds ``alpha / rank * B @ A`` to its layer's weight."""
    dropout: float = 0.0
    """Dropout on an adapter's input, in [0, 1)."""
    target_modules: list[str] | None = None
    """Names of the linear layers that get adapters (e.g. ``[q_proj, v_proj]``); ``null``: every linear layer of
    attention and the MLP (not the output head)."""
    base_dtype: str = "auto"
    """The frozen base's dtype; ``auto``: bfloat16 under a bf16 ``trainer.precision``, else the policy's dtype."""

    def __post_init__(self) -> None:
        check_int("LoRA.rank", self.rank, 1)
        check_float("LoRA.alpha", self.alpha, 0.0, low_open=True)
        check_float("LoRA.dropout", self.dropout, 0.0, 1.0, high_open=True)
        names = self.target_modules
        require(names is None or (isinstance(names, list) and bool(names)
                                  and all(isinstance(n, str) and n.strip() for n in names)),
                "LoRA.target_modules", names, allowed="null (every linear layer but the head) or a non-empty list of "
                "linear layer names")
        check_choice("LoRA.base_dtype", self.base_dtype, BASE_DTYPES)


def linear_names(model: nn.Module, head: bool = True) -> list[str]:
    """The names (last part) of ``model``'s own linear layers (not adapters' parts), with or without the output head,
    sorted."""
    out = model.get_output_embeddings()
    return sorted({name.removesuffix(".base_layer").rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, nn.Linear) and ".lora_" not in name and (head or module is not out)})


def check_targets(lora: LoRA, model: nn.Module) -> None:
    """SettingError naming ``LoRA.target_modules`` and ``model``'s linear layers unless every target is one of them."""
    if lora.target_modules is None:
        return
    names = linear_names(model)
    missing = [t for t in lora.target_modules if t not in names]
    require(not missing, "LoRA.target_modules", lora.target_modules,
            allowed=f"names of this model's linear layers ({', '.join(missing)} is not one): {', '.join(names)}")


def peft_config(lora: LoRA, model: nn.Module, base: str | None = None):
    """peft's ``LoraConfig`` for ``lora`` on ``model`` (``base``: the model string, for an exported adapter)."""
    from peft import LoraConfig

    check_targets(lora, model)
    targets = lora.target_modules or linear_names(model, head=False)
    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                      bias="none", base_model_name_or_path=base)


def add_adapters(model: nn.Module, lora: LoRA, meta: bool = False) -> nn.Module:
    """``model`` with float32 adapters injected into its target layers (on the meta device with ``meta``), every other
    parameter frozen."""
    from peft import inject_adapter_in_model

    model = inject_adapter_in_model(peft_config(lora, model), model, adapter_name=ADAPTER, low_cpu_mem_usage=meta)
    for name, parameter in model.named_parameters():
        trainable = ".lora_" in name
        parameter.requires_grad_(trainable)
        if trainable:
            parameter.data = parameter.data.float()
    return model


def _adapter_layers(model: nn.Module) -> dict[str, nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Inside the block ``model`` computes as its base: the flag peft's layers read in their forward. Not peft's
    ``enable_adapters``, which also flips ``requires_grad`` on the parameter objects a layer holds at that moment: under
    FSDP2 those are the shards before a forward and the gathered copies after one that keeps them
    (``Batching.reshard_after_forward``), so the flip and its undo would land on different tensors. The reference's
    passes take no gradients anyway."""
    layers = _adapter_layers(model).values()
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


class AdaptersOff:
    """The policy with its adapters switched off for every call: the KL reference of a LoRA run.

    Everything else (its head, its config, its parameters) is the policy's, so the log-prob engine drives it as the
    model it is."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, *args, **kwargs):
        with adapters_off(self.model):
            return self.model(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.model, name)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # an FSDP2 DTensor shard


def merged_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s state as the base model's names and tensors, each adapted weight merged (``W + scaling * B @ A``,
    in float32, in the base weight's dtype), one tensor at a time. Under FSDP2 every rank must consume it all."""
    layers = _adapter_layers(model)
    for name, tensor in model.state_dict().items():
        if ".lora_" in name:
            continue
        owner, _, rest = name.partition(".base_layer.")
        tensor = _full(tensor)
        if rest == "weight" and owner in layers:
            layer = layers[owner]
            a, b = _full(layer.lora_A[ADAPTER].weight).float(), _full(layer.lora_B[ADAPTER].weight).float()
            delta = (b @ a) * layer.scaling[ADAPTER]
            tensor = (tensor.float() + (delta.T if layer.fan_in_fan_out else delta)).to(tensor.dtype)
        yield (f"{owner}.{rest}" if rest else name), tensor


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters' entries of a module's state dict: what a LoRA run's checkpoint holds."""
    return {name: tensor for name, tensor in state.items() if ".lora_" in name}


def save_adapter(model: nn.Module, lora: LoRA, out_dir: str | Path, base: str) -> Path:
    """``model``'s adapters in peft's own format (``adapter_config.json``, ``adapter_model.safetensors``), which
    ``peft.PeftModel.from_pretrained(base_model, out_dir)`` loads."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_config(lora, model, base=base).save_pretrained(out)
    state = {f"base_model.model.{name.replace(f'.{ADAPTER}.', '.')}": tensor.detach().contiguous().cpu()
             for name, tensor in adapter_state(model.state_dict()).items()}
    save_file(state, out / "adapter_model.safetensors")
    return out


def with_base(saved: dict[str, torch.Tensor], current: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's state completed with the base entries of the module's ``current`` state."""
    return {name: tensor for name, tensor in current.items() if ".lora_" not in name} | saved
