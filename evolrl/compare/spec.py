"""What a comparison is: base configs, named arms, seeds, an output folder, the held-out set and the decision rule.

Given as a YAML or JSON file (``--config compare.yaml``) and/or flags (``--seeds [0,1]``, ``--rule.threshold 0.05``),
parsed by jsonargparse as the rest of the CLI. An arm is a list applied in order after the base configs: a path is
an overlay config, an item starting with ``--`` a ``--key=value`` setting of ``fit``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path


class CompareError(Exception):
    """A comparison that cannot go on: the message names the file, field or run and what to do."""


METRIC = re.compile(r"(pass|maj)@([1-9]\d*)")


@dataclass
class Rule:
    """The decision rule, fixed in the plan before any run: each other arm against the baseline, paired per problem.

    Args:
        metric: Per held-out problem at the last evaluation, from its responses: ``pass@K`` or ``maj@K``.
        baseline: The arm the others are compared with; ``None``: the first arm.
        direction: ``greater``: an arm must score above the baseline; ``less``: below it.
        threshold: The least mean difference, in the direction, that counts (in the metric's units).
        confidence: The bootstrap interval's two-sided level; the side toward the baseline must exclude 0.
        resamples: Bootstrap replicates (each draws seeds, then problems, with replacement).
    """

    metric: str = "pass@16"
    baseline: str | None = None
    direction: str = "greater"
    threshold: float = 0.0
    confidence: float = 0.9
    resamples: int = 10_000


@dataclass
class Spec:
    """A comparison: base configs, named arms, seeds, the output folder, the held-out set and the rule.

    Args:
        configs: Base configs of every run, in order (``fit --config`` each).
        arms: Arm name -> overlay configs and ``--key=value`` settings, applied in order after the base configs.
        seeds: Each arm runs once per seed (``seed_everything`` and ``data.seed``).
        out: The output folder: the plan, each run's directory, the report and its figure.
        eval_set: The held-out set: the name of an evaluation set the runs log (``val/<eval_set>/...``).
        rule: The decision rule.
        checkpoint_every: A checkpoint every this many training steps (a run resumes from it); ``None``: only at the
            end and on SIGTERM.
    """

    configs: list[str] = field(default_factory=list)
    arms: dict[str, list[str]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    out: str = "runs/compare"
    eval_set: str = "heldout"
    rule: Rule = field(default_factory=Rule)
    checkpoint_every: int | None = None

    def check(self) -> None:
        """Every field against the others; a :class:`CompareError` naming the field and its value."""
        def bad(name: str, value, allowed: str) -> None:
            raise CompareError(f"compare: {name}={value!r}: {allowed}")

        if not self.configs:
            bad("configs", self.configs, "at least one base config (a YAML file fit reads)")
        if len(self.arms) < 2:
            bad("arms", self.arms, "at least two named arms (name: [overlay.yaml, --key=value, ...])")
        for name, items in self.arms.items():
            if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name):
                bad("arms", name, "an arm's name is letters, digits, '_', '-' or '.' (it names a folder)")
            for item in items:
                if not isinstance(item, str) or not item:
                    bad(f"arms.{name}", item, "a path of an overlay config or a --key=value setting")
                if not item.startswith("--") and not Path(item).is_file():
                    bad(f"arms.{name}", item, f"no such file (from {Path.cwd()}); a setting starts with --")
        for path in self.configs:
            if not Path(path).is_file():
                bad("configs", path, f"no such file (from {Path.cwd()})")
        if not self.seeds or len(set(self.seeds)) < len(self.seeds):
            bad("seeds", self.seeds, "one or more seeds, each once")
        if not METRIC.fullmatch(self.rule.metric):
            bad("rule.metric", self.rule.metric, "pass@K or maj@K")
        if self.rule.baseline is not None and self.rule.baseline not in self.arms:
            bad("rule.baseline", self.rule.baseline, f"one of the arms ({', '.join(self.arms)})")
        if self.rule.direction not in ("greater", "less"):
            bad("rule.direction", self.rule.direction, "greater or less")
        if not 0 < self.rule.confidence < 1:
            bad("rule.confidence", self.rule.confidence, "between 0 and 1 (0.9: a 90% interval)")
        if self.rule.threshold < 0:
            bad("rule.threshold", self.rule.threshold, "0 or more (the direction gives the sign)")
        if self.rule.resamples < 100:
            bad("rule.resamples", self.rule.resamples, "at least 100")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            bad("checkpoint_every", self.checkpoint_every, "a number of steps, 1 or more, or null")

    @property
    def baseline(self) -> str:
        return self.rule.baseline or next(iter(self.arms))

    def as_dict(self) -> dict:
        return asdict(self)


def arm_args(configs: list[str], items: list[str]) -> list[str]:
    """``fit``'s arguments for the base configs and an arm's items, in order."""
    args = [a for c in configs for a in ("--config", c)]
    for item in items:
        args += [item] if item.startswith("--") else ["--config", item]
    return args
