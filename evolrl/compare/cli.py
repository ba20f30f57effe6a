"""``python -m evolrl compare plan|run|commands|report``: methods compared over seeds on held-out problems.

Each subcommand takes the same spec, from a file (``--config compare.yaml``), flags, or both (``spec.Spec``):

    python -m evolrl compare plan --config compare.yaml      # every run resolved, with the rule, before any run
    python -m evolrl compare run --config compare.yaml       # each (arm, seed) in turn; resumable; SIGTERM: exit 143
    python -m evolrl compare commands --config compare.yaml  # one `python -m evolrl fit ...` line per run
    python -m evolrl compare report --config compare.yaml    # the table, paired interval, outcome and figure

``run``, ``commands`` and ``report`` use the plan in the spec's ``out`` folder and refuse a spec that differs from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from argparse import RawDescriptionHelpFormatter

from jsonargparse import ActionConfigFile, ArgumentParser, DefaultHelpFormatter

from evolrl.compare.spec import CompareError, Rule, Spec

SUBCOMMANDS = {
    "plan": "resolve every run's configuration and write the plan (refused, naming each change, once a run started)",
    "run": "run every (arm, seed) of the plan in turn, each from its newest checkpoint",
    "commands": "print one `python -m evolrl fit` line per run of the plan (a cluster job array's tasks)",
    "report": "the finished runs: tables, the paired interval, the rule's outcome and the figure",
}


class _Help(DefaultHelpFormatter, RawDescriptionHelpFormatter):
    """jsonargparse's help, with the description's lines kept as written (the commands above)."""


def parser() -> ArgumentParser:
    top = ArgumentParser(prog="python -m evolrl compare", description=__doc__, formatter_class=_Help)
    subcommands = top.add_subcommands(dest="subcommand")
    for name, help_ in SUBCOMMANDS.items():
        sub = ArgumentParser(description=help_)
        sub.add_argument("--config", action=ActionConfigFile, help="the spec: a YAML or JSON file of these fields")
        sub.add_class_arguments(Spec, fail_untyped=True, sub_configs=True)
        subcommands.add_subcommand(name, sub, help=help_)
    return top


def spec_of(config) -> Spec:
    fields = config.clone().as_dict()
    fields.pop("config", None)
    rule = fields.pop("rule", None) or {}
    return Spec(**fields, rule=rule if isinstance(rule, Rule) else Rule(**rule))


def main(argv: list[str] | None = None) -> None:
    from evolrl.compare.plan import current_plan, write_plan
    from evolrl.compare.runner import commands, run_all

    config = parser().parse_args(sys.argv[1:] if argv is None else argv)
    name = config.subcommand
    spec = spec_of(config[name])
    out = Path(spec.out).resolve()
    try:
        spec.check()
        if name == "plan":
            plan, changed = write_plan(spec)
            runs = len(plan["runs"])
            print(f"plan: {out / 'plan.json'} ({len(plan['arms'])} arms x {len(plan['seeds'])} seeds = {runs} runs, "
                  f"commit {plan['commit']})" + "".join(f"\n  changed: {c}" for c in changed))
        elif name == "run":
            run_all(current_plan(spec), out)
        elif name == "commands":
            print("\n".join(commands(current_plan(spec), out)))
        else:
            from evolrl.compare.report import report

            text, _ = report(current_plan(spec), out)
            print(text, end="")
    except CompareError as err:
        sys.exit(str(err))
