"""What a report reads and prints: a run's TensorBoard curves, a mean +- sd over seeds, a markdown table."""

from __future__ import annotations

import math
import statistics
from pathlib import Path


def read_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from every TensorBoard event file under ``run`` (a later file wins a step: a
    run that went on from a checkpoint writes its steps again)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, dict[int, float]] = {}
    files = sorted(Path(run).rglob("events.out.tfevents.*")) if Path(run).is_dir() else [Path(run)]
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files under {run}")
    for file in files:
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            series.setdefault(tag, {}).update({e.step: e.value for e in events.Scalars(tag)})
    return {tag: sorted(points.items()) for tag, points in series.items()}


def mean_sd(values: list[float], digits: int = 3) -> str:
    """``mean +- sd`` over the seeds; NaNs (a collapse step a run never reached) are counted, not averaged."""
    kept = [v for v in values if not math.isnan(v)]
    if len(kept) < len(values):
        return f"{len(kept)} of {len(values)}" + (f": {mean_sd(kept, digits)}" if kept else "")
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} +- {sd:.{digits}f}"


def table(head: list[str], rows: list) -> list[str]:
    """The lines of a markdown table (``|---|`` rules, as the docs' tables are pasted)."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(map(str, r)) + " |"
                                                                         for r in rows]
