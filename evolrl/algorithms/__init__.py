"""GRPO's math as plain torch functions and small strategy classes: advantages (:class:`GroupAdvantages`), the
policy-gradient surrogate (:class:`ClippedSurrogate`, :class:`GSPO`, :class:`CISPO`), KL, aggregation
(:class:`TokenMean`, :class:`SeqMeanTokenMean`, :class:`ConstantNormalizer`), the sampler/trainer mismatch and its
corrections (:class:`TokenTruncate`, :class:`SequenceMask`).

No Lightning, no model code: tensors in, tensors out. Token tensors are ``[N, L]`` with ``N = P * G`` sequences in
group-major order. The classes are what ``model.advantages``, ``model.loss.policy_loss``, ``model.loss.aggregation``
and ``model.loss.mismatch_correction`` choose by ``class_path``.
"""

from evolrl.algorithms.advantages import GroupAdvantages, group_advantages
from evolrl.algorithms.aggregation import Aggregation, ConstantNormalizer, SeqMeanTokenMean, TokenMean
from evolrl.algorithms.corrections import MismatchCorrection, SequenceMask, TokenTruncate
from evolrl.algorithms.kl import low_var_kl
from evolrl.algorithms.mismatch import mismatch_summary, mismatch_sums
from evolrl.algorithms.policy_loss import CISPO, GSPO, ClippedSurrogate, PolicyLoss, clipped_surrogate

__all__ = ["CISPO", "GSPO", "Aggregation", "ClippedSurrogate", "ConstantNormalizer", "GroupAdvantages",
           "MismatchCorrection", "PolicyLoss", "SeqMeanTokenMean", "SequenceMask", "TokenMean", "TokenTruncate",
           "clipped_surrogate", "group_advantages", "low_var_kl", "mismatch_summary", "mismatch_sums"]
