"""``compare run`` and ``compare commands``: every (arm, seed) of the plan as a ``python -m evolrl fit`` run.

A run is ``fit --config <out>/plan/<arm>/seed<S>.yaml --ckpt_path last``: the plan's file alone, from the run's
newest checkpoint (``fit`` starts at step 0 when there is none). ``run`` goes seed by seed, so the arms of a seed run
one after the other; a finished run (``fit`` recorded its end in ``run_record.jsonl``) is skipped, an unfinished one
goes on. Each run's console goes to ``console.log`` in its directory (not a terminal: ``fit`` prints progress as
lines), and ``run``'s own lines to ``<out>/compare.log`` as well as standard output. A SIGTERM is passed on to the
run in progress, which saves its checkpoint and ends; ``run`` then exits 143, and the same command goes on. The
child leads its own session, so a signal sent to the job's whole group reaches it once, from here.

Several ``run`` commands may share one folder (jobs on several nodes of a shared file system): a run whose
checkpoint directory another live process holds (``fit``'s lock, ``RunLock``) is skipped with a line naming the
holder, and the command ends saying how many it left to others; run it again to pick up what they leave unfinished.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from evolrl.checkpoints import RunLock
from evolrl.checkpoints.record import finished
from evolrl.compare.plan import input_file, run_dir, run_keys
from evolrl.compare.spec import CompareError

STOPPED = 128 + signal.SIGTERM


def fit_args(out: Path, arm: str, seed: int) -> list[str]:
    """``fit``'s arguments for one run of the plan in ``out``."""
    return ["fit", "--config", str(input_file(out, arm, seed)), "--ckpt_path", "last"]


def commands(plan: dict, out: Path) -> list[str]:
    """One shell line per run, in ``run``'s order: a job array's task ``i`` runs line ``i`` (from any folder)."""
    return [shlex.join(["python", "-m", "evolrl", *fit_args(out, arm, seed)]) for arm, seed in run_keys(plan)]


class Log:
    """``run``'s progress lines: to standard output and appended to ``<out>/compare.log``, with the time."""

    def __init__(self, out: Path) -> None:
        self.path = out / "compare.log"

    def __call__(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}"
        print(line, flush=True)
        with open(self.path, "a") as log:
            log.write(line + "\n")


def run_all(plan: dict, out: Path) -> None:
    """Runs every unfinished run of ``plan`` in turn; a :class:`CompareError` on a failed one, exit 143 on SIGTERM."""
    log, child, stop, elsewhere = Log(out), None, [], []

    def on_sigterm(signum, frame) -> None:
        stop.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def left_to_another(arm: str, seed: int, directory: Path) -> bool:
        """Whether another live process holds the run's checkpoint directory: then one line, and the run is its."""
        holder = RunLock(directory / "checkpoints").holder()
        if holder:
            log(f"{arm} seed {seed}: skipped, in use by another run ({holder})")
            elsewhere.append(f"{arm} seed {seed}")
        return holder is not None

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        for arm, seed in run_keys(plan):
            directory = run_dir(out, arm, seed)
            if finished(directory):
                log(f"{arm} seed {seed}: finished already")
                continue
            if stop:
                break
            if left_to_another(arm, seed, directory):
                continue
            directory.mkdir(parents=True, exist_ok=True)
            log(f"{arm} seed {seed}: {'goes on' if (directory / 'run_record.jsonl').exists() else 'starts'} "
                f"(console: {directory / 'console.log'})")
            start = time.perf_counter()
            with open(directory / "console.log", "a") as console:
                child = subprocess.Popen([sys.executable, "-m", "evolrl", *fit_args(out, arm, seed)], stdout=console,
                                         stderr=subprocess.STDOUT, start_new_session=True)
                code = child.wait()
            minutes = (time.perf_counter() - start) / 60
            if stop or code == STOPPED:
                log(f"{arm} seed {seed}: stopped by SIGTERM after {minutes:.1f} min (exit {code}); the same command "
                    "goes on from its checkpoint")
                break
            if code and left_to_another(arm, seed, directory):  # taken between the check above and this start
                continue
            if code:
                raise CompareError(f"compare run: {arm} seed {seed} failed (exit {code}) after {minutes:.1f} min; its "
                                   f"console: {directory / 'console.log'}")
            log(f"{arm} seed {seed}: finished in {minutes:.1f} min")
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stop:
        sys.exit(STOPPED)
    if elsewhere:
        log(f"{len(elsewhere)} of {len(run_keys(plan))} runs left to the runs that hold them ({', '.join(elsewhere)}): "
            "the same command again, once they end, goes on with any they leave unfinished")
        return
    log(f"all {len(run_keys(plan))} runs finished: `python -m evolrl compare report` reads them")
