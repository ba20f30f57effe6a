"""Where a training step's rollouts come from, and when the sampler gets new weights: the data module's one call
for each (``evolrl/rollout/sampler.py``), with the off-policy lag and the sampler's placement behind them.

* ``max_staleness`` k = 0, no sampler process: a batch is sampled when the step asks for it, with the step's
  weights, by the engine in this process (on-policy, as the paper's runs).
* k >= 1: a delay line of k batches. At the first step the step's prompts and the loader's next k are all sampled
  with version 0; from then on each step queues its own prompts, sampled with its weights, and trains on the batch
  queued k steps before: batch j is sampled with version ``max(0, j - k)`` (further rounds of dynamic sampling move
  the line on too, so a batch is never more than k versions old). Seeds follow the batch's place in the line.
* A sampler process (``SamplerPlacement``): the engine runs there; queued batches are sampled while the trainer
  updates, and a weight push waits only for the batch in progress. Colocated, k >= 1 samples the same batches with
  the same seeds, one after the other.
* Evaluation samples with the current weights, after the queued batches (a sampler works in order); the queue keeps
  its batches and their versions.
* Checkpoints hold the queued batches, sampled, so a resumed run trains on exactly what the uninterrupted one would.
* The line's last k batches are sampled and never trained; the first epoch has k steps fewer (the line took them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import torch.distributed as dist
from torch import nn

from evolrl.rollout.plain import batch_from_plain, batch_to_plain
from evolrl.rollout.ranks import fail_together, several_ranks
from evolrl.rollout.remote.client import RemoteSampler
from evolrl.rollout.rollouts import Rollouts
from evolrl.rollout.vllm_weights import full_tensors
from evolrl.types import RolloutBatch


class RolloutSupply:
    """A run's rollouts for training and evaluation, and the weights' way to the engine (module docstring)."""

    def __init__(self, rollouts: Rollouts, max_staleness: int) -> None:
        self.rollouts = rollouts
        self.max_staleness = max_staleness
        self.remote: RemoteSampler | None = None
        self.queue: deque = deque()  # batches (or a sampler's tickets for them), oldest first
        self.queued = 0
        """Batches queued so far in the run: the place (and seeds) of the next."""
        self.started = False
        self._marks = (0.0, 0.0)

    @property
    def lagged(self) -> bool:
        """Whether training batches go through the queue (off-policy, or sampled by a process of their own)."""
        return self.max_staleness > 0 or self.remote is not None

    def sample_training(self, prompts: Sequence, prompt_ids: Sequence, round: int = 0,
                        next_prompts: Callable[[], tuple[Sequence, Sequence]] | None = None) -> RolloutBatch:
        """The batch to train on now, sampled now or taken from the line; ``prompts`` go into the line
        (``next_prompts()``: the loader's next prompts and their ids, to fill the line at the first step)."""
        if not self.lagged:
            return self.rollouts.sample(prompts, prompt_ids, round=round)
        return self._together(lambda: self._lagged(prompts, prompt_ids, round, next_prompts))

    def _lagged(self, prompts: Sequence, prompt_ids: Sequence, round: int, next_prompts) -> RolloutBatch:
        if self.max_staleness == 0:  # a sampler process, on-policy: seeds as in this process
            return self._result(self._submit(prompts, prompt_ids, round=round))
        self.queue.append(self._submit(prompts, prompt_ids, index=self._next_index()))
        if not self.started:
            for _ in range(self.max_staleness):
                self.queue.append(self._submit(*next_prompts(), index=self._next_index()))
        self.started = True
        return self._result(self.queue.popleft())

    def sample_evaluation(self, prompts: Sequence, prompt_ids: Sequence) -> RolloutBatch:
        """Evaluation groups, sampled now with the current weights."""
        if self.remote is None:
            return self.rollouts.sample_eval(prompts, prompt_ids)
        return self._together(lambda: self.remote.result(self.remote.submit(prompts, prompt_ids, evaluation=True)))

    def push(self, policy: nn.Module, new: bool = True) -> None:
        """Give the engine ``policy``'s weights as the next version, or as the current one unless it holds them."""
        if new or not self.rollouts.loaded:
            self.rollouts.push(policy, new_version=new, load=self._push_remote if self.remote is not None else None)

    def _push_remote(self, policy: nn.Module, version: int) -> None:
        tensors = full_tensors(policy, self.rollouts.engine.weights_dtype(policy))
        self._together(lambda: self.remote.push(tensors, version))

    def timings(self) -> dict[str, float]:
        """Since the last call: the trainer's wait on its sampler process and the sampler's idle seconds."""
        if self.remote is None:
            return {}
        waited, idle = self.remote.waited, self.remote.idle
        marks, self._marks = self._marks, (waited, idle)
        return {"rollout_wait": waited - marks[0], "sampler_idle": idle - marks[1]}

    def _together(self, call):
        """``call()``, a failure of one rank's sampler process an error on every rank (``ranks.fail_together``)."""
        return fail_together("sampler process", call) if self.remote is not None else call()

    def _next_index(self) -> int:
        self.queued += 1
        return self.queued - 1

    def _submit(self, prompts, prompt_ids, index: int | None = None, round: int = 0):
        if self.remote is not None:
            return self.remote.submit(prompts, prompt_ids, index=index, round=round)
        return self.rollouts.sample(prompts, prompt_ids, round=round, index=index)

    def _result(self, queued) -> RolloutBatch:
        return queued if isinstance(queued, RolloutBatch) else self.remote.result(queued)

    def state_dict(self) -> dict:
        """The weights version and the line, every rank's (a checkpoint is written from rank 0's state), sampled."""
        self.queue = deque(self._together(lambda: [self._result(q) for q in self.queue]))
        return {"version": self.rollouts.version, "queued": self.queued, "started": self.started,
                "max_staleness": self.max_staleness, "queues": every_rank([batch_to_plain(b) for b in self.queue])}

    def load_state_dict(self, state: dict) -> None:
        """The version and the line; a line saved with another ``max_staleness`` or number of ranks is dropped."""
        self.rollouts.load_state_dict({"version": state["version"]})
        self.queued, self.started = state.get("queued", 0), state.get("started", False)
        queues = state.get("queues", [[]])
        changed = restarted_line(state.get("max_staleness", self.max_staleness), self.max_staleness, len(queues),
                                 len(every_rank(None)), sum(map(len, queues)))
        if changed:
            queues, self.started = [], False
            if self.rollouts.rank == 0:
                print(changed, flush=True)
        mine = queues[self.rollouts.rank] if self.rollouts.rank < len(queues) else []
        self.queue = deque(batch_from_plain(b) for b in mine)

    def stop(self) -> None:
        if self.remote is not None:
            self.remote.stop()
            self.remote = None
            self.rollouts.loaded = False  # a later sampler process starts without weights


def restarted_line(saved: int, now: int, saved_ranks: int, ranks: int, queued: int) -> str | None:
    """Why a checkpoint's line of ``queued`` batches cannot go on (saved with ``saved`` steps of lag and
    ``saved_ranks`` ranks, resumed with ``now`` and ``ranks``), as the line said at start; ``None``: it goes on.

    Its batches were sampled k steps ahead for k = ``saved``: under another k they would train staler or fresher
    than asked, and under other ranks on another rank's prompts. So they are dropped, never trained (their prompts
    come again next epoch), and the line starts again at the next step as at a run's first: the checkpoint stays
    usable with any lag, and the same lag resumes exactly."""
    if not queued or (saved == now and saved_ranks == ranks and now > 0):
        return None
    was = f"data.max_staleness={saved}" if saved != now or not now else f"{saved_ranks} ranks"
    return (f"evolrl: the checkpoint's {queued} queued rollout batch(es), sampled ahead for {was}, are dropped and "
            f"never trained (now data.max_staleness={now}, {ranks} rank(s)); the off-policy line starts again at the "
            "next step")


def every_rank(value) -> list:
    """``value`` of every rank, in rank order (a collective with several ranks)."""
    if not several_ranks():
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
