"""Preemption: SIGTERM or SIGUSR1 ends a run with a checkpoint that ``--ckpt_path last`` finds, and a non-zero exit.

Clusters stop jobs with SIGTERM (SLURM's preemption and time limit, Kubernetes, spot instances), then SIGKILL after a
grace period; SLURM's ``--signal=USR1@<seconds>`` warns ahead of the limit. Lightning's own handling finishes the
step and the evaluation after it, saves nothing and exits 0, so a job scheduler takes the run for finished.

Here the signal is only noted. At the end of the training step in progress (after the new weights reach the engine),
every rank agrees on it (one all-reduce), the run saves ``last.ckpt`` in its checkpoint directory, prints one line
naming it and the command that resumes it, and exits with ``128 + signal``: 143 for SIGTERM, 138 for SIGUSR1, what a
shell reports for a process the signal ended. So SLURM (``afterok`` dependencies), Kubernetes (``podFailurePolicy``
on exit codes) and torchrun (a failed worker) see a run that did not finish. The step in progress is finished, not
abandoned: its bounds are known (one step's time), and a checkpoint at a step's end resumes exactly. An evaluation
in progress is abandoned after its current batch (an evaluation can take longer than a grace period), and one due
after the step is not started. Either is owed: the checkpoint says so, and the resumed run evaluates those weights
first, as the uninterrupted run did, before it trains on (or ends: a run stopped at its last step would otherwise end
without its last evaluation, and a comparison read its arms at different steps). A signal during the sanity check,
before any step, saves nothing new. docs/cluster.md has the timings and what to set where a step is longer than the
grace period.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from evolrl.checkpoints.run_dir import checkpoint_dir

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(SystemExit):
    """The run stopped on a signal after saving its checkpoint; the exit code is ``128 + signal``."""


class Preemption(L.Callback):
    """On SIGTERM or SIGUSR1: ``last.ckpt`` at the end of the step in progress, one line, exit ``128 + signal``.

    Args:
        resume_command: The command printed for resuming (``python -m evolrl`` gives the one it was started with).
    """

    def __init__(self, resume_command: str | None = None) -> None:
        self.resume_command = resume_command
        self.received: int = 0
        self.received_at = 0.0
        self.launcher = None
        self.abandoned_evaluation = False
        self.exit_code = 0
        """Set once a step's checkpoint is saved on a signal: the exit code, raised after Lightning logs the step."""
        self.owed_evaluation: int | None = None
        """The step whose evaluation a signal skipped or cut short; part of the checkpoint, run on resuming there."""

    # ---- the signal: noted only ---------------------------------------------------------------
    def _note(self, signum: int, frame) -> None:
        if not self.received:
            self.received, self.received_at = signum, time.monotonic()
            if self.launcher is not None:  # processes Lightning started for the other local ranks
                self.launcher.kill(signum)

    def _install(self, trainer) -> None:
        # After Lightning registered its own handlers (it does so just before the sanity check); it restores the
        # earlier ones at teardown.
        if threading.current_thread() is threading.main_thread():
            self.launcher = trainer.strategy.launcher
            for signum in SIGNALS:
                signal.signal(signum, self._note)

    def on_sanity_check_start(self, trainer, module) -> None:
        self._install(trainer)

    def setup(self, trainer, module, stage: str) -> None:
        if stage == "fit":
            run_first(trainer.fit_loop, functools.partial(self._owed_evaluation, trainer))

    def teardown(self, trainer, module, stage: str) -> None:
        if stage == "fit":
            vars(trainer.fit_loop).pop("run", None)

    def _owed_evaluation(self, trainer) -> None:
        """The evaluation the checkpoint owes, made with its weights before the fit loop trains on or ends."""
        self._install(trainer)  # before every start's first step or evaluation, after Lightning registered its own
        owed, self.owed_evaluation = self.owed_evaluation, None
        if owed == trainer.global_step:  # not when resumed from another step's checkpoint; a signal in it owes it again
            evaluate_now(trainer)

    def state_dict(self) -> dict:
        return {"owed_evaluation": self.owed_evaluation}

    def load_state_dict(self, state_dict: dict) -> None:
        self.owed_evaluation = state_dict.get("owed_evaluation")

    def _agreed(self, trainer) -> int:
        """The signal any rank received (the largest number), 0 for none; the same on every rank."""
        if trainer.world_size == 1:
            return self.received
        flag = torch.tensor(self.received, device=trainer.strategy.root_device)
        return int(trainer.strategy.reduce(flag, reduce_op="max").item())

    # ---- where a run can stop -----------------------------------------------------------------
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        signum = self._agreed(trainer)
        if signum:  # saved at the step's end; the exit waits until Lightning has logged the step
            self.owed_evaluation = trainer.global_step if evaluation_follows(trainer) else None
            self.exit_code = self._stop(trainer, signum, self._save(trainer))

    def _exit_once_logged(self, trainer, *args, **kwargs) -> None:
        if self.exit_code:
            raise Preempted(self.exit_code)

    # The hooks Lightning calls after it logs a training step: the next step's start, the evaluation after it, the
    # epoch's end (the run's last step).
    on_train_batch_start = on_validation_start = on_train_epoch_end = on_train_end = _exit_once_logged

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return
        signum = self._agreed(trainer)
        if signum:
            self.abandoned_evaluation = not trainer.sanity_checking
            self.owed_evaluation = trainer.global_step if self.abandoned_evaluation else None
            raise Preempted(self._stop(trainer, signum, self._save(trainer) if self.abandoned_evaluation else
                                       "no training step since the start: nothing new to save"))

    def stop_point(self, trainer, what: str) -> None:
        """Where the run's progress is already on disk, outside a step (a pass before the first step keeps its own
        file): on a signal, one line naming ``what`` was under way, and exit ``128 + signal`` without a save."""
        signum = self._agreed(trainer)
        if signum:
            raise Preempted(self._stop(trainer, signum, f"stopped during {what}"))

    def on_save_checkpoint(self, trainer, module, checkpoint: dict) -> None:
        if self.abandoned_evaluation:  # resume as after a finished evaluation, not in the middle of this one
            progress = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
            for counts in (progress["total"], progress["current"]):
                counts["ready"] = counts["started"] = counts["processed"] = counts["completed"]

    def _save(self, trainer) -> str:
        path = checkpoint_dir(trainer) / "last.ckpt"
        for callback in trainer.checkpoint_callbacks:
            # Saved in the checkpoint's state, so that after the requeue this callback's next ``last`` replaces this
            # file, where Lightning would take it for another run's and write ``last-v1.ckpt`` beside it.
            if isinstance(callback, ModelCheckpoint) and callback.save_last and callback.dirpath == str(path.parent):
                callback.last_model_path = str(path)
        start = time.monotonic()
        trainer.save_checkpoint(path, weights_only=False)
        return f"saved {path} (step {trainer.global_step}) in {time.monotonic() - start:.1f} s"

    def _stop(self, trainer, signum: int, what: str) -> int:
        """Prints the line (rank 0) and gives the exit code."""
        name, code, step = signal.Signals(signum).name, 128 + signum, trainer.global_step
        waited = (f"{time.monotonic() - self.received_at:.1f} s after it" if self.received
                  else "signalled on another rank")
        if trainer.is_global_zero:
            resume = f"; resume with: {self.resume_command}" if self.resume_command else ""
            print(f"evolrl: {name} received, stopping at step {step}, {waited}: {what}{resume}; exit code {code}",
                  file=sys.stdout, flush=True)
        return code


