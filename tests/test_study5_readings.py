"""Study V's readings (``tools.study.study5``): the pilots' collapse and breakdown tests and the verdict's words, with
known answers, and a run's numbers read back from a real TensorBoard event file written here."""

from __future__ import annotations

import math

import pytest
from torch.utils.tensorboard import SummaryWriter

from tools.study import study5


def write_run(directory, entropy: list[float], pass1: dict[int, float]) -> None:
    writer = SummaryWriter(str(directory))
    for step, value in enumerate(entropy):
        writer.add_scalar("train/entropy", value, step)
        writer.add_scalar("train/novelty_mean", 0.5, step)
    for step, value in pass1.items():
        for name, scale in (("pass@1", 1.0), ("pass@16", 2.0), ("maj@16", 1.5)):
            writer.add_scalar(f"val/heldout/{name}", value * scale, step)
    writer.close()


def test_a_run_whose_entropy_falls_to_a_third_has_collapsed_and_one_at_half_has_not(tmp_path):
    # Exact fractions (1.0 and 0.25/0.5 are binary floats): the ratio is compared with 0.4 without rounding doubt.
    write_run(tmp_path / "fell", [1.0] * 10 + [0.6] * 10 + [0.25] * 10, {0: 0.4, 30: 0.3})
    write_run(tmp_path / "held", [1.0] * 10 + [0.5] * 20, {0: 0.4, 30: 0.25})
    fell, held = (study5.run_readings(tmp_path / name, "heldout") for name in ("fell", "held"))
    assert (fell["entropy_first"], fell["entropy_last"], fell["entropy_ratio"]) == (1.0, 0.25, 0.25)
    assert study5.has_collapsed(fell) and not study5.has_collapsed(held)
    assert fell["last_eval"] == 30 and math.isnan(fell["collapse_step"])
    assert fell["pass@16_last"] == pytest.approx(0.6)  # float32 in the event file
    # Breakdown: below half of step 0 (0.2 here); 0.3 and 0.25 are above it.
    assert not study5.has_broken_down(fell) and not study5.has_broken_down(held)
    assert study5.has_broken_down({"pass@1_start": 0.4, "pass@1_last": 0.19})


def test_a_run_shorter_than_both_windows_is_refused(tmp_path):
    write_run(tmp_path / "short", [1.0] * 19, {0: 0.4})
    with pytest.raises(ValueError, match="19 training steps, fewer than 20"):
        study5.run_readings(tmp_path / "short", "heldout")


def test_the_verdict_is_inconclusive_without_the_precondition_and_worse_only_beside_it():
    assert study5.verdict(True, True, 0.2) == "shown"
    assert study5.verdict(True, False, 0.1) == "not shown"
    assert study5.verdict(False, True, 0.2) == "inconclusive at this scale"
    assert study5.verdict(True, False, -0.01) == "not shown; worse than TTRL (upper end below 0)"
