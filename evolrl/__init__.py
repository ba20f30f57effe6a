"""evolrl: EVOL-RL (majority selection + novelty variation) on PyTorch Lightning.

The pipeline reads top to bottom in the package layout:
``data -> rollout -> rewards -> algorithms -> training -> callbacks``, with
``metrics`` holding the pure evaluation functions. ``rewards`` and ``metrics``
import neither Lightning nor vLLM.
"""

__version__ = "0.1.0"
