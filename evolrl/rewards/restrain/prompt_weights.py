"""The base model's consistency on each training prompt: RESTRAIN's offline prompt weights, the run's first phase.

Before the first training step the engine holds the base model's weights; each rank samples
``PromptWeights.samples`` responses for its share of the training prompts, the reward's answer rules read them,
and a prompt's *majority share* is its largest equivalence class over all its responses.

* **Keyed to what measures it.** The file is ``<trainer.default_root_dir>/restrain_prompt_weights-<key>.jsonl``: its
  first line holds what the shares depend on (:func:`measured_with`: the model, the training prompts as tokens, the
  sampling, the samples per prompt, the answer rules, the seed) and ``<key>`` is a hash of it. A run with another
  model or other settings in the same directory finds no file of its own and measures; no file is ever read for
  settings other than its own.
* **Resumable, and the same when resumed.** The prompts are cut into fixed calls over the whole list (P prompts a
  rank, in the source's order) and call ``c`` is seeded by ``c`` alone, so a pass that a kill or a signal cut short
  samples its remaining calls exactly as the uninterrupted pass would (where the engine's sampling is seeded per
  call: ``HFEngine``; vLLM on a GPU). Rank 0 appends a call's lines at once, flushed to disk.
* **Stoppable.** After each call the pass asks ``stop_point`` (the preemption handler: on SIGTERM the run exits
  143 there, its file holding every finished call) and prints a progress line every ``PROGRESS_SECONDS``.

The shares also go into every checkpoint, so a resumed run never needs the file (nor the base model's weights).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch.distributed as dist

from evolrl.rewards.answer_rules import AnswerRules
from evolrl.rewards.voting import class_counts, group_answers

NAME = "restrain_prompt_weights"
"""The file's name before its key."""
PROGRESS_SECONDS = 10.0
"""The least time between two progress lines (the first call's and the last one's are always printed)."""


def majority_share(texts: list[str], rules: AnswerRules) -> float:
    """The largest equivalence class of the valid answers in ``texts``, as a share of all of them."""
    answers = [(s.answer if (s := rules.read(t)) is not None else None) for t in texts]
    classes = group_answers([a if rules.valid(a) else None for a in answers])
    return max(class_counts(classes).values(), default=0) / len(texts)


def measured_with(data, samples: int, rules: AnswerRules) -> dict[str, Any]:
    """What the shares of ``data``'s training prompts depend on, as plain JSON values (``data`` set up)."""
    key = {"model": data.model, "prompts": data.prompts_hash(), "samples": samples,
           "sampling": asdict(data.rollouts.sampling), "answers": asdict(rules), "seed": data.seeds.seed}
    return json.loads(json.dumps(key))  # tuples as lists, as read back


def weights_path(root: str | Path, key: dict[str, Any]) -> Path:
    """Where the shares measured under ``key`` are kept in the run directory ``root``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(root) / f"{NAME}-{digest}.jsonl"


def read_shares(path: Path, key: dict[str, Any]) -> dict[str, float]:
    """The shares a (possibly partial) weights file holds; a bad line, or a file measured under another ``key``, is
    a ValueError naming the file and line."""
    shares: dict[str, float] = {}
    if not path.exists():
        return shares
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            saved = row["measured_with"] if number == 1 else None
            share, prompt = (0.0, "") if number == 1 else (float(row["share"]), str(row["id"]))
        except (ValueError, KeyError, TypeError) as err:
            if number == len(lines) > 1:  # the last line, cut short by a kill: measured again
                break
            raise ValueError(f"{path}:{number}: not a prompt-weight line ({err!r}); delete the file to measure the "
                             "weights again") from err
        if number == 1:
            changed = sorted(k for k in saved.keys() | key.keys() if saved.get(k) != key.get(k))
            if changed:
                raise ValueError(f"{path}: measured with another {', '.join(changed)} than this run's; move it away "
                                 "to measure the weights again")
            continue
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise ValueError(f"{path}:{number}: share {share!r} is not a number in [0, 1]; delete the file to "
                             "measure the weights again")
        shares[prompt] = share
    return shares


def measure_shares(data, samples: int, rules: AnswerRules, root: str | Path, rank: int = 0, world: int = 1,
                   stop_point: Callable[[str], None] | None = None, say: Callable[[str], None] = print,
                   ) -> dict[str, float]:
    """Every training prompt's majority share under the engine's current weights (module docstring); ``data``: the
    run's :class:`~evolrl.data.RolloutDataModule`, set up, its engine holding the base model's weights.
    ``stop_point(what)``: called on every rank after each call, it may end the run; ``say``: rank 0's lines."""
    key = measured_with(data, samples, rules)
    path = weights_path(root, key)
    done = read_shares(path, key)
    items, chunk, rollouts = data.train_items, data.rollouts.prompts_per_step, data.rollouts
    calls = [(c, items[s : s + chunk * world]) for c, s in enumerate(range(0, len(items), chunk * world))]
    todo = [(c, call) for c, call in calls if any(p.id not in done for p, _ in call)]
    if rank == 0:
        if not todo:
            say(f"evolrl: RESTRAIN prompt weights of {len(items)} prompts read from {path}")
            return done
        # the good lines only: a line a kill cut short must not precede new ones
        _write(path.with_name(path.name + ".partial"), done, "w", key).replace(path)
        say(f"evolrl: RESTRAIN prompt weights: the base model samples {samples} responses for each of "
            f"{len(items) - len(done)} of {len(items)} training prompts, into {path}")
    start = last_line = time.monotonic()
    for n, (call, group) in enumerate(todo, 1):
        mine = group[rank * chunk : (rank + 1) * chunk]
        groups = rollouts.engine.generate([p for p, _ in mine], [ids for _, ids in mine], sampling=rollouts.sampling,
                                          n=samples, seed=rollouts.seeds.prompt_weights(call, rank)) if mine else []
        found = [(g.prompt.id, majority_share(list(g.texts), rules)) for g in groups]
        if world > 1:
            gathered: list = [None] * world
            dist.all_gather_object(gathered, found)
            found = [row for part in gathered for row in part]
        new = {k: v for k, v in found if k not in done}
        done |= new
        now = time.monotonic()
        if rank == 0:
            _write(path, new, "a")
            if n in (1, len(todo)) or now - last_line >= PROGRESS_SECONDS:
                say(f"evolrl: RESTRAIN prompt weights: {len(done)} of {len(items)} prompts measured "
                    f"({now - start:.0f} s)")
                last_line = now
        if stop_point is not None and n < len(todo):
            stop_point(f"RESTRAIN's prompt-weight pass ({len(done)} of {len(items)} prompts measured, kept in "
                       f"{path})")
    return done


def _write(path: Path, shares: dict[str, float], mode: str, key: dict[str, Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as out:
        if key is not None:
            out.write(json.dumps({"measured_with": key}) + "\n")
        out.writelines(json.dumps({"id": k, "share": v}) + "\n" for k, v in shares.items())
        out.flush()
        os.fsync(out.fileno())
    return path
