"""GRPO's math as plain torch functions: log-probs and entropy, advantages, surrogate, KL, aggregation, the
sampler/trainer mismatch.

No Lightning, no model code: tensors in, tensors out. Token tensors are
``[N, L]`` with ``N = P * G`` sequences in group-major order.
"""

from evolrl.algorithms.advantages import group_advantages
from evolrl.algorithms.aggregation import AGGREGATIONS, aggregate, normalizer_count
from evolrl.algorithms.chunked_head import head_logprobs_and_entropy
from evolrl.algorithms.kl import low_var_kl
from evolrl.algorithms.logprobs import logprobs_and_entropy
from evolrl.algorithms.mismatch import CORRECTIONS, correction_weights, mismatch_summary, mismatch_sums
from evolrl.algorithms.policy_loss import clipped_surrogate

__all__ = ["AGGREGATIONS", "CORRECTIONS", "aggregate", "clipped_surrogate", "correction_weights", "group_advantages",
           "head_logprobs_and_entropy", "logprobs_and_entropy", "low_var_kl", "mismatch_summary", "mismatch_sums",
           "normalizer_count"]
