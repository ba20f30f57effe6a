"""Passes that compute each prompt once: a group's responses attend to one copy of its prompt's keys and values
(``Batching.shared_prompts``).

A GRPO group is G responses to one prompt, so a right-padded pass runs the prompt's tokens through the model G times.
Here a pass runs twice instead: the pass's distinct prompts, left-padded so that each one's last token is the last
column (the position that scores its responses' first tokens), with the KV cache on; then every response, its rows
reading their prompt's cached keys and values (``DynamicCache.reorder_cache``, an ``index_select``: the backward
sums each response's gradient into the one prompt it shares). The same log-probs and gradients as a right-padded
pass up to float rounding (``tests/test_shared_prompts.py``); with few-shot prompts of 200 tokens and answers of 25,
a group of 8 computes on a quarter of the tokens.

Non-obvious decisions:

* Which rows share a prompt is known on the host (``Layout.prompts``), so no index is read from the device. The
  prompts' pass gets no attention mask when its prompts have one length (one group a pass); with several lengths
  transformers reads the mask's padding once, as it does in a right-padded pass.
* Each response's last token is not fed: nothing after it is scored.
* Values come back where a right-padded pass puts them, ``[N, T - 1]``, and 0 wherever ``response_mask`` is false.
* A left-padded prompt's pad positions attend to nothing; kernels differ in what they make of such rows (some
  GPU backwards have returned NaN for them). :func:`check_shared_prompts` runs a probe with one, forward and
  backward, on the run's device and in its precision, against a right-padded pass, and refuses what differs. It
  also refuses a model that checkpoints its activations (transformers then keeps no KV cache in training), FSDP2
  (two forwards before one backward are untried with its hooks) and, in ``Batching``, compiled blocks (untried
  with a cache).
"""

from __future__ import annotations

import torch
from torch import Tensor

from evolrl.logprobs.forward import model_stats, sequence_logprobs, takes_logits_to_keep
from evolrl.logprobs.passes import Passes, passes_with
from evolrl.logprobs.sequences import Sequences, to_device
from evolrl.settings import require


def shared_prompt_logprobs(model, seqs: Sequences, temperature: float, passes: Passes = Passes(),  # noqa: B008
                           vocab_mean: bool = False, **settings) -> tuple[Tensor, ...]:
    """``sequence_logprobs``' ``(log-prob, entropy)`` (and vocabulary mean), ``[N, T - 1]``, each distinct prompt of
    ``seqs`` computed once. Without response tokens in some row (``Sequences.filler``): a right-padded pass."""
    passes = passes_with(passes, settings)
    layout = seqs.host_layout()
    n, width = seqs.input_ids.shape
    first = torch.full((n,), width, dtype=torch.long).scatter_reduce(0, layout.rows, layout.cols, "amin")
    if bool((first >= width).any()):
        return sequence_logprobs(model, seqs, temperature, passes, vocab_mean)
    device = seqs.input_ids.device
    prompt_len, response_len = first + 1, layout.lengths - first - 1  # [N] each, on the host
    keys, owner = torch.unique(layout.prompts, return_inverse=True)  # owner [N]: each row's distinct prompt
    shown_by = torch.full((len(keys),), n).scatter_reduce(0, owner, torch.arange(n), "amin")  # [U] a row of each
    shown = prompt_len[shown_by]  # [U] the distinct prompts' lengths
    span = int(shown.max())
    left = span - shown  # [U] left padding
    cols = torch.arange(span)
    prompt_mask = cols >= left[:, None]  # [U, span]
    flat = seqs.input_ids.flatten()
    prompt_at = shown_by[:, None] * width + (cols - left[:, None]).clamp(min=0)  # [U, span] into the flattened ids
    inputs = {"input_ids": flat.index_select(0, to_device(prompt_at.flatten(), device)).view(len(keys), span),
              "position_ids": to_device((cols - left[:, None]).clamp(min=0), device), "use_cache": True}
    if bool(left.any()):  # prompts of one length need no mask (transformers reads a mask's padding on the device)
        inputs["attention_mask"] = to_device(prompt_mask.long(), device)
    owner_d = to_device(owner, device)
    first_tokens = flat.index_select(0, to_device(torch.arange(n) * width + prompt_len, device))[:, None]  # [N, 1]
    if takes_logits_to_keep(model):
        inputs["logits_to_keep"] = 1
    heads, output = model_stats(model, inputs, select=lambda out: out[:, -1:].index_select(0, owner_d),
                                targets=first_tokens, temperature=temperature, passes=passes, vocab_mean=vocab_mean)
    rows = [torch.arange(n)]  # where each computed value goes in [N, T - 1]: first the responses' first tokens
    places = [first]
    values = [[h[:, 0] for h in heads]]
    fed = int(response_len.max()) - 1  # response tokens fed per row: all but the last
    if fed > 0:
        cache = output.past_key_values
        require(cache is not None, "Batching.shared_prompts", True,
                allowed="a model that returns its KV cache in training (no activation checkpointing); set it to false")
        cache.reorder_cache(owner_d)  # [U] -> [N]: each row its prompt's keys and values
        steps = torch.arange(fed)
        fed_mask = steps < (response_len - 1)[:, None]  # [N, fed]
        at = torch.arange(n)[:, None] * width + prompt_len[:, None] + steps  # [N, fed] flattened, may overrun a row
        at = torch.where(fed_mask, at, torch.arange(n)[:, None] * width)  # pads read the row's first token
        ids = flat.index_select(0, to_device(at.flatten(), device)).view(n, fed)
        targets = flat.index_select(0, to_device((at + 1).flatten(), device)).view(n, fed)
        mask = torch.cat([prompt_mask[owner], fed_mask], 1)
        positions = torch.where(fed_mask, prompt_len[:, None] + steps, prompt_len[:, None])  # pads: no new position
        inputs = {"input_ids": ids, "attention_mask": to_device(mask.long(), device), "past_key_values": cache,
                  "position_ids": to_device(positions, device), "use_cache": True}
        rest, _ = model_stats(model, inputs, select=lambda out: out, targets=targets, temperature=temperature,
                              passes=passes, vocab_mean=vocab_mean)
        kept_rows, kept_steps = fed_mask.nonzero(as_tuple=True)
        rows.append(kept_rows)
        places.append(first[kept_rows] + 1 + kept_steps)
        kept_rows_d, kept_steps_d = to_device(kept_rows, device), to_device(kept_steps, device)
        values.append([r[kept_rows_d, kept_steps_d] for r in rest])
    rows_d, places_d = to_device(torch.cat(rows), device), to_device(torch.cat(places), device)
    scored = seqs.response_mask[rows_d, places_d]
    return tuple(torch.cat(parts).new_zeros(seqs.response_mask.shape).index_put((rows_d, places_d),
                                                                                 torch.cat(parts) * scored)
                 for parts in zip(*values))


