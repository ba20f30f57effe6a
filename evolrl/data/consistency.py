"""The base model's consistency on each training prompt: RESTRAIN's offline prompt weights, the run's first phase.

Before the first training step the engine holds the base model's weights; each rank samples
``PromptWeights.samples`` responses for its share of the training prompts, the reward's answer rules read them,
and a prompt's *majority share* is its largest equivalence class over all its responses. Rank 0 appends one JSON
line per prompt to ``<trainer.default_root_dir>/restrain_prompt_weights.jsonl`` after every chunk, flushed to disk,
so a pass killed part-way continues where its file ends; a finished file is read and not measured again. The shares
also go into every checkpoint, so a resumed run never needs the file (nor the base model's weights).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch.distributed as dist

from evolrl.rewards.answer_rules import AnswerRules
from evolrl.rewards.voting import class_counts, group_answers

FILE = "restrain_prompt_weights.jsonl"


def majority_share(texts: list[str], rules: AnswerRules) -> float:
    """The largest equivalence class of the valid answers in ``texts``, as a share of all of them."""
    answers = [(s.answer if (s := rules.read(t)) is not None else None) for t in texts]
    classes = group_answers([a if rules.valid(a) else None for a in answers])
    return max(class_counts(classes).values(), default=0) / len(texts)


def read_shares(path: Path, samples: int) -> dict[str, float]:
    """The shares a (possibly partial) weights file holds; a bad line is a ValueError naming the file and line."""
    shares: dict[str, float] = {}
    if not path.exists():
        return shares
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            share, n, key = float(row["share"]), int(row["samples"]), str(row["id"])
        except (ValueError, KeyError, TypeError) as err:
            if number == len(lines):  # the last line, cut short by a kill: measured again
                break
            raise ValueError(f"{path}:{number}: not a prompt-weight line ({err}); delete the file to measure the "
                             "weights again") from err
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise ValueError(f"{path}:{number}: share {share!r} is not a number in [0, 1]; delete the file to "
                             "measure the weights again")
        if n != samples:
            raise ValueError(f"{path}:{number}: measured with {n} samples per prompt, but PromptWeights.samples="
                             f"{samples}; delete the file to measure again, or set samples: {n}")
        shares[key] = share
    return shares


def measure_shares(data, samples: int, rules: AnswerRules, root: str | Path, rank: int = 0, world: int = 1,
                   ) -> dict[str, float]:
    """Every training prompt's majority share under the engine's current weights (module docstring); ``data``: the
    run's :class:`~evolrl.data.RolloutDataModule`, set up, its engine holding the base model's weights."""
    path = Path(root) / FILE
    done = read_shares(path, samples)
    if rank == 0 and path.exists():  # the good lines only: a line a kill cut short must not precede new ones
        _write(path.with_suffix(".partial"), done, samples, "w").replace(path)
    todo = [(p, ids) for p, ids in data.train_items if p.id not in done]
    chunk = data.rollouts.prompts_per_step
    rollouts = data.rollouts
    for call, start in enumerate(range(0, len(todo), chunk * world)):
        mine = todo[start + rank * chunk : start + (rank + 1) * chunk]
        groups = rollouts.engine.generate([p for p, _ in mine], [ids for _, ids in mine], sampling=rollouts.sampling,
                                          n=samples, seed=rollouts.seeds.prompt_weights(call, rank)) if mine else []
        found = [(g.prompt.id, majority_share(list(g.texts), rules)) for g in groups]
        if world > 1:
            gathered: list = [None] * world
            dist.all_gather_object(gathered, found)
            found = [row for part in gathered for row in part]
        done |= dict(found)
        if rank == 0:
            _write(path, dict(found), samples, "a")
    return done


def _write(path: Path, shares: dict[str, float], samples: int, mode: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as out:
        out.writelines(json.dumps({"id": k, "share": v, "samples": samples}) + "\n" for k, v in shares.items())
        out.flush()
        os.fsync(out.fileno())
    return path
