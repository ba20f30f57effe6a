"""Co-rewarding II (Zhang et al., ICLR 2026, arXiv 2508.00410): the pseudo-label is a slow EMA teacher's majority.

``reward.py``: the reward and its hooks (the teacher built at start, moved before each step, sampled at each call,
kept in checkpoints); ``teacher.py``: the average, its schedule and how it samples through the run's engine.
"""

from evolrl.rewards.co_rewarding.reward import CoRewardingReward
from evolrl.rewards.co_rewarding.teacher import EMATeacher, decay_at, teacher_sampler

__all__ = ["CoRewardingReward", "EMATeacher", "decay_at", "teacher_sampler"]
