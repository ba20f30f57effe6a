"""evolrl: EVOL-RL (majority selection + novelty variation) on PyTorch Lightning.

A training step flows ``data -> rollout -> rewards -> algorithms -> training``; ``callbacks`` observe what a step
returns. The packages import each other in layers, each only from the layers below it (``tests/test_layout.py``):

1. ``settings``, ``types``: checked settings and the records a step passes along;
2. ``algorithms`` (GRPO's math), ``rewards`` (answers, votes, novelty), ``logprobs`` (the fast log-prob engine);
   ``metrics`` (pass@k, maj@k, grading) reads ``rewards``' answer rules;
3. ``rollout`` (the engines that sample) and ``callbacks`` (metric callbacks usable in any Lightning module);
4. ``data`` (prompt sources and the DataModule, which owns the rollout side);
5. ``training`` (the LightningModule, its update and its loss), then ``cli``.

``algorithms``, ``rewards`` and ``metrics`` import neither Lightning nor vLLM.
"""

__version__ = "0.1.0"
