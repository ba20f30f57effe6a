"""Evaluation and diagnostic metrics: pure functions, and pass@k / maj@k as torchmetrics metrics (no Lightning)."""

from evolrl.metrics.diagnostics import label_free_diagnostics
from evolrl.metrics.eval_metrics import EvalMetrics, MajAtKMetric, PassAtKMetric, problem_key
from evolrl.metrics.majk import bootstrap_maj_at_k, maj_at_k
from evolrl.metrics.passk import bootstrap_pass_at_k, pass_at_k

__all__ = [
    "EvalMetrics",
    "MajAtKMetric",
    "PassAtKMetric",
    "bootstrap_maj_at_k",
    "bootstrap_pass_at_k",
    "label_free_diagnostics",
    "maj_at_k",
    "pass_at_k",
    "problem_key",
]
