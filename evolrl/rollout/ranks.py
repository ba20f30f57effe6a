"""A failure on one rank stops every rank, promptly.

Each rank runs its own engine. If one rank's engine raises (in sampling or a weight push), that rank
stops, but the others go on to the next collective (FSDP's all-gather, the next weight push) and wait
there for it until the process group's timeout, 30 minutes by default. :func:`fail_together` runs the
local call and then one small all-reduce in which every rank says whether its call raised, so every rank
learns of a failure right after the call and raises, naming the rank(s) that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class RankFailed(RuntimeError):
    """A call that every rank makes together raised on at least one of them."""


def several_ranks() -> bool:
    """Whether this process trains with others (a default process group of more than one rank)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def failed_ranks(failed: bool) -> list[int]:
    """The ranks whose ``failed`` is true (a collective: every rank of the default group must call it)."""
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int32, device=device)
    flags[dist.get_rank()] = int(failed)
    dist.all_reduce(flags)
    return flags.nonzero().flatten().tolist()


def fail_together(what: str, call: Callable[[], T]) -> T:
    """``call()``; on several ranks, raise :class:`RankFailed` on every rank if it raised on any.

    The failing rank's own error is chained (``from``), so its traceback still shows what went wrong there.
    ``call`` must leave every collective it started finished on the failing rank too (see
    ``vllm_weights.stream_weights``), or the others would wait inside it instead of reaching the agreement.
    """
    if not several_ranks():
        return call()
    error: Exception | None = None
    try:
        result = call()
    except Exception as err:  # noqa: BLE001 - any error: reported below, on every rank
        error = err
    failed = failed_ranks(error is not None)
    if failed:
        mine = f": {type(error).__name__}: {error}" if error is not None else "; this rank stops too"
        raise RankFailed(f"{what} failed on rank {', '.join(map(str, failed))} "
                         f"(this is rank {dist.get_rank()}){mine}") from error
    return result
