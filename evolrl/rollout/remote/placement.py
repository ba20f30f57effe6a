"""Where a separate sampler process runs: its own CPU cores or GPU, one process per training rank.

The settings are checked where they are declared (core lists parse, no GPU twice) and against the trainer at the
start of ``fit`` (:func:`check_placement`: a core or GPU that the trainer also uses is refused).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from evolrl.settings import check_float, require


def parse_cores(text: str, where: str) -> frozenset[int]:
    """``"1"``, ``"2-3"``, ``"0,4-5"`` as a set of core numbers; a usage error naming ``where`` otherwise."""
    cores: set[int] = set()
    try:
        for part in str(text).split(","):
            low, _, high = part.strip().partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        cores = set()
    require(bool(cores) and min(cores) >= 0, where, text, allowed='core numbers and ranges, e.g. "1" or "2-3,6"')
    return frozenset(cores)


@dataclass(frozen=True)
class SamplerPlacement:
    """Where each training rank's sampler process runs (``data.sampler_process``): the engine in a process of its own
    beside each rank, taking the weights by an in-memory collective (gloo on CPU, NCCL on GPUs); with
    ``data.max_staleness >= 1`` it samples while the trainer updates. The process itself is ``client.py``'s."""

    cpus: tuple[str, ...] = ()
    """Cores of each rank's sampler, one entry per rank (e.g. ``["1"]``); the trainer keeps the others. Empty: not
    pinned, sharing the trainer's cores."""
    cuda_devices: tuple[int, ...] = ()
    """GPU of each rank's sampler, none a trainer's; ranks may share one (``[6, 6, 6, 7, 7, 7]`` beside six trainer
    GPUs: each engine takes its ``gpu_memory_utilization``)."""
    timeout_s: float = 600.0
    """Longest silence of the sampler (no batch, no push done) before the run stops with an error naming it; keep it
    below the trainer's process-group timeout (30 minutes by default)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpus", tuple(str(c) for c in self.cpus))
        object.__setattr__(self, "cuda_devices", tuple(self.cuda_devices))
        sets = [parse_cores(c, f"data.sampler_process.cpus[{i}]") for i, c in enumerate(self.cpus)]
        require(all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1:]), "data.sampler_process.cpus",
                list(self.cpus), allowed="disjoint core lists: one per rank's sampler")
        require(all(isinstance(d, int) and d >= 0 for d in self.cuda_devices), "data.sampler_process.cuda_devices",
                list(self.cuda_devices), allowed="GPU indices, one per rank's sampler")
        check_float("data.sampler_process.timeout_s", self.timeout_s, 0.0, low_open=True)

    def sampler_cores(self, rank: int) -> frozenset[int] | None:
        return parse_cores(self.cpus[rank], f"data.sampler_process.cpus[{rank}]") if self.cpus else None

    def all_sampler_cores(self) -> frozenset[int]:
        return frozenset().union(*(parse_cores(c, "data.sampler_process.cpus") for c in self.cpus))


def check_placement(placement: SamplerPlacement, world_size: int, trainer_devices: list[int] | None) -> None:
    """Usage errors, at the start of ``fit``, for a placement that does not fit this run: one entry per rank, cores
    this process may use with some left for the trainer, no GPU of the trainer's (``trainer_devices``: the CUDA
    indices it trains on; ``None`` on CPU)."""
    for name, entries in (("cpus", placement.cpus), ("cuda_devices", placement.cuda_devices)):
        require(not entries or len(entries) == world_size, f"data.sampler_process.{name}", list(entries),
                allowed=f"one entry per training rank ({world_size})")
    if placement.cpus:
        usable = os.sched_getaffinity(0)
        wanted = placement.all_sampler_cores()
        require(wanted <= usable, "data.sampler_process.cpus", list(placement.cpus),
                allowed=f"cores this process may run on: {sorted(usable)}")
        require(bool(usable - wanted), "data.sampler_process.cpus", list(placement.cpus),
                allowed=f"leaving the trainer at least one of the cores {sorted(usable)}")
    if trainer_devices is None:
        require(not placement.cuda_devices, "data.sampler_process.cuda_devices", list(placement.cuda_devices),
                allowed="[] when training on CPUs (the weights travel over gloo there, NCCL between GPUs)")
    else:
        require(bool(placement.cuda_devices), "data.sampler_process.cuda_devices", [],
                allowed="a GPU per rank's sampler: training on GPUs, the sampler's would otherwise be a trainer's")
        shared = sorted(set(placement.cuda_devices) & set(trainer_devices))
        require(not shared, "data.sampler_process.cuda_devices", list(placement.cuda_devices),
                allowed=f"GPUs the trainer does not use (it trains on {sorted(trainer_devices)}; shared: {shared})")
        seen = torch.cuda.device_count()
        require(max(placement.cuda_devices) < seen, "data.sampler_process.cuda_devices", list(placement.cuda_devices),
                allowed=f"indices of the {seen} GPUs this process sees")


def trainer_gpus(trainer) -> list[int] | None:
    """The CUDA indices a Lightning trainer trains on; ``None`` on CPU."""
    return list(trainer.device_ids) if trainer.strategy.root_device.type == "cuda" else None
