"""SCOPE (Wang et al. 2025, arXiv 2512.15146): votes weighed by step-wise confidence, one label per subgroup.

``confidence.py``: a response's vote weight from its sampled tokens' log-probs, averaged step by step;
``subgroups.py``: the labels of one subgroup size and the Pareto choice of that size; ``reward.py``: the reward.
"""

from evolrl.rewards.scope.reward import ScopeReward

__all__ = ["ScopeReward"]
