"""Label-free rewards: answers, majority vote, novelty, and the reward classes built from them.

Nothing here imports Lightning or vLLM.

Naming rule: a module is named after the one public thing it defines (``voting.py``: the vote;
``novelty_bands.py``: :class:`NoveltyBands`; ``answer_sheet.py``: :class:`AnswerSheet` and the
:class:`AnswerReward` base that fills it in); a reward class ends in ``Reward`` and lives in
``<name>_reward.py`` (:class:`EvolReward` in ``evol_reward.py``), or, when it has parts of its own (a teacher, a
measuring pass), in a folder ``<name>/`` whose ``reward.py`` holds it. ``base.py`` holds the :class:`Reward`
interface and its hooks, ``context.py`` the :class:`RewardContext` they are given.

* ``answers.py``: reading a final answer and where it was read (its span, trailing text after it), the validity
  rule; ``answer_rules.py``: :class:`AnswerRules`, the settings of that reading that every reward and grader takes;
  ``equivalence.py``: when two answers are the same;
* ``voting.py``: equivalence classes and the majority vote of one group;
* ``novelty.py``: the novelty score and its bands as tensor math; ``embedders.py``: sentence embedders;
* ``novelty_bands.py``: the configured novelty object (embedder, ``alpha``, ``novelty_text``, ``min_spread``);
* ``evol_reward.py``, ``majority_vote_reward.py``, ``verifier_reward.py``: the rewards; ``consensus_gate.py``: when a
  majority may teach (:class:`ConsensusGate`, an option of the majority-vote family);
* ``policy_signal.py``: what the policy says of each trained response (:class:`PolicySignal`) and the base of the
  rewards that read it (:class:`PolicyReward`);
* the other label-free methods, one each: ``self_certainty_reward.py`` (Intuitor), ``token_entropy_reward.py``
  (RENT), ``semantic_entropy_reward.py`` (EMPO), ``self_harmony_reward.py`` (Self-Harmony, which samples the
  policy's own rewrites through the run's context); ``restrain/`` (RESTRAIN, with its prompt-weight pass),
  ``co_rewarding/`` (Co-rewarding II, with its EMA teacher) and ``scope/`` (SCOPE, with its confidence and subgroup
  search): rewards written against the hooks alone.
"""

from evolrl.rewards.answer_rules import AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward, AnswerSheet
from evolrl.rewards.answers import (
    AnswerSpan,
    extract_choice,
    final_part,
    has_trailing_text,
    read_answer,
)
from evolrl.rewards.base import Reward
from evolrl.rewards.co_rewarding import CoRewardingReward
from evolrl.rewards.consensus_gate import ConsensusGate
from evolrl.rewards.context import RewardContext
from evolrl.rewards.embedders import Embedder, EmbedderError, SentenceTransformerEmbedder
from evolrl.rewards.equivalence import answers_equivalent, normalize_answer
from evolrl.rewards.evol_reward import EvolReward
from evolrl.rewards.majority_vote_reward import MajorityVoteReward
from evolrl.rewards.novelty import band_rewards, novelty_spread, novelty_values
from evolrl.rewards.novelty_bands import NoveltyBands
from evolrl.rewards.policy_signal import PolicyReward, PolicySignal
from evolrl.rewards.restrain import PromptWeights, RestrainReward
from evolrl.rewards.scope import ScopeReward
from evolrl.rewards.self_certainty_reward import SelfCertaintyReward
from evolrl.rewards.self_harmony_reward import SelfHarmonyReward
from evolrl.rewards.semantic_entropy_reward import SemanticEntropyReward
from evolrl.rewards.token_entropy_reward import TokenEntropyReward
from evolrl.rewards.verifier_reward import VerifierReward
from evolrl.rewards.voting import group_answers, majority_class

__all__ = [
    "AnswerReward",
    "AnswerRules",
    "AnswerSheet",
    "AnswerSpan",
    "CoRewardingReward",
    "ConsensusGate",
    "Embedder",
    "EmbedderError",
    "EvolReward",
    "MajorityVoteReward",
    "NoveltyBands",
    "PolicyReward",
    "PolicySignal",
    "PromptWeights",
    "Reward",
    "RewardContext",
    "RestrainReward",
    "ScopeReward",
    "SelfCertaintyReward",
    "SelfHarmonyReward",
    "SemanticEntropyReward",
    "SentenceTransformerEmbedder",
    "TokenEntropyReward",
    "VerifierReward",
    "answers_equivalent",
    "band_rewards",
    "extract_choice",
    "final_part",
    "group_answers",
    "has_trailing_text",
    "majority_class",
    "normalize_answer",
    "novelty_spread",
    "novelty_values",
    "read_answer",
]
