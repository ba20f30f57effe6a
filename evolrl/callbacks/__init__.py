"""Metric callbacks that plug into any Lightning RL module (see ``contract.py``)."""

from evolrl.callbacks.collapse import CollapseMonitor
from evolrl.callbacks.contract import EvalView, TrainView, evolrl_eval_view, evolrl_train_view
from evolrl.callbacks.diagnostics import LabelFreeDiagnostics
from evolrl.callbacks.eval_responses import EvalResponses
from evolrl.callbacks.pass_at_k import PassAtK
from evolrl.callbacks.policy_stats import PolicyStats
from evolrl.callbacks.progress_lines import LineProgress
from evolrl.callbacks.run_summary import RunSummary
from evolrl.callbacks.samples import SampleLogger



def missing_defaults(present) -> list:
    """evolrl's metric callbacks (``EvolRLModule.configure_callbacks``) of the kinds ``present`` lacks."""
    have = {type(c) for c in present}
    return [c for c in (LabelFreeDiagnostics(), PolicyStats(), PassAtK(), SampleLogger(), RunSummary())
            if type(c) not in have]


__all__ = [
    "CollapseMonitor",
    "EvalResponses",
    "EvalView",
    "LabelFreeDiagnostics",
    "LineProgress",
    "PassAtK",
    "PolicyStats",
    "RunSummary",
    "SampleLogger",
    "TrainView",
    "evolrl_eval_view",
    "evolrl_train_view",
    "missing_defaults",
]
