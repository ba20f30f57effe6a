"""Paired differences per held-out problem, and their interval from a bootstrap over seeds and problems together.

Each run writes its held-out responses at every evaluation (``EvalResponses``: ``val_responses_step<N>.jsonl``);
the rule's metric is scored per problem from the last of them (``pass@K``: the unbiased estimate from the problem's
``n`` samples, ``c`` of them right; ``maj@K``: the expected vote of ``K`` of them). An arm's difference from the
baseline is taken seed by seed (the arms of a seed share the prompts' order) and problem by problem, giving a
seeds x problems matrix.

The interval resamples both sources of spread: each replicate draws the seeds with replacement, then the problems
with replacement, and averages the matrix over that grid. Resampling problems alone, after averaging the seeds,
treats the seeds' disagreement as if it were not there (Study IV's first interval: (-0.156, -0.045), where seeds and
problems together give (-0.271, +0.063)). Seeds and problems are crossed (every seed sees every problem), so one
draw of problems serves every drawn seed. With one seed, only problems are resampled.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from evolrl.compare.spec import METRIC
from evolrl.metrics.majk import maj_at_k
from evolrl.metrics.passk import pass_at_k


def read_rows(path: Path) -> list[dict]:
    """The problems of one ``EvalResponses`` file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def last_responses(run: Path) -> Path | None:
    """The run's held-out responses at its last evaluation; ``None`` where it wrote none."""
    files = list(Path(run).rglob("val_responses_step*.jsonl"))
    return max(files, key=evaluated_step, default=None)


def evaluated_step(responses: Path | None) -> int | None:
    """The training step of an ``EvalResponses`` file (``val_responses_step<N>.jsonl``); ``None`` for none."""
    return None if responses is None else int(Path(responses).stem.rpartition("step")[2])


def per_problem(rows: list[dict], metric: str, eval_set: str | None = None) -> dict[str, float]:
    """``{problem id: metric}`` over the rows of ``eval_set`` (every row when ``None``)."""
    kind, k = METRIC.fullmatch(metric).groups()
    k, scores = int(k), {}
    for row in rows:
        if eval_set is not None and row.get("dataset", eval_set) != eval_set:
            continue
        correct = [bool(r["correct"]) for r in row["responses"]]
        if len(correct) < k:
            raise ValueError(f"{metric}: problem {row['id']} has {len(correct)} responses, fewer than {k}")
        scores[str(row["id"])] = (pass_at_k(len(correct), sum(correct), k) if kind == "pass"
                                  else maj_at_k([r["answer"] for r in row["responses"]], correct, k))
    return scores


def differences(arm: list[dict[str, float]], baseline: list[dict[str, float]]) -> tuple[np.ndarray, list[str]]:
    """The seeds x problems matrix of ``arm - baseline`` (one dict per seed, the same seeds in the same order) over
    the problems every run scored, and those problems."""
    problems = sorted(set.intersection(*(set(d) for d in arm + baseline)))
    return np.array([[a[p] - b[p] for p in problems] for a, b in zip(arm, baseline)], dtype=float), problems


def bootstrap(matrix: np.ndarray, resamples: int, confidence: float, seed: int = 0) -> tuple[float, float, float]:
    """``(mean, low, high)``: the matrix's mean and the two-sided ``confidence`` interval of the mean over replicates
    that draw seeds, then problems, with replacement (module docstring)."""
    seeds, problems = matrix.shape
    rng = np.random.default_rng(seed)
    # Counts of each seed and problem in a replicate: the grid mean is w_s . M . w_p / (seeds * problems).
    w_seed = rng.multinomial(seeds, [1 / seeds] * seeds, size=resamples) if seeds > 1 else np.ones((resamples, 1))
    w_problem = rng.multinomial(problems, [1 / problems] * problems, size=resamples)
    means = np.einsum("rs,sp,rp->r", w_seed, matrix, w_problem) / (seeds * problems)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(matrix.mean()), float(low), float(high)


def outcome(gap: float, low: float, high: float, direction: str, threshold: float) -> bool:
    """Whether the rule holds: the mean difference at least ``threshold`` in ``direction`` and the interval on that
    side of 0 (not touching it)."""
    if direction == "greater":
        return gap >= threshold and low > 0
    return -gap >= threshold and high < 0
