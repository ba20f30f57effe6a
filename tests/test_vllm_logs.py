"""vLLM's per-step notices are dropped by message; its other warnings and its errors still reach the user."""

from __future__ import annotations

import logging

from evolrl.rollout.vllm_logs import QUIET, quiet_vllm_notices


def test_only_the_named_notices_are_dropped(caplog):
    quiet_vllm_notices()
    quiet_vllm_notices()  # idempotent: one filter per logger
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    assert len(layerwise.filters) == 1
    with caplog.at_level(logging.DEBUG):
        layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")  # the rotary cos/sin buffer: dropped
        layerwise.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real layer: kept
        logging.getLogger("vllm.v1.worker.cpu_worker").warning(
            "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
        logging.getLogger("vllm.v1.worker.cpu_worker").warning("Speculative decoding on CPU ...")
        logging.getLogger("vllm.renderers.base").error("Chat template warmup failed")  # an error: never dropped
        logging.getLogger("vllm.model_executor.model_loader.reload.inplace").info(
            "Reloading and processing weights took %.2f seconds", 0.31)
        pool = logging.getLogger("vllm.v1.core.block_pool")
        pool.info("Successfully reset prefix cache")
        pool.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet", 3)  # kept
        executor = logging.getLogger("vllm.v1.executor.abstract")
        executor.info("It took %.6f seconds to fall asleep.", 0.02)  # every sampling call with sleep_level
        executor.warning("Executor is already sleeping.")  # kept
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["QKVParallelLinear: Failed to load weights", "Speculative decoding on CPU ...",
                        "Chat template warmup failed",
                        "Failed to reset prefix cache because some blocks (3) are not freed yet",
                        "Executor is already sleeping."]
    assert set(QUIET) == {"vllm.model_executor.model_loader.reload.layerwise", "vllm.v1.worker.cpu_worker",
                          "vllm.renderers.base", "vllm.model_executor.model_loader.reload.inplace",
                          "vllm.v1.core.block_pool", "vllm.v1.executor.abstract", "vllm.v1.worker.gpu_worker",
                          "vllm.device_allocator.cumem"}
