"""The sampler process: one engine, taking requests and weights from its training rank, in order.

It runs :func:`serve` (``torch.multiprocessing``'s spawn start), pinned to its own cores or GPU before torch sets up
any threads or device. Requests arrive on a pipe and are answered in the order they came, so a request sent after
the push of version ``v`` (and before the next) samples with ``v``: which weights a batch is sampled with depends on
the order of the trainer's calls alone, never on timing, and a run is reproducible. Time blocked on an empty pipe is
the sampler's idle time, reported with every result. Any error is sent back, named, before the process exits.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@dataclass(frozen=True)
class SamplerSpec:
    """What a sampler process is built from (pickled to it)."""

    rollouts: object
    """The data module's ``Rollouts``, its engine not started."""
    model: str
    trust_remote_code: bool
    longest_prompt: int
    evaluates: bool
    rank: int
    cores: frozenset[int] | None
    cuda_device: int | None
    timeout_s: float


def _place(spec: SamplerSpec) -> None:
    """Pin to the sampler's cores or GPU, and leave the trainer's launcher behind (its ranks are not ours)."""
    for key in LAUNCHER_VARIABLES:
        os.environ.pop(key, None)
    if spec.cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(spec.cuda_device)
    if spec.cores is not None:
        os.sched_setaffinity(0, spec.cores)
        os.environ["OMP_NUM_THREADS"] = str(len(spec.cores))
        cores = ",".join(map(str, sorted(spec.cores)))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cores)


def serve(conn, spec: SamplerSpec, port: int) -> None:
    """The process's whole life: set up, join the weight channel, then answer requests until ``stop``."""
    _place(spec)
    try:
        import torch

        from evolrl.models import empty_policy, load_tokenizer, model_config
        from evolrl.rollout.remote.channel import SamplerEnd

        if spec.cores is not None:
            torch.set_num_threads(len(spec.cores))
        rollouts = spec.rollouts
        rollouts.setup(load_tokenizer(spec.model, spec.trust_remote_code), spec.longest_prompt, spec.evaluates,
                       rank=spec.rank)
        like = empty_policy(model_config(spec.model, spec.trust_remote_code))  # the architecture, for the engine
        device = torch.device("cuda", 0) if spec.cuda_device is not None else torch.device("cpu")
        conn.send(("joining", os.getpid()))
        channel = SamplerEnd(port, device, spec.timeout_s)
        idle = 0.0
        while True:
            waited = time.perf_counter()
            message = conn.recv()
            idle += time.perf_counter() - waited
            kind = message[0]
            if kind == "stop":
                break
            if kind == "push":
                version = message[1]
                conn.send(("ready",))
                rollouts.engine.load_stream(like, channel.receive(conn.recv), version)
                rollouts.version, rollouts.loaded = version, True
                conn.send(("pushed", version))
            elif kind == "sample":
                _, ticket, prompts, prompt_ids, index, round_ = message
                batch = rollouts.sample(prompts, prompt_ids, round=round_, index=index)
                conn.send(("result", ticket, batch, idle))
            elif kind == "eval":
                _, ticket, prompts, prompt_ids = message
                conn.send(("result", ticket, rollouts.sample_eval(prompts, prompt_ids), idle))
            else:
                raise ValueError(f"unknown request {kind!r}")
    except BaseException as err:  # noqa: BLE001 - reported to the trainer, which raises it there
        try:
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        except (OSError, EOFError):
            pass
        raise SystemExit(1) from None