def check_shared_prompts(model, key: str = "Batching.shared_prompts") -> None:
    """Raise :class:`~evolrl.settings.SettingError` unless ``model`` computes, prompts shared, what a right-padded
    pass does on its device and in its precision (call it under the run's autocast): not sharded by FSDP2, no
    activation checkpointing, and on a probe the log-probs and a gradient within ``tolerance`` of the padded pass's."""
    require(not hasattr(model, "set_requires_gradient_sync"), key, True,
            allowed="false under FSDP2 (two forwards before one backward are untried with its hooks)")
    require(not getattr(model, "is_gradient_checkpointing", False), key, True,
            allowed="false for a model that checkpoints its activations (transformers then keeps no KV cache)")
    values, gradient = shared_prompt_gap(model)
    most = tolerance(model)
    require(values <= most and gradient <= most, key, True,
            allowed=f"false for this model: on a probe a shared-prompt pass's log-probs moved by {values:.2g} and a "
            f"gradient by {gradient:.2g} (relative) from a right-padded pass's, more than {most:g}")


def tolerance(model) -> float:
    """What :func:`check_shared_prompts` allows: 1e-3 in float32 (its rounding leaves 1e-6), 0.1 in half precision
    or under autocast (bf16 rounds a log-prob of a few nats by up to 0.03); a wrong mask or position moves the probe's
    log-probs by whole nats, and a NaN fails either."""
    parameter = next(model.parameters())
    half = parameter.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(parameter.device.type)
    return 0.1 if half else 1e-3


def shared_prompt_gap(model) -> tuple[float, float]:
    """How far a shared-prompt pass is from a right-padded one on a probe (two prompts of different lengths, so one
    is left-padded; three responses of 1 to 4 tokens): the most a log-prob differs, and the relative difference of
    the gradient of a weighted sum of log-probs with respect to the first trainable matrix of the model's first
    block (reached through every prompt's keys and values). 0 up to the kernels' rounding."""
    vocab = min(int(model.config.vocab_size), 200)
    device = next(model.parameters()).device
    a, b = (torch.arange(6) * 7 + 3) % vocab, (torch.arange(4) * 11 + 5) % vocab
    rows = [(a, [9, 4, 17, 2]), (a, [8]), (b, [12, 6])]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    response = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for i, (prompt, answer) in enumerate(rows):
        row = torch.cat([prompt, torch.tensor(answer) % vocab])
        ids[i, : len(row)], attention[i, : len(row)] = row, 1
        response[i, len(prompt) - 1 : len(row) - 1] = True
    seqs = Sequences(ids, attention, response_mask=response, advantages=torch.zeros(len(rows))).to(device)
    weights = (torch.arange(response.numel(), dtype=torch.float32).view(response.shape) % 3 - 1).to(device)
    probed = next(p for n, p in model.named_parameters() if p.requires_grad and p.dim() == 2 and "embed" not in n)
    training = model.training
    model.eval()  # no dropout: the passes must differ only in how they run
    try:
        results = []
        for logprobs in (shared_prompt_logprobs, sequence_logprobs):
            logp = logprobs(model, seqs, temperature=1.0, chunk_size=64)[0]
            (gradient,) = torch.autograd.grad((logp * weights * seqs.response_mask).sum(), [probed])
            results.append((logp.detach().float() * seqs.response_mask, gradient.float()))
    finally:
        model.train(training)
    (shared, shared_grad), (padded, padded_grad) = results
    relative = (shared_grad - padded_grad).norm() / padded_grad.norm().clamp(min=1e-30)
    return float((shared - padded).abs().max()), float(relative)
