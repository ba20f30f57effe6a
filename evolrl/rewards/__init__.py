"""Label-free rewards: answers, majority vote, novelty, and the reward classes built from them.

Nothing here imports Lightning or vLLM.
"""

from evolrl.rewards.answers import extract_answer, extract_choice, final_part, is_valid_response
from evolrl.rewards.base import AnswerReward, NoveltyBands, Reward
from evolrl.rewards.embedders import Embedder, EmbedderError, SentenceTransformerEmbedder
from evolrl.rewards.equivalence import answers_equivalent, normalize_answer
from evolrl.rewards.evol import EvolReward
from evolrl.rewards.majority import group_answers, majority_vote
from evolrl.rewards.majority_reward import MajorityVoteReward
from evolrl.rewards.novelty import band_rewards, evol_rewards, evol_rewards_batched, novelty_scores
from evolrl.rewards.verifier import VerifierReward

__all__ = [
    "AnswerReward",
    "Embedder",
    "EmbedderError",
    "EvolReward",
    "MajorityVoteReward",
    "NoveltyBands",
    "Reward",
    "SentenceTransformerEmbedder",
    "VerifierReward",
    "answers_equivalent",
    "band_rewards",
    "evol_rewards",
    "evol_rewards_batched",
    "extract_answer",
    "extract_choice",
    "final_part",
    "group_answers",
    "is_valid_response",
    "majority_vote",
    "normalize_answer",
    "novelty_scores",
]
