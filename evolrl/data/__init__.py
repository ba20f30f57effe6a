"""Prompts in, rollout groups out."""

from evolrl.data.benchmarks import Benchmark
from evolrl.data.chat import PAPER_SYSTEM_PROMPT, Example, PromptFormat, render_prompt
from evolrl.data.datamodule import RolloutDataModule
from evolrl.data.eval_set import EvalSet
from evolrl.data.generated import AdditionPrompts, Excluding, numbers_of
from evolrl.data.requests import RolloutRequest
from evolrl.data.sources import DataError, HubDataset, PromptFile, PromptSource
from evolrl.data.word_problems import WordProblems

__all__ = [
    "PAPER_SYSTEM_PROMPT",
    "AdditionPrompts",
    "Excluding",
    "Benchmark",
    "DataError",
    "EvalSet",
    "Example",
    "HubDataset",
    "PromptFile",
    "PromptFormat",
    "PromptSource",
    "RolloutDataModule",
    "RolloutRequest",
    "WordProblems",
    "numbers_of",
    "render_prompt",
]
