"""vLLM's per-step notices that say nothing to an evolrl user, filtered by message; everything else passes.

The colocated engine receives new weights after every training step, and vLLM then logs, each time:

* ``RotaryEmbedding: Failed to load weights``: the rotary layer's cos/sin cache is a buffer computed from
  the config, never part of the streamed weights; vLLM puts its own copy back (the engine log-prob tests
  show the engine samples from exactly the policy's weights).
* ``CPU backend doesn't allow to use torch.set_num_threads ...``: on the CPU build vLLM pins its threads and
  turns every later ``torch.set_num_threads`` call in the process into this warning.
* ``Chat template warmup failed``: the engine takes token ids and has no tokenizer by design.
* ``Reloading and processing weights took ...`` and ``Successfully reset prefix cache``: the two halves of
  every weight push (info level); the engine's step timings already count the push. A cache that cannot
  be reset is still a warning from vLLM, and an error from the engine.
* ``It took ... to fall asleep`` / ``to wake up tags``, ``Sleep mode freed ...``, ``CuMemAllocator: sleep
  freed ...``: with ``sleep_level``, every sampling call and push (info level).

Only these exact messages are dropped: other warnings and every error from the same loggers still reach
the user (``tests/test_vllm_logs.py``). Filters, not levels: vLLM resets its loggers' levels.
"""

from __future__ import annotations

import logging

QUIET = {
    "vllm.model_executor.model_loader.reload.layerwise": ("RotaryEmbedding: Failed to load weights",),
    "vllm.model_executor.model_loader.reload.inplace": ("Reloading and processing weights took",),
    "vllm.v1.core.block_pool": ("Successfully reset prefix cache",),
    "vllm.v1.worker.cpu_worker": ("CPU backend doesn't allow to use `torch.set_num_threads`",),
    "vllm.renderers.base": ("Chat template warmup failed",),
    "vllm.v1.executor.abstract": ("It took",),  # its sleep / wake-up / discard timings, nothing else
    "vllm.v1.worker.gpu_worker": ("Sleep mode freed",),
    "vllm.device_allocator.cumem": ("CuMemAllocator: sleep freed",),
}
"""Logger name -> the message starts that are dropped (at warning level or below only)."""


class DropNotices(logging.Filter):
    """Drops records at WARNING or below whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or not record.getMessage().startswith(self.starts)


def quiet_vllm_notices() -> None:
    """Attach the filters (once per logger)."""
    for name, starts in QUIET.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropNotices) for f in logger.filters):
            logger.addFilter(DropNotices(starts))
