"""Rollout engines: sample response groups with the latest policy weights."""

from evolrl.rollout.engine import RolloutEngine, Sampling, stop_token_ids
from evolrl.rollout.hf_engine import HFEngine
from evolrl.rollout.vllm_engine import VLLMEngine

__all__ = ["HFEngine", "RolloutEngine", "Sampling", "VLLMEngine", "stop_token_ids"]
