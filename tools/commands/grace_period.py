"""How long ``fit`` takes from a scheduler's signal to its exit, for choosing a grace period (docs/cluster.md).

    python -m tools.commands.grace_period                                  # the demo, SIGTERM during step 6
    python -m tools.commands.grace_period --after "step 8/" --out runs/grace-eval      # during the evaluation after 8
    python -m tools.commands.grace_period --config configs/my.yaml --after "step 3/" --resume

Starts ``python -m evolrl fit`` on the configs (``--config``, repeatable) with ``--trainer.default_root_dir OUT``
and its output to ``OUT/fit.log`` (not a terminal, as on a cluster: progress comes as lines), waits for the first line
that contains ``--after`` (the progress line of a step that has ended, so the signal lands in the next step or the
evaluation after it), sends the signal to that process alone (as Kubernetes does), and prints the seconds from the
signal to the exit, the exit code, the checkpoint and the run's own line about it. With ``--resume`` it then runs the
requeue, the same command with ``--ckpt_path last``, to its end. Nothing here is the run's business: it only times it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.common import ROOT, pass_on_sigterm

DEMO = str(ROOT / "configs" / "demo.yaml")


def fit_command(configs: list[str], out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "evolrl", "fit", *[a for c in configs for a in ("--config", c)],
            "--trainer.default_root_dir", str(out), *extra]


def wait_for(log: Path, text: str, process: subprocess.Popen, timeout: float) -> None:
    """Until ``log`` has a line containing ``text``; an error if the process ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in log.read_text(errors="replace").splitlines()):
        if process.poll() is not None:
            raise SystemExit(f"fit ended (exit {process.returncode}) before printing {text!r}: see {log}")
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"no line with {text!r} within {timeout:.0f} s: see {log}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", help="a config of the run (repeatable); default: the demo")
    parser.add_argument("--after", default="step 5/", help="signal once a line of the run's output contains this")
    parser.add_argument("--signal", default="TERM", choices=["TERM", "USR1"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "grace-period", help="the run's root directory")
    parser.add_argument("--resume", action="store_true", help="then run the requeue (--ckpt_path last) to its end")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for each stage")
    parser.add_argument("extra", nargs="*", help="more arguments for fit, after --")
    a = parser.parse_args()
    configs = a.config or [DEMO]
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "fit.log"
    with open(log, "w") as out:
        process = subprocess.Popen(fit_command(configs, a.out, a.extra), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_for(log, a.after, process, a.timeout)
        sent = time.monotonic()
        process.send_signal(getattr(signal, f"SIG{a.signal}"))
        code = process.wait(timeout=a.timeout)
        took = time.monotonic() - sent
    said = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("evolrl: SIG")]
    print(f"SIG{a.signal} after {a.after!r}: exit code {code} after {took:.1f} s")
    print(said[-1] if said else f"(the run printed no preemption line: see {log})")
    if a.resume:
        start = time.monotonic()
        with open(a.out / "requeue.log", "w") as out:
            code = subprocess.run(fit_command(configs, a.out, [*a.extra, "--ckpt_path", "last"]), stdout=out,
                                  stderr=subprocess.STDOUT, cwd=ROOT, timeout=a.timeout).returncode
        print(f"requeue (--ckpt_path last): exit code {code} after {time.monotonic() - start:.1f} s; "
              f"log: {a.out / 'requeue.log'}")


if __name__ == "__main__":
    pass_on_sigterm()
    main()
