"""The figure of a comparison's curves against the training step: held-out pass@1 (and pass@K), response length,
entropy, and where a run logged them the trailing text and novelty; one line per arm, the mean of its seeds with a
band from their minimum to their maximum (or every seed's own line).

matplotlib is imported when a figure is drawn (``pip install evolrl[plot]``): the rest of a report needs none.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from evolrl.compare.curves import read_scalars

PANELS = (
    ("val/{eval_set}/pass@1", "pass@1 on {eval_set}", "pass@1"),
    ("val/{eval_set}/pass@{k}", "pass@{k} on {eval_set}", "pass@{k}"),
    ("train/response_length", "response length", "tokens"),
    ("train/entropy", "policy entropy", "nats / token"),
    ("train/trailing_fraction", "text after the first statement of the answer", "share of responses"),
    ("train/novelty_mean", "novelty (u, before the in-group scaling)", "mean over valid responses"),
)
"""(tag, title, unit); the pass@k panel only with ``pass_k``, a training curve only where a run logged it."""


def seed_band(points: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """``(steps, mean, min, max)`` over the runs, at the steps every run logged."""
    common = sorted(set.intersection(*(set(dict(p)) for p in points)))
    values = [[dict(p)[s] for p in points] for s in common]
    return common, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot(run_dirs: list[Path], labels: list[str], out: Path, eval_set: str | None = None,
         pass_k: int | None = None, every_seed: bool = False) -> Path:
    """The figure of ``PANELS``: per method (``labels``), the mean of its runs with their min-max band, or with
    ``every_seed`` each run as its own line in the method's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_scalars(d) for d in run_dirs]
    eval_set = eval_set or min((tag.split("/")[1] for run in runs for tag in run  # default: the first logged
                                if fnmatch.fnmatch(tag, "val/*/pass@1")), default=None)
    methods: dict[str, list[dict]] = {}
    for run, label in zip(runs, labels):
        methods.setdefault(label, []).append(run)
    panels = [p for p in PANELS if (pass_k is not None or "{k}" not in p[0])
              and (not p[0].startswith("train/") or any(p[0] in run for run in runs))]
    fig, (axes,) = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.6), constrained_layout=True, squeeze=False)
    for ax, (tag, title, unit) in zip(axes, panels):
        tag = tag.format(eval_set=eval_set, k=pass_k)
        ax.set_title(title.format(eval_set=eval_set or "(no evaluation set logged)", k=pass_k))
        ax.set_xlabel("training step")
        ax.set_ylabel(unit.format(k=pass_k))
        ax.grid(alpha=0.3)
        for i, (label, seeds) in enumerate(methods.items()):
            logged = [run[tag] for run in seeds if tag in run]
            if every_seed:
                for n, points in enumerate(logged):
                    steps, values = zip(*points)
                    ax.plot(steps, values, color=f"C{i}", linewidth=1, marker="o", markersize=2, alpha=0.8,
                            label=f"{label} ({len(logged)} seeds, one line each)" if n == 0 else None)
            elif len(logged) == 1:
                steps, values = zip(*logged[0])
                ax.plot(steps, values, marker="o", markersize=3, label=label)
            elif logged:
                steps, mean, low, high = seed_band(logged)
                line, = ax.plot(steps, mean, marker="o", markersize=3,
                                label=f"{label} (mean of {len(logged)} seeds, band: min-max)")
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
        if not ax.lines:
            ax.text(0.5, 0.5, f"no '{tag}' in these runs", ha="center", va="center", transform=ax.transAxes)
    drawn = max(axes, key=lambda ax: len(ax.lines))  # one legend for the figure, below the panels
    fig.legend(*drawn.get_legend_handles_labels(), loc="outside lower center", ncol=min(len(methods), 4))
    fig.suptitle("Training dynamics")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
