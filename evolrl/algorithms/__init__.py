"""GRPO's math as plain torch functions and small strategy classes: advantages (:class:`GroupAdvantages`), the
policy-gradient surrogate (:class:`ClippedSurrogate`, :class:`GSPO`, :class:`CISPO`), KL, aggregation
(:class:`TokenMean`, :class:`SeqMeanTokenMean`, :class:`ConstantNormalizer`), the sampler/trainer mismatch and its
corrections (:class:`TokenTruncate`, :class:`SequenceMask`), overlong shaping (:class:`OverlongPenalty`,
:class:`OverlongMask`) and the groups dynamic sampling drops (:func:`agreeing_groups`).

No Lightning, no model code: tensors in, tensors out. Token tensors are ``[N, L]`` with ``N = P * G`` sequences in
group-major order. The classes are what ``model.advantages``, ``model.loss.policy_loss``, ``model.loss.aggregation``,
``model.loss.mismatch_correction`` and ``model.overlong`` choose by ``class_path``.
"""

from evolrl.algorithms.advantages import GroupAdvantages, agreeing_groups, group_advantages
from evolrl.algorithms.aggregation import Aggregation, ConstantNormalizer, SeqMeanTokenMean, TokenMean
from evolrl.algorithms.corrections import MismatchCorrection, SequenceMask, TokenTruncate
from evolrl.algorithms.kl import low_var_kl
from evolrl.algorithms.mismatch import mismatch_summary, mismatch_sums
from evolrl.algorithms.overlong import Overlong, OverlongMask, OverlongPenalty
from evolrl.algorithms.policy_loss import CISPO, GSPO, ClippedSurrogate, PolicyLoss, clipped_surrogate

__all__ = ["CISPO", "GSPO", "Aggregation", "ClippedSurrogate", "ConstantNormalizer", "GroupAdvantages",
           "MismatchCorrection", "Overlong", "OverlongMask", "OverlongPenalty", "PolicyLoss", "SeqMeanTokenMean", "SequenceMask", "TokenMean", "TokenTruncate",
           "agreeing_groups", "clipped_surrogate", "group_advantages", "low_var_kl", "mismatch_summary", "mismatch_sums"]
