"""RESTRAIN (Yu et al., ICLR 2026, arXiv 2510.02172): every answer of a group a pseudo-label weighed by its votes.

``reward.py``: the reward, its advantages and its hooks (the prompt weights measured at start, kept in checkpoints);
``prompt_weights.py``: the base model's pass over the training prompts that measures them.
"""

from evolrl.rewards.restrain.reward import PromptWeights, RestrainReward

__all__ = ["PromptWeights", "RestrainReward"]
