"""Evaluation and diagnostic metrics: pure functions, and pass@k / maj@k as torchmetrics metrics (no Lightning)."""

from evolrl.metrics.diagnostics import label_free_diagnostics
from evolrl.metrics.eval_metrics import EvalMetrics, MajAtKMetric, PassAtKMetric, problem_key
from evolrl.metrics.majk import maj_at_k
from evolrl.metrics.passk import pass_at_k

__all__ = [
    "EvalMetrics",
    "MajAtKMetric",
    "PassAtKMetric",
    "label_free_diagnostics",
    "maj_at_k",
    "pass_at_k",
    "problem_key",
]
