"""The policy and its frozen reference, built once per run (``EvolRLModule.configure_model``).

Non-obvious decisions:

* One process: the policy is loaded whole and the reference is a copy of it, its parameters in ``Dtypes.reference``
  and its buffers (rotary frequencies) kept in float32 on both paths (:func:`parameters_in`).
* Several ranks (FSDP2): only rank 0 reads the weights. Every rank builds the architecture with its parameters
  on the meta device (no memory), shards it, allocates only its own shards and receives its slice of each tensor
  from rank 0, one tensor at a time (``evolrl.distributed.fill_from_rank0``); the reference is filled from the
  same copy. Peak host memory: one full copy on rank 0 plus each rank's shards, not a whole policy and a whole
  reference on every rank.
* The policy's weights are the optimizer's master weights and keep ``EvolRLModule.dtype`` (float32) under any
  precision: Adam moves a weight by about the learning rate per step, and the paper's 5e-7 is ~100x below
  bf16's spacing near a typical weight (|w| ~ 1e-2: 2^-14 ~ 6e-5), so bf16 master weights would not move.
  Only copies are bf16: the reference (never updated) and, under FSDP, the all-gathered copies the forward and
  backward compute with (gradients are reduced in float32 into the float32 shards).
* Packed runs (``Batching.packed``) switch sdpa models to ``sequencewise_attention.SEQUENCEWISE_SDPA`` (the packed
  row's attention one sequence at a time; every other pass unchanged), or with ``Batching.flex_attention`` to
  ``packed_flex.PACKED_FLEX`` (one FlexAttention call per row), before the reference is copied.
* ``Batching.compile_blocks`` compiles the blocks' forwards last, on the finished models (after the copy and after
  sharding: FSDP2's hooks stay outside the compiled graphs, ``compiled.py``).
* With ``lora`` (``evolrl/lora.py``) the base is stored in its own dtype, frozen, with float32 adapters; the reference is
  the policy with its adapters off, so no second copy of the weights exists.
* ``bf16-true`` is Lightning's "everything in bf16": its precision plugin casts the policy itself to bf16 after
  ``configure_model`` (master weights included); the paper configs use ``bf16-mixed``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from evolrl.distributed import broadcast_object, fill_from_rank0, shard
from evolrl.logprobs import Passes, compile_for, prepare
from evolrl.lora import AdaptersOff, LoRA, add_adapters
from evolrl.models import empty_policy, load_policy, model_config


@dataclass
class Frozen:
    """A model held outside the module tree: a plain attribute, not a submodule, so it is never trained, never in
    checkpoints or the optimizer, and moved to the device explicitly (``on_fit_start``); rebuilt at start."""

    model: nn.Module


DTYPES = ("auto", "float32", "bfloat16")
"""Choices of ``EvolRLModule.reference_dtype`` and ``fsdp_param_dtype``; ``auto`` follows the trainer's precision."""


@dataclass(frozen=True)
class Dtypes:
    """The dtypes of the policy's master weights, of the reference, and of FSDP's all-gathered compute copies."""

    policy: str
    """Master weights (``EvolRLModule.dtype``)."""
    reference: str
    """The frozen reference's linear weights (the rest stays as the policy's: :func:`parameters_in`)."""
    fsdp_param: str
    """What FSDP2 all-gathers the policy (and the reference) in for compute; the shards keep their dtype."""
    base: str
    """A LoRA run's frozen base (``LoRA.base_dtype``)."""
    autocast: bool = False
    """Whether passes run under autocast (``*-mixed`` precision): then the reference stores only its linear weights
    in ``reference`` (:func:`parameters_in`); without autocast a model must be in one dtype."""

    @classmethod
    def resolve(cls, precision: str, policy: str, reference: str = "auto", fsdp_param: str = "auto",
                base: str = "auto") -> Dtypes:
        """``auto`` is bfloat16 under a bf16 ``trainer.precision``, else the policy's dtype."""
        low = "bfloat16" if precision.startswith("bf16") else policy
        return cls(policy, *(low if dtype == "auto" else dtype for dtype in (reference, fsdp_param, base)),
                   autocast=precision.endswith("-mixed"))


