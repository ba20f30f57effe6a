"""Draw the paper's training-dynamics figure from TensorBoard logs of one or more runs.

Panels against the training step: pass@1 on an evaluation set (``val/<set>/pass@1``), with ``--pass-k K`` also
pass@K, mean response length (tokens) and policy entropy (nats per token); one line per label, so TTRL and EVOL-RL
can be overlaid. Runs that share a label are seeds of one method: their mean is drawn, with a band from their
minimum to their maximum at each step (the legend says how many seeds).

    python -m tools.commands.plot_dynamics runs/demo/version_0 runs/demo_ttrl/version_0 \\
        --labels EVOL-RL TTRL --out dynamics.png
    python -m tools.commands.plot_dynamics runs/study/evol/seed* runs/study/ttrl/seed* \\
        --labels EVOL-RL EVOL-RL EVOL-RL TTRL TTRL TTRL --pass-k 16 --out study.png

``--table TAG ...`` prints, instead of a figure, a markdown table of those curves per run: every value of a curve of
at most five points (held-out evaluations), else its first and last value, mean and median over the steps
(``train/entropy``, ``time/step``, a step's ``train/dynamic_sampling/kept_groups``).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from evolrl.compare.curves import read_scalars
from evolrl.compare.curves import table as markdown_table
from evolrl.compare.figure import plot

def table(run_dirs: list[Path], labels: list[str], tags: list[str]) -> str:
    """A markdown table, one row per run, one column per tag (see the module docstring)."""
    def cell(points: list[tuple[int, float]] | None) -> str:
        if not points:
            return "-"
        values = [v for _, v in points]
        if len(values) <= 5:
            return ", ".join(f"{v:.3g}" for v in values)
        return (f"{values[0]:.3g} -> {values[-1]:.3g}; mean {statistics.fmean(values):.3g}, "
                f"median {statistics.median(values):.3g} ({len(values)} steps)")

    scalars = [read_scalars(run) for run in run_dirs]
    rows = [[label, *(cell(s.get(tag)) for tag in tags)] for s, label in zip(scalars, labels)]
    return "\n".join(markdown_table(["run", *tags], rows))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.commands.plot_dynamics",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (or event files)")
    parser.add_argument("--labels", nargs="+", help="legend label per run (default: the directory names)")
    parser.add_argument("--eval-set", help="evaluation set for the pass@1 panel (default: the first logged)")
    parser.add_argument("--pass-k", type=int, help="also a pass@K panel (val/<set>/pass@K)")
    parser.add_argument("--out", type=Path, default=Path("dynamics.png"))
    parser.add_argument("--table", nargs="+", metavar="TAG", help="print these curves per run instead of a figure")
    args = parser.parse_args()
    labels = args.labels or [str(r) for r in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"{len(args.runs)} runs but {len(labels)} labels")
    if args.table:
        print(table(args.runs, labels, args.table))
        return
    print(plot(args.runs, labels, out=args.out, eval_set=args.eval_set, pass_k=args.pass_k))


if __name__ == "__main__":
    main()
