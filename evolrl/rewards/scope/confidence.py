"""A response's vote weight in SCOPE: its confidence, averaged over its reasoning steps (the paper's token,
step and average-step confidence).

The paper takes each token's confidence from the top-k log-probs of the sampler, ``C_t = -(1/k) sum_j log P_t(j)``
(DeepConf's measure), averages it over each step's tokens (a step ends at a blank line, ``"\\n\\n"``), and the steps
over the response: ``C = (1/S) sum_s mean_{t in s} C_t``. The engines here report the log-prob of the sampled token
only, so a token's measure is that log-prob; two ways to turn it into a weight:

* ``"certainty"`` (default): ``exp(mean_s mean_{t in s} log p_t)``, the step-averaged geometric-mean probability of
  the sampled tokens, in (0, 1]: larger for a response the policy was surer of, the direction of the paper's weight;
* ``"surprisal"``: ``mean_s mean_{t in s} (-log p_t)``, what the authors' released code computes (vLLM asked for
  ``logprobs=0`` returns the sampled token alone), which is larger for a response the policy was *less* sure of.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

STEP_END = "\n\n"
WEIGHTS = ("certainty", "surprisal")


def step_bounds(token_texts: Sequence[str], step_end: str = STEP_END) -> list[tuple[int, int]]:
    """``[start, end)`` token ranges of the steps: a step ends with the token that completes a ``step_end`` (one
    split over two tokens counts), the last step with the last token. No tokens, no steps."""
    bounds, start, text, seen = [], 0, "", 0
    for i, piece in enumerate(token_texts):
        text += piece
        if text.count(step_end) > seen:
            seen = text.count(step_end)
            bounds.append((start, i + 1))
            start = i + 1
    if start < len(token_texts):
        bounds.append((start, len(token_texts)))
    return bounds


def step_mean(logprobs: Sequence[float], bounds: Sequence[tuple[int, int]]) -> float:
    """``(1/S) sum_s mean_{t in s} log p_t``; NaN for a response without tokens."""
    if not bounds:
        return math.nan
    return sum(sum(logprobs[a:b]) / (b - a) for a, b in bounds) / len(bounds)


def vote_weight(logprobs: Sequence[float], token_texts: Sequence[str], weight: str = "certainty",
                step_end: str = STEP_END) -> float:
    """The response's weight in its subgroups' votes (module docstring); 0 for a response without tokens."""
    mean = step_mean(logprobs, step_bounds(token_texts, step_end))
    if math.isnan(mean):
        return 0.0
    return math.exp(mean) if weight == "certainty" else -mean


def token_texts(decode: Callable[[int], str], ids: Sequence[int], cache: dict[int, str]) -> list[str]:
    """Each token's text, decoded once per token id (``cache``): a step boundary is found in the pieces' sum."""
    out = []
    for t in ids:
        if t not in cache:
            cache[t] = decode(t)
        out.append(cache[t])
    return out
