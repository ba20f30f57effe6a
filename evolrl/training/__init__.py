"""The Lightning side: the training module, its sequences and its optimizer."""

from evolrl.training.module import EvolRLModule, GRPOLoss
from evolrl.training.optim import Optimization

__all__ = ["EvolRLModule", "GRPOLoss", "Optimization"]
