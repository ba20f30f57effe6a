"""Rollouts: engines that sample response groups with the latest policy weights, and their orchestration."""

from evolrl.rollout.engine import DynamicSampling, RolloutEngine, Sampling, stop_token_ids
from evolrl.rollout.hf_engine import HFEngine
from evolrl.rollout.rollouts import Rollouts
from evolrl.rollout.sampler import Sampler, check_engine
from evolrl.rollout.seeds import Seeds
from evolrl.rollout.vllm_engine import VLLMEngine

__all__ = ["DynamicSampling", "HFEngine", "RolloutEngine", "Rollouts", "Sampler", "Sampling", "Seeds", "VLLMEngine",
           "check_engine", "stop_token_ids"]
