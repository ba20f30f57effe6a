"""Every random stream of a run, derived from one seed in one place.

A stream is a function of the run's seed and of what it is for: the weights version (so a resumed
run draws the same numbers as the uninterrupted one), the rank (so ranks draw different samples)
and the epoch. Nothing else in evolrl derives a seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from evolrl.settings import check_int


@dataclass(frozen=True)
class Seeds:
    """The seeds of a run with base seed ``seed``."""

    seed: int = 0

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0)

    def engine(self, rank: int) -> int:
        """The rollout engine's own seed on ``rank`` (vLLM's CPU backend samples from this stream alone)."""
        return self.seed + rank

    def sampling(self, version: int, rank: int, evaluation: bool = False) -> int:
        """The seed of one ``generate`` call with weights ``version`` on ``rank``; evaluation has its own stream."""
        return self.seed + int(evaluation) + 7919 * (version + 1) + 1_000_003 * rank

    @staticmethod
    def requests(call: int, count: int) -> list[int]:
        """One seed per prompt of a ``generate`` call seeded ``call`` (:meth:`sampling`): 62-bit hashes of
        ``(call, prompt)``.

        vLLM seeds a prompt's n samples with ``seed, seed + 1, ..., seed + n - 1``, and its GPU sampler (Model
        Runner V2) draws each token's noise from a hash of (seed, position): with one seed for the whole call, the
        i-th samples of two prompts of equal length would draw the same noise. Hashed seeds keep prompts, calls,
        evaluation and ranks apart (spaced ~2^62 at random, where n is at most a few hundred), and stay below
        2^63 - n, inside vLLM's int64.
        """
        return [_hashed(f"{call}:{i}") for i in range(count)]

    def trained_subset(self, version: int) -> int:
        """The draw of the G trained responses out of the V sampled ones, at weights ``version``."""
        return self.seed * 1_000_003 + version

    def further_round(self, version: int, rank: int, round: int) -> tuple[int, int]:
        """A training step's further sampling ``round`` (dynamic sampling; ``round >= 1``): the seed of its
        ``generate`` call and of its trained subset, hashed apart from every other stream's."""
        return _hashed(f"sampling:{self.seed}:{version}:{rank}:{round}"), _hashed(f"trained:{self.seed}:{version}:{round}")

    def prompt_weights(self, call: int, rank: int) -> int:
        """The ``call``-th ``generate`` call of the base model's consistency pass on ``rank`` (RESTRAIN)."""
        return _hashed(f"prompt_weights:{self.seed}:{call}:{rank}")

    def teacher(self, key: int, rank: int, round: int = 0) -> int:
        """The EMA teacher's samples for the batch whose own seeds follow ``key`` (its version or index), on
        ``rank``, in dynamic sampling's ``round``."""
        return _hashed(f"teacher:{self.seed}:{key}:{rank}:{round}")

    def shuffle(self, epoch: int) -> int:
        """The order of the training prompts in ``epoch``."""
        return self.seed + epoch


def _hashed(key: str) -> int:
    """A 62-bit hash of ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 2
