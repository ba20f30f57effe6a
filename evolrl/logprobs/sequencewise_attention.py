"""sdpa over a packed row one sequence at a time: a packed pass's attention without the row-wide mask's work.

transformers keeps packed sequences apart under sdpa with a block-diagonal ``[S, S]`` mask and then computes every
block of it, so a row of S tokens costs S² attention whatever its sequences' lengths (there is no varlen sdpa
kernel; flash-attention's varlen kernels exist on GPUs only). :data:`SEQUENCEWISE_SDPA` is transformers' sdpa,
registered under its own name, with one difference: given the packed row's sequence lengths (``packed_lengths``, a
keyword the model's forward hands down to every attention call), each sequence's queries attend only to its own
keys, causally, so the work is the sum of the sequences' s² and no mask is read. Every other call (padded passes,
evaluation, generation, and the layers of a packed pass that attend within a sliding window, whose mask is more than
block-diagonal) is transformers' sdpa with transformers' sdpa mask, unchanged.

:func:`use_sequencewise_attention` switches a model from ``sdpa`` to it; ``build.build_models`` does so for packed
runs (``Batching.packed``), and ``packing.packed_logprobs`` passes the lengths. transformers still builds the
block-diagonal mask once per forward (booleans, ``S²`` bytes); the attention layers do not read it.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from evolrl.logprobs import varlen
from evolrl.logprobs.autocast import autocast_dtype
from evolrl.logprobs.sequences import to_device

SEQUENCEWISE_SDPA = "evolrl_sequencewise_sdpa"
GPU_BACKENDS: list[SDPBackend] | None = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                         SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
"""The sdpa backends a packed row's per-sequence calls try on a GPU, in this order (``None``: torch's own order).
Flash first: torch's order can pick cuDNN's attention, which builds an execution plan for every new sequence length,
and a training step brings new lengths to every call (docs/performance.md: 16 fresh lengths on an H200 took 1.8 s
under cuDNN, 0.013 s under flash).
cuDNN's stays ahead of math for a call flash cannot take (math holds the whole score matrix); a torch that cannot order
backends (before 2.6) gets the list without cuDNN's, so that it cannot come first."""
ORDERED = "set_priority" in inspect.signature(sdpa_kernel).parameters


class PackedLengths:
    """A packed row's sequence lengths, Python ints, as the ``packed_lengths`` keyword of a model's forward carries
    them to its attention layers. Not a tensor, nor a tuple: FSDP2's root forward moves every tensor among a forward's
    arguments to the GPU (inside tuples, lists and dicts too), and reading the lengths back in every layer would then
    wait for the device each time; nor a dataclass, whose fields a compiled block's trace would be specialised on."""

    __slots__ = ("cu_seqlens", "lengths", "max_len")

    def __init__(self, lengths: list[int], device: torch.device | None = None) -> None:
        self.lengths = [int(n) for n in lengths]
        self.max_len = max(self.lengths)
        bounds = torch.tensor([0, *self.lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.cu_seqlens = bounds if device is None else to_device(bounds, torch.device(device))
        """The row's cumulative lengths ``[N + 1]`` int32 on ``device`` (the varlen op's): built once per pass on the
        host, before the forward, copied without blocking, read by every layer."""

    def __repr__(self) -> str:
        return f"PackedLengths({self.lengths})"


def sequencewise_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      *args, packed_lengths: PackedLengths | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' sdpa; with ``packed_lengths`` (one row, ``[1, heads, sum(lengths), dim]``), one causal sdpa call
    per sequence, without the mask, concatenated: ``[1, sum(lengths), heads, dim]``.
    Under autocast the row is cast before it is split: the cast autocast makes inside each sdpa call (sdpa runs in the
    autocast dtype), once per tensor instead of once per sequence, and inside a compiled block's graph, where it fuses
    with the rotary embedding before it."""
    if packed_lengths is None or kwargs.get("sliding_window") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    device = query.device.type
    dtype = autocast_dtype(device)
    if dtype is not None:  # autocast's cast, once per row instead of once per sequence and tensor
        query, key, value = (x.to(dtype) if x.dtype != torch.float64 else x for x in (query, key, value))
    if varlen.runs(query) and not kwargs.get("dropout"):  # one call per row, traceable (varlen.py)
        if not torch.compiler.is_compiling():  # traced, the check would fix the row's length in the graph
            _check_row(query, key, packed_lengths.lengths)
        scale = kwargs.get("scaling")
        out = varlen.attend(*(x[0].transpose(0, 1) for x in (query, key, value)),
                            packed_lengths.cu_seqlens, packed_lengths.max_len,
                            scale=scale if scale is not None else query.shape[-1] ** -0.5)
        return out.unsqueeze(0), None
    return _each_sequence(module, query, key, value, packed_lengths, *args, **kwargs), None


def _check_row(query: Tensor, key: Tensor, lengths: list[int]) -> None:
    if query.shape[0] != 1 or query.shape[2] != sum(lengths) or key.shape[2] != query.shape[2]:
        raise ValueError(f"packed_lengths {lengths} need one row of {sum(lengths)} queries and keys (a pass without a "
                         f"KV cache); got queries {tuple(query.shape)}, keys {tuple(key.shape)}")


@torch.compiler.disable
def _each_sequence(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, packed_lengths: PackedLengths,
                   *args, **kwargs) -> Tensor:
    """One causal sdpa call per sequence. Outside a compiled block's graph (``Batching.compile_blocks``): traced, the
    loop would be specialised on the number of sequences and traced again for every pass."""
    lengths = packed_lengths.lengths
    _check_row(query, key, lengths)
    kwargs["is_causal"] = True
    with _preferring(GPU_BACKENDS if query.is_cuda else None):
        if len(lengths) == 1:  # a row of one sequence: no split, no concatenation (forward and backward)
            return sdpa_attention_forward(module, query, key, value, None, *args, **kwargs)[0]
        parts = [sdpa_attention_forward(module, q, k, v, None, *args, **kwargs)[0]
                 for q, k, v in zip(*(x.split(lengths, dim=2) for x in (query, key, value)))]
    return torch.cat(parts, dim=1)


AttentionInterface.register(SEQUENCEWISE_SDPA, sequencewise_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(SEQUENCEWISE_SDPA, sdpa_mask)


def use_sequencewise_attention(model: nn.Module) -> None:
    """Switch ``model`` (and the models inside it) from ``sdpa`` to :data:`SEQUENCEWISE_SDPA`; any other attention
    implementation (flash-attention's varlen kernels, eager, flex) is left as it is."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(SEQUENCEWISE_SDPA)


def is_sequencewise(model: nn.Module) -> bool:
    """Whether ``model``'s packed passes should hand their sequence lengths to the attention layers."""
    return getattr(model.config, "_attn_implementation", None) == SEQUENCEWISE_SDPA


def _preferring(backends: list[SDPBackend] | None):
    """sdpa calls inside try ``backends`` in their order (none given: torch's own choice)."""
    if not backends:
        return nullcontext()
    if ORDERED:
        return sdpa_kernel(backends, set_priority=True)
    return sdpa_kernel([b for b in backends if b != SDPBackend.CUDNN_ATTENTION])
