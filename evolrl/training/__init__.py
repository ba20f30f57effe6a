"""The Lightning side: the training module, its GRPO update and its optimizer."""

from evolrl.training.module import EvolRLModule
from evolrl.training.optim import Optimization
from evolrl.training.update import GRPOLoss, GRPOUpdate

__all__ = ["EvolRLModule", "GRPOLoss", "GRPOUpdate", "Optimization"]
