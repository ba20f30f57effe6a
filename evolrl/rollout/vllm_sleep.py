"""Sleep mode: vLLM gives its GPU memory back between sampling calls, in the order of TRL's colocated engine.

Without it vLLM holds ``gpu_memory_utilization`` of the GPU (weights + KV cache) for the whole run, also
while the trainer runs its forward and backward passes. The cycle, per call of the engine:

* after sampling: ``sleep(level)``. Level 1 moves the weights to CPU memory, level 2 discards them; both free
  the KV cache. vLLM 0.32 also pauses its scheduler and resets its prefix cache inside ``sleep``
  (``EngineCore.sleep`` -> ``pause_scheduler(clear_cache=True)``).
* before a weight push: wake the weights only (``wake_up(tags=["weights"])``): the new tensors need mapped
  memory to be copied into. The engine then streams them and resets the prefix cache.
* before sampling: wake the KV cache (and, at level 1, the weights from CPU); vLLM resumes scheduling only
  once everything is awake. At level 2 a sampling call that finds the weights discarded (no push since the
  last sleep: evaluation after evaluation, training after evaluation) needs them streamed again first.

So no request can run between new weights and the prefix-cache reset: the cache never holds keys/values
computed with older weights.
"""

from __future__ import annotations

import torch


class SleepCycle:
    """Which parts of one ``vllm.LLM`` sleep, and the calls that put them to sleep and wake them (level 0: none)."""

    def __init__(self, llm, level: int) -> None:
        self.llm = llm
        self.level = level
        self.asleep: set[str] = set()
        """vLLM memory now released: ``weights``, ``kv_cache``."""
        self.weights_lost = False
        """Level 2 discarded the weights, and none were pushed since."""

    def wake(self, tag: str) -> None:
        """Map back the memory behind ``tag`` (``weights`` or ``kv_cache``) if it sleeps."""
        if tag in self.asleep:
            torch.cuda.empty_cache()  # the trainer's cached blocks would leave vLLM too little (TRL does this too)
            self.llm.wake_up(tags=[tag])
            self.asleep.discard(tag)

    def before_push(self) -> None:
        self.wake("weights")  # the KV cache sleeps on: no request can run until the prefix cache is reset
        self.weights_lost = False

    def before_sampling(self) -> None:
        if self.weights_lost:
            raise RuntimeError("vLLM's weights were discarded at sleep level 2: push the policy's weights first")
        self.wake("weights")
        self.wake("kv_cache")
        if self.llm.llm_engine.is_sleeping():  # its scheduler would queue the requests forever
            raise RuntimeError("vLLM is still asleep after waking its weights and KV cache")

    def after_sampling(self) -> None:
        if self.level:
            self.llm.sleep(level=self.level)
            self.asleep = {"weights", "kv_cache"}
            self.weights_lost = self.level == 2
