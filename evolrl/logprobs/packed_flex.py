"""FlexAttention over a packed row: one attention call per layer and row (``Batching.flex_attention``, GPUs).

``sequencewise_attention`` keeps a packed row's sequences apart with one sdpa call per sequence: the work is the sum of
the sequences' s², but a row of n sequences costs n launches per layer (forward, recomputation and backward). Here
the row is one ``flex_attention`` call whose block mask lets each query see the keys of its own sequence, causally:
blocks of 128 queries x 128 keys that no pair of one sequence meets are skipped, so the work stays about the sum of
s² (plus the blocks a sequence boundary cuts) in one launch. Non-obvious decisions:

* The block mask is built from the sequence lengths (:func:`document_block_mask`): which key blocks each query block
  can see is arithmetic on the lengths, ``(S / 128)²`` integers, where ``create_block_mask`` would evaluate the mask
  function at all S² positions (at 32k tokens, gigabytes). The packed pass builds it once (``packing.py``) and every
  layer reads it.
* Compiled: inside a compiled block's graph (``Batching.compile_blocks``) dynamo traces the call with the block;
  otherwise through one ``torch.compile`` of ``flex_attention`` with symbolic lengths. A new row (new lengths, a new
  mask function over them) does not trace it again (``tests/test_packed_flex.py`` counts the graphs).
* torch has no FlexAttention backward on a CPU (2.13: ``NotImplementedError``), so ``fit`` refuses this setting at
  start there (:func:`check_flex`); a CPU runs the same function without gradients, uncompiled (the tests).
* On a GPU a pass without gradients (the reference's, the old log-probs') asks for the log-sum-exp too, which it
  does not use: without gradients flex otherwise builds its forward kernel in a configuration of its own (no
  log-sum-exp written), which inductor fails to compile for the 1.7B shape inside compiled blocks with symbolic
  lengths (torch 2.11), where the training passes' configuration compiles (``tests/test_packed_flex.py``'s GPU tests
  cover both).
* Every other call (padded passes, generation, evaluation, a sliding window, dropout) is the sequence-wise sdpa's.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from evolrl.logprobs.autocast import autocast_dtype
from evolrl.logprobs.sequencewise_attention import SEQUENCEWISE_SDPA, sequencewise_sdpa
from evolrl.settings import require

try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # torch before 2.9: no way to ask for the log-sum-exp but the deprecated one
    AuxRequest = None

PACKED_FLEX = "evolrl_packed_flex"
BLOCK = 128
"""Queries and keys per block of the block mask (FlexAttention's default)."""


def document_block_mask(lengths: list[int], device: torch.device) -> BlockMask:
    """The block mask of a packed row of sequences of ``lengths``: each query sees its own sequence's keys up to its
    own position. Query block i needs the key blocks from the one holding the start of its first query's sequence up
    to block i itself (later queries in the block belong to that sequence or later ones, which start later). Built
    from Python ints: no read back from the device."""
    size = sum(lengths)
    lengths = torch.tensor(lengths, device=device)
    document = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths, output_size=size)  # [S]
    starts = (lengths.cumsum(0) - lengths)[document]  # [S] where each token's sequence begins
    blocks = -(-size // BLOCK)
    rows = torch.arange(blocks, device=device)
    first = starts[rows * BLOCK] // BLOCK  # [blocks] the first key block each query block needs
    count = rows - first + 1
    indices = (first[:, None] + rows[None, :]).clamp(max=blocks - 1)  # the first `count` of each row are read

    def within_sequence(batch, head, q, kv):
        return (document[q] == document[kv]) & (q >= kv)

    return BlockMask.from_kv_blocks(count[None, None].int(), indices[None, None].int(), BLOCK_SIZE=BLOCK,
                                    mask_mod=within_sequence, seq_lengths=(size, size))


@cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=True)


def packed_flex(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *args,
                packed_block_mask: BlockMask | None = None, **kwargs) -> tuple[Tensor, None]:
    """One ``flex_attention`` call over the packed row (``[1, heads, S, dim]``) given ``packed_block_mask``:
    ``[1, S, heads, dim]``; any other call is :func:`~evolrl.logprobs.sequencewise_attention.sequencewise_sdpa`."""
    dropout = kwargs.get("dropout", 0.0) if module.training else 0.0
    if packed_block_mask is None or kwargs.get("sliding_window") is not None or dropout > 0:
        return sequencewise_sdpa(module, query, key, value, attention_mask, *args, **kwargs)
    device = query.device.type
    dtype = autocast_dtype(device)
    if dtype is not None:  # flex runs in the dtype it is given: autocast's, as sdpa would
        query, key, value = (x.to(dtype) for x in (query, key, value))
    compiled = device == "cuda" and not torch.compiler.is_compiling()
    attend = _compiled_flex() if compiled else flex_attention
    lse = AuxRequest is not None and device == "cuda" and not torch.is_grad_enabled()  # as a training pass (above)
    out = attend(query, key, value, block_mask=packed_block_mask, scale=kwargs.get("scaling"),
                 enable_gqa=key.shape[1] != query.shape[1], **({"return_aux": AuxRequest(lse=True)} if lse else {}))
    out = out[0] if lse else out
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_FLEX, packed_flex)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_FLEX, sdpa_mask)


def use_packed_flex(model: nn.Module) -> None:
    """Switch ``model`` from ``sdpa`` (or the sequence-wise sdpa) to :data:`PACKED_FLEX`."""
    if getattr(model.config, "_attn_implementation", None) in ("sdpa", SEQUENCEWISE_SDPA):
        model.set_attn_implementation(PACKED_FLEX)


def check_flex(device: torch.device, key: str = "Batching.flex_attention") -> None:
    """Raise :class:`~evolrl.settings.SettingError` at start unless FlexAttention can train on ``device``."""
    require(device.type == "cuda", key, True, allowed=f"false on {device.type!r}: torch has no FlexAttention backward "
            "there (the first training pass would fail); packed passes then attend one sequence at a time")
