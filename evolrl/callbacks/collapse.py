"""A collapse monitor: the training step at which a label-free run stopped exploring, from measures it already has."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from evolrl.callbacks.contract import TrainView, TrainViewCallback, evolrl_train_view
from evolrl.metrics.diagnostics import label_free_diagnostics
from evolrl.settings import check_float, check_int, require


class CollapseMonitor(TrainViewCallback):
    """Flags the collapse step: the first training step at which, over the last ``window`` steps, every enabled
    criterion holds; logs it to TensorBoard (``collapse/step``, once, at that step) and the progress bar, and
    optionally stops training there.

    He et al. 2026, "How Far Can Unsupervised RLVR Scale LLM Training?" (URLVR, ICLR 2026), found that every
    intrinsic reward they compared rises and then collapses, and proposed watching for the Model Collapse Step.
    Theirs is read off reward accuracy (how often the proxy reward agrees with correctness, which needs ground
    truth; a secondary source gives "reward accuracy below 1%"; we could not confirm the threshold from the paper).
    This monitor works without labels by default, on what a collapsed group looks like: its answers agree (majority
    ratio near 1) while the policy's entropy has fallen far below where the run started, so sampling no longer
    explores and pass@k falls to pass@1 (the paper's "entropy collapse"). Agreement alone is not collapse (a problem
    the model has learned is answered the same way every time), hence both. URLVR's own measure is available as
    ``reward_accuracy`` when the prompts carry answers, and the Model Collapse Step itself is tracked beside the
    criteria whenever they do (``model_collapse_accuracy``), twice: as URLVR defines it, the first step whose own
    reward accuracy is below the threshold, and over a window, the first step at which the mean of the last
    ``model_collapse_window`` steps' is. At a few prompts a step one step whose majorities are all wrong meets
    URLVR's (three of Study IV's six runs of 4 prompts a step, each back above 0.2 the next step), so the windowed
    one is the step to read there; the run summary prints all three steps, each named.
    Signals are window means of the per-step numbers the other callbacks log (``evolrl.metrics.diagnostics``, the
    view's entropy and response lengths); "fractions" compare to the mean of the run's first ``window`` steps (so a
    relative criterion can hold from step ``2 * window - 1`` on).

    Works in any Lightning module whose steps it can read as a :class:`TrainView` (``extract``). A criterion whose
    measure the view lacks is an error at the first step, not a silent skip. Its state (history, collapse step) is
    kept in checkpoints.

    Args:
        majority_ratio: Collapsed when the share of responses that agree with their group's majority is at least
            this (``None``: not a criterion).
        entropy_fraction: ... and the policy's token entropy is at most this fraction of its starting level.
        zero_variance_groups: ... and the share of groups whose rewards are all equal is at least this.
        distinct_answers: ... and the distinct answers per group are at most this many.
        length_fraction: ... and the mean response length is at most this fraction of its starting level.
        reward_accuracy: ... and reward accuracy (needs ground truth) is at most this (URLVR's measure).
        model_collapse_accuracy: URLVR's Model Collapse Step: the first step whose reward accuracy (the step's, no
            window) is below this; needs ground truth, else not measured; ``null``: off.
        model_collapse_window: The windowed Model Collapse Step: the first step at which the mean reward accuracy of
            the last this many steps (those with a known one) is below ``model_collapse_accuracy``; 5 steps of 4
            prompts pool 20 majorities where URLVR's step reads 4.
        window: Steps averaged, and steps that set the starting level.
        stop: Stop training at the collapse step.
        extract: ``(outputs, batch) -> TrainView``; reads evolrl's step output by default.
        prefix: Metric-name prefix.
    """

    def __init__(
        self,
        majority_ratio: float | None = 0.95,
        entropy_fraction: float | None = 0.25,
        zero_variance_groups: float | None = None,
        distinct_answers: float | None = None,
        length_fraction: float | None = None,
        reward_accuracy: float | None = None,
        model_collapse_accuracy: float | None = 0.01,
        model_collapse_window: int = 5,
        window: int = 5,
        stop: bool = False,
        extract: Callable[[Any, Any], TrainView | None] = evolrl_train_view,
        prefix: str = "collapse/",
    ) -> None:
        super().__init__(extract, prefix)
        # (measure, threshold, at least (True) or at most, relative to the starting level)
        self.criteria = [(name, value, high, relative) for name, value, high, relative in (
            ("majority_ratio", majority_ratio, True, False), ("entropy", entropy_fraction, False, True),
            ("zero_variance_groups", zero_variance_groups, True, False),
            ("distinct_answers", distinct_answers, False, False),
            ("response_length", length_fraction, False, True), ("reward_accuracy", reward_accuracy, False, False),
        ) if value is not None]
        keys = {"majority_ratio": "majority_ratio", "entropy": "entropy_fraction",
                "zero_variance_groups": "zero_variance_groups", "distinct_answers": "distinct_answers",
                "response_length": "length_fraction", "reward_accuracy": "reward_accuracy"}
        for name, value, _, _ in self.criteria:
            check_float(f"CollapseMonitor.{keys[name]}", value, 0.0)
        require(bool(self.criteria), "CollapseMonitor", "no criterion",
                allowed="at least one criterion that is not null")
        if model_collapse_accuracy is not None:
            check_float("CollapseMonitor.model_collapse_accuracy", model_collapse_accuracy, 0.0, 1.0)
        check_int("CollapseMonitor.model_collapse_window", model_collapse_window, 1)
        self.model_collapse_accuracy, self.model_collapse_window = model_collapse_accuracy, model_collapse_window
        self.model_collapse_step: int | None = None
        """URLVR's Model Collapse Step, once reached."""
        self.windowed_collapse_step: int | None = None
        """The windowed Model Collapse Step, once reached."""
        self.accuracy_steps = 0
        """Steps whose reward accuracy was known (0: the prompts carry no answers, so no Model Collapse Step)."""
        self.recent_accuracies: list[float] = []
        """The last ``model_collapse_window`` known reward accuracies."""

        check_int("CollapseMonitor.window", window, 1)
        require(isinstance(stop, bool), "CollapseMonitor.stop", stop, allowed="true or false")
        self.keys, self.window, self.stop = keys, window, stop
        self.history: list[dict[str, float]] = []
        """Per step seen: the measures of the criteria."""
        self.collapse_step: int | None = None
        """The collapse step, once flagged."""

    def measures(self, view: TrainView, step: int | None = None) -> dict[str, float]:
        """The criteria's measures for one step; a missing one is a ValueError naming the setting to turn off. The
        step's reward accuracy, where known, also counts towards the Model Collapse Step of ``step``."""
        found: dict[str, float] = {}
        if view.rewards is not None:
            found = label_free_diagnostics(view.rewards, view.truths(), None)
        if view.entropy is not None:
            found["entropy"] = float(view.entropy)
        if view.response_lengths is not None:
            found["response_length"] = view.response_lengths.float().mean().item()
        self.watch_model_collapse(step, found.get("reward_accuracy"))
        out = {}
        for name, *_ in self.criteria:
            if name not in found or not math.isfinite(found[name]):
                raise ValueError(f"CollapseMonitor.{self.keys[name]} needs the step's {name}, which this module's "
                                 f"view does not give; set CollapseMonitor.{self.keys[name]}: null, or extract a "
                                 "TrainView that has it")
            out[name] = found[name]
        return out

    def observe(self, measures: dict[str, float]) -> bool:
        """Add one step's measures; whether the run has collapsed as of this step (window means, all criteria)."""
        self.history.append(measures)
        if len(self.history) < self.window:
            return False
        recent = self.history[-self.window :]
        for name, value, high, relative in self.criteria:
            mean = sum(s[name] for s in recent) / self.window
            if relative:
                start = sum(s[name] for s in self.history[: self.window]) / self.window
                ok = len(self.history) >= 2 * self.window and mean <= value * start  # windows apart
            else:
                ok = mean >= value if high else mean <= value
            if not ok:
                return False
        return True

    def watch_model_collapse(self, step: int | None, accuracy: float | None) -> bool:
        """Count ``step``'s reward accuracy (``None``: unknown) towards both Model Collapse Steps; whether this is
        URLVR's."""
        threshold = self.model_collapse_accuracy
        if threshold is None or accuracy is None or not math.isfinite(accuracy):
            return False
        self.accuracy_steps += 1
        at = step if step is not None else self.accuracy_steps - 1
        self.recent_accuracies = [*self.recent_accuracies, accuracy][-self.model_collapse_window :]
        recent, window = self.recent_accuracies, self.model_collapse_window
        if self.windowed_collapse_step is None and len(recent) == window and sum(recent) / window < threshold:
            self.windowed_collapse_step = at
        if self.model_collapse_step is None and accuracy < threshold:
            self.model_collapse_step = at
            return True
        return False

    def summary(self) -> list[str]:
        """The run summary's lines: the collapse step and both Model Collapse Steps (URLVR's per step, then the
        windowed one), or why there is none."""
        seen = f"none in {len(self.history)} steps" if self.history else "no training step seen"
        lines = [f"Collapse step (CollapseMonitor): {self.collapse_step if self.collapse_step is not None else seen}"]
        if self.model_collapse_accuracy is not None:
            below, steps = f"< {self.model_collapse_accuracy:g}", self.model_collapse_window
            for name, rule, step in (
                ("URLVR", f"the first step with reward accuracy {below}", self.model_collapse_step),
                ("windowed", f"the first step whose mean reward accuracy over the last {steps} steps is {below}",
                 self.windowed_collapse_step)):
                if step is not None:
                    found = f"{step}"
                elif self.accuracy_steps:
                    found = f"none in {self.accuracy_steps} steps"
                else:
                    found = "not measured (the training prompts carry no answers)"
                lines.append(f"Model collapse step ({name}, {rule}): {found}")
        return lines

    def on_view(self, trainer, pl_module, view: TrainView) -> None:
        step = view.step if view.step is not None else trainer.global_step
        before = self.model_collapse_step, self.windowed_collapse_step
        collapsed = self.observe(self.measures(view, step))
        for name, old, new in zip(("model_collapse_step", "model_collapse_window_step"), before,
                                  (self.model_collapse_step, self.windowed_collapse_step)):
            if old is None and new is not None:
                for logger in trainer.loggers:
                    logger.log_metrics({f"{self.prefix}{name}": float(step)}, step=step)
        if self.collapse_step is None and collapsed:
            self.collapse_step = view.step if view.step is not None else trainer.global_step
            for logger in trainer.loggers:
                logger.log_metrics({f"{self.prefix}step": float(self.collapse_step)}, step=self.collapse_step)
            rank_zero_warn(f"CollapseMonitor: collapse at training step {self.collapse_step} (over the last "
                           f"{self.window} steps: " + ", ".join(
                               f"{n} {sum(s[n] for s in self.history[-self.window:]) / self.window:.3g}"
                               for n, *_ in self.criteria) + ")" + ("; stopping" if self.stop else ""))
            if self.stop:
                trainer.should_stop = True
        if self.collapse_step is not None:
            pl_module.log("collapse", float(self.collapse_step), prog_bar=True, logger=False, on_step=True,
                          on_epoch=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "collapse_step": self.collapse_step,
                "model_collapse_step": self.model_collapse_step, "accuracy_steps": self.accuracy_steps,
                "windowed_collapse_step": self.windowed_collapse_step, "recent_accuracies": self.recent_accuracies}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict["history"])
        self.collapse_step = state_dict["collapse_step"]
        self.model_collapse_step = state_dict.get("model_collapse_step")
        self.accuracy_steps = state_dict.get("accuracy_steps", 0)
        self.windowed_collapse_step = state_dict.get("windowed_collapse_step")
        self.recent_accuracies = list(state_dict.get("recent_accuracies", []))[-self.model_collapse_window :]
