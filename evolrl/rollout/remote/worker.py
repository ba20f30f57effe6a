"""The sampler process: one engine, taking requests and weights from its training rank, in order.

It runs :func:`serve` (``torch.multiprocessing``'s spawn start), pinned to its own cores or GPU before torch sets up
any threads or device. Requests arrive on a pipe and are answered in the order they came, so a request sent after
the push of version ``v`` (and before the next) samples with ``v``: which weights a batch is sampled with depends on
the order of the trainer's calls alone, never on timing, and a run is reproducible. Time blocked on an empty pipe is
the sampler's idle time, reported with every result. Any error is sent back, named, before the process exits.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections import deque
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
    """Pin to the sampler's cores or GPU, and leave the trainer's launcher behind (its ranks are not ours).

    SIGTERM, SIGUSR1 and SIGINT are the trainer's to act on (a scheduler or a terminal signals the whole process
    group): the trainer saves at the end of its step, which needs the sampler, then stops it. A sampler left behind by
    a killed trainer ends when its pipe closes.
    """
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    for key in LAUNCHER_VARIABLES:
        os.environ.pop(key, None)
    if spec.cuda_device is not None:  # an index among the GPUs the trainer sees, as the trainer's own are
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        mask = visible.split(",") if visible else None
        os.environ["CUDA_VISIBLE_DEVICES"] = mask[spec.cuda_device] if mask else str(spec.cuda_device)
    if spec.cores is not None:
        os.sched_setaffinity(0, spec.cores)
        os.environ["OMP_NUM_THREADS"] = str(len(spec.cores))


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
        inbox, idle = Inbox(conn), 0.0
        while True:
            waited = time.perf_counter()
            message = inbox.next()
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
            elif kind in ("sample", "eval"):
                ticket, prompts, prompt_ids = message[1:4]
                batch = (rollouts.sample(prompts, prompt_ids, round=message[5], index=message[4]) if kind == "sample"
                         else rollouts.sample_eval(prompts, prompt_ids))
                inbox.drain()  # the trainer may be sending more while this result comes back
                conn.send(("result", ticket, batch, idle))
            else:
                raise ValueError(f"unknown request {kind!r}")
    except BaseException as err:  # noqa: BLE001 - reported to the trainer, which raises it there
        try:
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        except (OSError, EOFError):
            pass
        raise SystemExit(1) from None


class Inbox:
    """The requests from the trainer, read in order; the process ends when the trainer is gone (its pipe end
    closes, or it is no longer this process's parent)."""

    def __init__(self, conn) -> None:
        self.conn, self.parent, self.pending = conn, os.getppid(), deque()

    def next(self) -> tuple:
        if self.pending:
            return self.pending.popleft()
        while not self.conn.poll(1.0):
            if os.getppid() != self.parent:
                raise SystemExit(1)
        return self.conn.recv()

    def drain(self) -> None:
        while self.conn.poll(0):
            self.pending.append(self.conn.recv())