def evaluation_follows(trainer) -> bool:
    """Whether Lightning evaluates after the training step that just ended (asked at its ``on_train_batch_end``): its
    own test, which ``_TrainingEpochLoop.on_advance_end`` makes next (tests/test_lightning_api.py pins both)."""
    fit = trainer.fit_loop
    return fit._data_fetcher is not None and fit.epoch_loop._should_check_val_fx(fit._data_fetcher)


def run_first(loop, before) -> None:
    """Makes the fit ``loop`` call ``before()`` once the checkpoint is restored and the training data set up, before it
    decides whether any step is left. A run resumed at its last step ends there without calling ``on_train_start`` or
    any other hook, so that hook cannot make the evaluation it owes (tests/test_lightning_api.py pins ``_FitLoop.run``).
    ``Preemption.teardown`` removes it."""
    def run() -> None:
        loop.setup_data()  # the run's length, which the progress lines print; run() returns at once the second time
        before()
        type(loop).run(loop)

    loop.run = run


def evaluate_now(trainer) -> None:
    """One evaluation of the current weights inside ``fit``, as ``_TrainingEpochLoop.on_advance_end`` runs one: from
    the evaluation's first batch, not from where a checkpoint left the loop's counters."""
    loop = trainer.fit_loop.epoch_loop.val_loop
    trainer.validating = True
    loop.restarting = False
    loop.run()
    trainer.training = True


def stop_point(trainer, what: str) -> None:
    """:meth:`Preemption.stop_point` of ``trainer``'s preemption handler, where it has one (``python -m evolrl fit``);
    nothing otherwise."""
    for callback in trainer.callbacks:
        if isinstance(callback, Preemption):
            callback.stop_point(trainer, what)