def build_models(name: str, dtypes: Dtypes, with_reference: bool, mesh=None, device: torch.device | None = None,
                 gradient_checkpointing: bool = False, trust_remote_code: bool = False,
                 passes: Passes = Passes(), lora: LoRA | None = None,  # noqa: B008 (frozen)
                 ) -> tuple[nn.Module, nn.Module | AdaptersOff | None]:
    """``(policy, reference or None)``: loaded whole without ``mesh``; else sharded over it and filled from rank 0;
    set up for ``passes`` (``Batching.passes``: the packed passes' attention, then the compiled blocks,
    ``evolrl.logprobs.prepare`` and ``compile_for``). With ``lora``: the base in ``dtypes.base`` with trainable
    adapters, and the reference is the policy with its adapters off."""
    weights = dtypes.base if lora is not None else dtypes.policy  # what the loaded weights are stored in

    def with_adapters(model: nn.Module, meta: bool = False) -> nn.Module:
        return add_adapters(model, lora, meta=meta) if lora is not None else model

    if mesh is None:
        policy = _trainable(with_adapters(prepare(load_policy(name, weights, trust_remote_code), passes)),
                            gradient_checkpointing)
        if lora is not None:
            policy = compile_for(policy, passes)
            return policy, AdaptersOff(policy) if with_reference else None
        reference = _frozen(parameters_in(copy.deepcopy(policy), dtypes.reference, linear_only=dtypes.autocast)
                            ) if with_reference else None
        return compile_for(policy, passes), compile_for(reference, passes)
    device = device or torch.device("cpu")
    full = with_adapters(load_policy(name, weights, trust_remote_code)) if dist.get_rank() == 0 else None
    state = full.state_dict() if full is not None else None
    generation_config = broadcast_object(full.generation_config if full is not None else None)
    config = model_config(name, trust_remote_code)
    compute = getattr(torch, dtypes.fsdp_param)

    def sharded(dtype: str, trainable: bool) -> nn.Module:
        model = prepare(parameters_in(empty_policy(config, dtypes.policy, trust_remote_code), dtype,
                                      linear_only=dtypes.autocast and not trainable), passes)
        model.generation_config = generation_config  # the engines read the stop tokens from it
        model = _trainable(with_adapters(model, meta=True), gradient_checkpointing) if trainable else _frozen(model)
        return fill_from_rank0(shard(model, mesh, compute), state, device)

    policy = compile_for(sharded(weights, trainable=True), passes)
    if lora is not None:
        return policy, AdaptersOff(policy) if with_reference else None
    reference = sharded(dtypes.reference, trainable=False) if with_reference else None
    return policy, compile_for(reference, passes)


def parameters_in(model: nn.Module, dtype: str, linear_only: bool = False) -> nn.Module:
    """``model`` with its parameters (tied ones stay one tensor) in ``dtype`` and its buffers as built; with
    ``linear_only`` (the frozen reference of a run under autocast) only the weights of linear layers not tied to the
    input embeddings.

    Why ``linear_only``: autocast casts a linear layer's float32 weight to its dtype for the matmul, so a reference
    that stores those weights in bf16 multiplies exactly as the float32 policy does under bf16 autocast; embeddings,
    norms and a tied head kept as loaded keep the residual stream in float32 as the policy's. At identical weights the
    two then give the same log-probs (k3 KL 0 on CPU, ``tests/test_kl_reference.py``), where an all-bf16 reference
    differed by its rounded embeddings and norms (up to 1.5e-4 per token on a tiny model, 3-4e-3 at 4B on a GPU).
    The cost: the embeddings (and norms) stay float32, vocab x hidden x 2 B more than in bf16.

    Not ``model.to(dtype)``, which casts buffers too: the rotary frequencies ``inv_freq`` in bf16 are off by up to
    2^-9 relatively, an angle error that grows with the position (radians by a few thousand tokens), so a bf16
    reference's log-probs would drift from the policy's with the position at identical weights and the KL term
    would measure that rounding. With float32 frequencies the reference differs by bf16 rounding of the weights
    alone, the same at every position (``tests/test_gpu_contact.py``).
    """
    target = getattr(torch, dtype)
    embedding = model.get_input_embeddings().weight
    parameters = ([m.weight for m in model.modules() if isinstance(m, nn.Linear) and m.weight is not embedding]
                  if linear_only else list(model.parameters()))  # each shared parameter once
    for parameter in parameters:
        parameter.data = parameter.data.to(target)
    return model


def _trainable(model: nn.Module, gradient_checkpointing: bool | int) -> nn.Module:
    """``model`` in training mode, checkpointing every ``gradient_checkpointing``-th decoder layer (layers 0, n, 2n,
    ...; ``True``: every one, ``False`` or 0: none). Transformers' checkpointing is switched on, then off again on the
    other layers through each ``GradientCheckpointingLayer``'s own ``gradient_checkpointing`` flag, which compiled
    blocks read too (``compiled._checkpointing``); layers count in module order, as transformers' ``every_n_layers``.
    A layer left out keeps its activations for the backward instead of recomputing them: less compute, more memory."""
    every = int(gradient_checkpointing)
    if every:
        from evolrl.settings import require

        try:
            from transformers.modeling_layers import GradientCheckpointingLayer as Layer
        except ImportError:  # transformers before 4.52: the model's layer loop checkpoints every layer or none
            Layer = ()  # isinstance of no class: no layer
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        layers = [module for module in model.modules() if isinstance(module, Layer)]
        require(every == 1 or bool(layers), "EvolRLModule.gradient_checkpointing", gradient_checkpointing,
                allowed=f"true or false for {type(model).__name__}, whose layers have no checkpointing flag of their "
                "own (transformers' GradientCheckpointingLayer, 4.52 or later)")
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = i % every == 0
    return model.train()


def _frozen(model: nn.Module) -> nn.Module:
    return model.eval().requires_grad_(False)
