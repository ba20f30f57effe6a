"""Rollout batches as plain values (dicts, tuples, numbers, strings, one tensor), as a checkpoint holds them: it
loads with ``torch.load(weights_only=True)``, which rebuilds no classes of ours."""

from __future__ import annotations

from dataclasses import asdict, fields

from evolrl.types import Prompt, ResponseGroup, RolloutBatch


def batch_to_plain(batch: RolloutBatch) -> dict:
    return {f.name: getattr(batch, f.name) for f in fields(batch) if f.name != "groups"} | {
        "groups": [asdict(g) for g in batch.groups]}


def batch_from_plain(state: dict) -> RolloutBatch:
    groups = tuple(ResponseGroup(**(g | {"prompt": Prompt(**g["prompt"])})) for g in state["groups"])
    return RolloutBatch(**(state | {"groups": groups}))
