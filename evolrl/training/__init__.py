"""The Lightning side: the training module, its GRPO update and its optimizer."""

from evolrl.training.batching import Batching
from evolrl.training.loss import GRPOLoss
from evolrl.training.module import EvolRLModule
from evolrl.training.optim import Optimization
from evolrl.training.update import GRPOUpdate

__all__ = ["Batching", "EvolRLModule", "GRPOLoss", "GRPOUpdate", "Optimization"]
