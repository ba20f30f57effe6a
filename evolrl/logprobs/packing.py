"""Padding-free forward passes: a micro-batch's sequences back to back in one row (``Batching.packed``).

Non-obvious decisions:

* No attention mask, only ``position_ids`` that restart at 0 for every sequence. transformers then builds a
  block-diagonal causal mask itself (``masking_utils.find_packed_sequence_indices``: a new sequence wherever the
  position does not grow by 1), but only when ``attention_mask`` is ``None`` and there is no KV cache
  (``use_cache=False``), and only for the attention implementations that go through its mask functions (sdpa,
  eager, flex); flash-attention's varlen kernels read the same ``position_ids`` (one row: batch size 1). sdpa and
  eager materialize that mask, ``[1, 1, S, S]`` booleans for a row of S tokens; flash-attention needs none.
* The LM head only where a response token is scored: ``logits_to_keep`` takes the row's positions as a tensor
  (fused into the log-prob step or through the logits: ``forward.model_stats``).
* Whether a model keeps packed sequences apart is checked once, at start, by :func:`check_packing`: the name of
  its attention implementation, then a probe (a sequence's log-probs must not depend on the tokens before it in
  the row), which also catches what a name cannot (layers with recurrent state, custom attention code).
* Under sdpa that mask's every block is computed (S² per row of S tokens): a model switched to
  ``sequencewise_attention.SEQUENCEWISE_SDPA`` (packed runs are, ``build.build_models``) gets the row's sequence
  lengths and runs its attention one sequence at a time (the sum of s² per row), the same numbers; one switched to
  ``packed_flex.PACKED_FLEX`` (``Batching.flex_attention``) also gets the row's block mask, built here once per pass,
  and runs one FlexAttention call per layer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from evolrl.logprobs.forward import model_stats, takes_logits_to_keep
from evolrl.logprobs.packed_flex import PACKED_FLEX, document_block_mask
from evolrl.logprobs.passes import Passes, passes_with
from evolrl.logprobs.sequences import Sequences, to_device
from evolrl.logprobs.sequencewise_attention import SEQUENCEWISE_SDPA, PackedLengths, is_sequencewise
from evolrl.settings import require

PACKED_ATTENTION = ("sdpa", SEQUENCEWISE_SDPA, PACKED_FLEX, "eager", "flash_attention_2", "flash_attention_3",
                    "flash_attention_4", "flex_attention")
"""``config._attn_implementation`` values under which transformers separates packed sequences."""


def packed_logprobs(model, seqs: Sequences, temperature: float, passes: Passes = Passes(),  # noqa: B008
                    vocab_mean: bool = False, **settings) -> tuple[Tensor, ...]:
    """``sequence_logprobs`` computed on one packed row: the same ``(log-prob, entropy)`` (and vocabulary mean),
    ``[N, T - 1]``.

    Response positions get values, every other position 0 (without response tokens, ``Sequences.filler``, the
    first sequence's last position is computed and returned as 0, so the LM head is part of the pass).
    """
    device = seqs.input_ids.device
    layout = seqs.host_layout()  # every index below is built on the host and copied without blocking
    lengths = layout.lengths  # [N]
    starts = lengths.cumsum(0) - lengths  # [N] where each sequence begins in the row
    size, width = int(lengths.sum()), seqs.input_ids.shape[1]
    tokens = (torch.arange(width) < lengths[:, None]).flatten().nonzero().flatten()  # [S] in the flattened [N * T]
    ids = seqs.input_ids.flatten().index_select(0, to_device(tokens, device))[None]  # [1, S]: pads dropped
    positions = to_device(torch.arange(size) - starts.repeat_interleave(lengths, output_size=size), device)  # [S]
    rows, cols = (layout.rows, layout.cols) if len(layout.rows) else _last_target(lengths)  # [K]
    at = to_device(starts[rows] + cols, device)  # [K] positions in the row whose next token is scored
    rows, cols = to_device(rows, device), to_device(cols, device)
    scored = seqs.response_mask
    keep = {"logits_to_keep": at} if takes_logits_to_keep(model) else {}
    inputs = {"input_ids": ids, "position_ids": positions[None], "use_cache": False, **keep}
    flex = getattr(model.config, "_attn_implementation", None) == PACKED_FLEX
    if is_sequencewise(model) or flex:
        inputs["packed_lengths"] = PackedLengths(lengths[lengths > 0].tolist(), device)
        if _full_attention_only(model.config):  # the attention reads the lengths: transformers need build no mask
            inputs["attention_mask"] = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    if flex:  # built once per pass, read by every layer
        inputs["packed_block_mask"] = document_block_mask(inputs["packed_lengths"].lengths, ids.device)
    stats, _ = model_stats(model, inputs, select=(lambda out: out) if keep else (lambda out: out[:, at]),
                           targets=ids[:, at + 1], temperature=temperature, passes=passes_with(passes, settings),
                           vocab_mean=vocab_mean)  # each [1, K]

    def unpack(values: Tensor) -> Tensor:  # [1, K] -> [N, T - 1], zeros where nothing is scored
        return values.new_zeros(scored.shape).index_put((rows, cols), values[0] * scored[rows, cols])

    return tuple(unpack(values) for values in stats)


def _full_attention_only(config) -> bool:
    """Whether no layer of the model attends within a sliding window (such a layer reads transformers' mask).

    For the others a 4D placeholder mask is given: transformers then returns it as the prepared mask instead of
    building an ``[S, S]`` one that the sequence-wise and flex attention never read, and of finding the packed
    sequences in the positions with a read that waits for the device."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        return all(t == "full_attention" for t in types)
    return getattr(config, "sliding_window", None) is None


def _last_target(lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows, cols)`` of the first sequence's last position (host), computed when nothing is scored."""
    return torch.zeros(1, dtype=torch.long), (lengths[:1] - 2).long()


def check_packing(model, key: str = "Batching.packed") -> None:
    """Raise :class:`~evolrl.settings.SettingError` unless ``model`` keeps packed sequences apart."""
    attention = getattr(model.config, "_attn_implementation", None)
    allowed = ("a model whose packed sequences cannot see each other: attention " + ", ".join(PACKED_ATTENTION)
               + " and no layers with recurrent state; set it to false for this model")
    require(attention in PACKED_ATTENTION, key, True, allowed=f"{allowed} (this model's attention is {attention!r})")
    leak = packing_leak(model)
    if leak <= 1e-3:
        return
    noise = packing_leak(model, change_first=False)
    require(False, key, True,
            allowed=f"{allowed} (a probe: a sequence's log-probs moved by {leak:.2g} when the sequence before it in "
            f"the row changed, and by {noise:.2g} when it did not: the kernels' run-to-run noise)")


@torch.no_grad()
def packing_leak(model, change_first: bool = True) -> float:
    """The most a packed sequence's log-probs move when the tokens of the sequence before it change (0: apart).
    ``change_first=False`` passes the same row twice: the noise floor that a leak is read against."""
    vocab = min(int(model.config.vocab_size), 200)
    device = next(model.parameters()).device
    second = torch.arange(7, device=device) * 13 % vocab
    response = torch.zeros(2, 9, dtype=torch.bool, device=device)
    response[1, 2:6] = True  # the second sequence's last four tokens
    training = model.training
    model.eval()  # no dropout: the two passes must differ only by the first sequence
    try:
        logps = []
        firsts = torch.arange(10, device=device) * 7 % vocab, (torch.arange(10, device=device) * 11 + 1) % vocab
        for first in firsts if change_first else firsts[:1] * 2:
            ids = torch.stack([first, torch.cat([second, second.new_zeros(3)])])
            attention = torch.stack([torch.ones(10, dtype=torch.long), torch.arange(10) < 7]).long().to(device)
            seqs = Sequences(ids, attention, response_mask=response, advantages=torch.zeros(2))
            logps.append(packed_logprobs(model, seqs, temperature=1.0, chunk_size=64)[0])
    finally:
        model.train(training)
    return float((logps[0] - logps[1]).abs().max())
