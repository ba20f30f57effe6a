"""What a run ran on, kept beside its curves: ``run_record.jsonl`` in the logger's directory, one line per start and
one when ``fit`` ends normally (``RunRecord``, a callback ``python -m evolrl fit`` adds).

A comparison of methods must be able to say that the arms of a seed ran the same code on the same kind of processor
(Study IV's seed 1 did not), and whether a run finished, whoever started it (``evolrl compare run`` or a cluster job
running the lines ``evolrl compare commands`` prints). So ``fit`` itself writes the record, not the tool around it:
each start's commit, processor, host and checkpoint, and at the end the step reached. A run without a logger has no
directory of its own to write into and records nothing.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import lightning as L

from evolrl.provenance import commit, processor

RECORD = "run_record.jsonl"
"""The record's file name in the logger's directory."""


def record(directory: str | Path | None, **fields) -> None:
    """Appends one line (``fields``, with the time) to the run's record in ``directory``; nothing without one."""
    if not directory:
        return
    path = Path(directory) / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.write(json.dumps({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **fields}) + "\n")


class RunRecord(L.Callback):
    """Each start of ``fit`` (its commit, processor, host and the checkpoint it went on from) and its normal end (the
    step reached) in ``run_record.jsonl`` in the first logger's directory; rank zero writes. A run stopped by a signal
    or an error never reaches ``on_fit_end``, so its last line stays a start."""

    def __init__(self) -> None:
        self.directory: str | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        # The logger's own directory: ``trainer.log_dir`` would broadcast, and only rank zero asks.
        first = trainer.loggers[0] if trainer.loggers and trainer.is_global_zero else None
        self.directory = getattr(first, "log_dir", None)
        checkpoint = None if trainer.ckpt_path is None else str(trainer.ckpt_path)
        record(self.directory, **{"event": "start", "commit": commit(), "processor": processor(),
                                  "host": socket.gethostname(), "from": checkpoint})

    def on_fit_end(self, trainer, pl_module) -> None:
        record(self.directory, event="end", step=trainer.global_step)


def read_record(directory: Path) -> list[dict]:
    """The lines of the run's record in ``directory``; none where it has none."""
    path = Path(directory) / RECORD
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def finished(directory: Path) -> bool:
    """Whether the run in ``directory`` ended normally after its last start."""
    lines = read_record(directory)
    return bool(lines) and lines[-1]["event"] == "end"
