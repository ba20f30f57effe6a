"""A training rank's handle on its sampler process: start it, send it requests and weights, collect its batches.

Every wait on the sampler polls its pipe and its liveness: a sampler that exits is an error within a second, one
that answers nothing for ``data.sampler_process.timeout_s`` is an error then; either names the sampler (rank, pid, cores
or GPU) and the last batch it returned. The start is ``torch.multiprocessing``'s spawn: a fresh interpreter, so the
sampler inherits neither the trainer's threads nor its CUDA context.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterator, Sequence

import torch
import torch.multiprocessing as mp

from evolrl.rollout.remote.channel import TrainerEnd
from evolrl.rollout.remote.placement import SamplerPlacement
from evolrl.rollout.remote.worker import SamplerSpec, serve
from evolrl.types import RolloutBatch


class SamplerFailed(RuntimeError):
    """The sampler process died, hung or raised."""


class RemoteSampler:
    """The trainer's side of one sampler process (see module docstring)."""

    def __init__(self, placement: SamplerPlacement, spec: SamplerSpec, device: torch.device) -> None:
        self.placement, self.spec = placement, spec
        self.channel = TrainerEnd(device, placement.timeout_s)
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, spec, self.channel.port), daemon=True,
                                       name=f"evolrl-sampler-{spec.rank}")
        self.process.start()
        child.close()
        atexit.register(self.stop)  # after multiprocessing's own exit handler, so it runs first
        self.tickets = 0
        self.results: dict[int, RolloutBatch] = {}
        self.last = "none yet"
        self.idle = 0.0
        """The sampler's idle seconds so far (as of its last result)."""
        self.waited = 0.0
        """Seconds the trainer has waited on the sampler so far."""
        self.unpinned: tuple[set[int], int] | None = None
        """This process's cores and threads before ``pin_trainer``."""
        try:
            self._receive("joining")
            self.channel.connect()
        except BaseException:
            self.stop()
            raise

    def describe(self) -> str:
        where = (f"GPU {self.spec.cuda_device}" if self.spec.cuda_device is not None else
                 f"cores {sorted(self.spec.cores)}" if self.spec.cores is not None else "unpinned")
        return f"sampler process of rank {self.spec.rank} (pid {self.process.pid}, {where}; last batch: {self.last})"

    def _receive(self, wanted: str) -> tuple:
        """The next message, which must be of kind ``wanted`` (results on the way are kept)."""
        start = time.perf_counter()
        deadline = start + self.placement.timeout_s
        try:
            while True:
                if not self.conn.poll(min(1.0, max(0.0, deadline - time.perf_counter()))):
                    if not self.process.is_alive():
                        raise SamplerFailed(f"the {self.describe()} exited with code {self.process.exitcode}")
                    if time.perf_counter() >= deadline:
                        raise SamplerFailed(f"the {self.describe()} answered nothing for "
                                            f"{self.placement.timeout_s:g} s (data.sampler_process.timeout_s)")
                    continue
                try:
                    message = self.conn.recv()
                except (EOFError, OSError) as err:
                    raise self._gone(err) from None
                deadline = time.perf_counter() + self.placement.timeout_s  # it answers: alive
                if message[0] == "error":
                    raise SamplerFailed(f"the {self.describe()} failed: {message[1]}")
                if message[0] == "result":
                    _, ticket, batch, self.idle = message
                    self.results[ticket] = batch
                    self.last = f"#{ticket}, weights version {batch.weights_version}"
                    if wanted == "result":
                        return message
                    continue
                if message[0] != wanted:
                    raise SamplerFailed(f"the {self.describe()} sent {message[0]!r} where {wanted!r} was due")
                return message
        finally:
            self.waited += time.perf_counter() - start

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except OSError as err:
            raise self._gone(err) from None

    def _gone(self, err: BaseException) -> SamplerFailed:
        """The error for a closed pipe: the process ended, or is ending."""
        self.process.join(1)
        if self.process.exitcode is not None:
            return SamplerFailed(f"the {self.describe()} exited with code {self.process.exitcode}")
        return SamplerFailed(f"the {self.describe()} closed its pipe ({err})")

    def submit(self, prompts: Sequence, prompt_ids: Sequence, index: int | None = None, round: int = 0,
               evaluation: bool = False) -> int:
        """Queue a batch to sample (after everything sent before it); its ticket."""
        ticket, self.tickets = self.tickets, self.tickets + 1
        self._send(("eval", ticket, tuple(prompts), tuple(prompt_ids)) if evaluation else
                   ("sample", ticket, tuple(prompts), tuple(prompt_ids), index, round))
        return ticket

    def result(self, ticket: int) -> RolloutBatch:
        """The batch of ``ticket``, waiting for it."""
        while ticket not in self.results:
            self._receive("result")
        return self.results.pop(ticket)

    def push(self, tensors: Iterator, version: int) -> float:
        """The weights ``tensors`` as ``version``, once the sampler has finished what was sent before; the seconds
        the transfer took (the wait before it counts in ``waited``). ``tensors`` is drained whatever fails (under
        FSDP2 each is a collective of the trainer ranks)."""
        try:
            self._send(("push", version))
            self._receive("ready")
            start = time.perf_counter()
            try:
                self.channel.send(tensors, self._send)
            except SamplerFailed:
                raise
            except RuntimeError as err:  # the collective's: a peer gone or past the timeout
                raise SamplerFailed(f"the weight push to the {self.describe()} failed: {err}") from None
            self._receive("pushed")
            return time.perf_counter() - start
        finally:
            for _ in tensors:
                pass

    def stop(self) -> None:
        """End the sampler process, and give this process back the cores it had before (``pin_trainer``); also at
        the interpreter's exit (after an error, the data module's teardown does not run)."""
        if self.unpinned is not None:
            os.sched_setaffinity(0, self.unpinned[0])
            torch.set_num_threads(self.unpinned[1])
            self.unpinned = None
        if self.process.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def pin_trainer(placement: SamplerPlacement) -> tuple[set[int], int] | None:
    """Keep this training process off every sampler's cores (and its thread count to the cores it keeps); what it
    had before, for :meth:`RemoteSampler.stop` to give back (``None``: nothing changed)."""
    if not placement.cpus:
        return None
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    keep = before[0] - placement.all_sampler_cores()
    os.sched_setaffinity(0, keep)
    torch.set_num_threads(len(keep))
    return before
