"""What a run prints when it ends: fit's first and last held-out tables and its paths, validate's and test's table."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import yaml
from helpers import scalars, tiny_config

from evolrl.callbacks import RunSummary
from evolrl.cli import main
from evolrl.settings import SettingError


def summary_config(tmp_path: Path, tiny_model: str, **trainer) -> Path:
    """The tiny two-step run (an evaluation before training and after each step), with :class:`RunSummary`."""
    path = tiny_config(tmp_path, tiny_model, reward="MajorityVoteReward")
    config = yaml.safe_load(path.read_text())
    config["model"]["reward"] = {"class_path": "evolrl.rewards.MajorityVoteReward"}  # its defaults: any answer counts
    config["trainer"]["callbacks"].append({"class_path": "evolrl.callbacks.RunSummary"})
    config["trainer"].update(trainer)
    path.write_text(yaml.safe_dump(config))
    return path


def figures(line: str) -> list[float]:
    return [float(cell) for cell in line.split()[-3:]]


def test_fit_prints_the_first_and_last_evaluation_as_the_curves_hold_them(tmp_path, tiny_model, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main(["fit", "--config", str(summary_config(tmp_path, tiny_model, enable_checkpointing=True))])
    out = capsys.readouterr().out
    lines = out[out.index("Held-out evaluation, first and last:"):].splitlines()
    assert lines[1].split() == ["set", "step", "problems", "samples", "pass@1", "pass@4", "maj@4"]
    first, last = lines[2].split(), lines[3].split()
    assert first[:4] == ["addition", "0", "4", "4"] and last[:4] == ["addition", "2", "4", "4"]

    [log_dir] = glob.glob(str(tmp_path / "tiny" / "version_*"))
    curves = scalars(Path(log_dir))
    for name, column in (("pass@1", 4), ("pass@4", 5), ("maj@4", 6)):
        values = curves[f"val/addition/{name}"]
        assert len(values) == 3  # before training, after step 1, after step 2
        assert (float(first[column]), float(last[column])) == (round(values[0], 3), round(values[-1], 3))
    assert lines[4] == f"Curves (TensorBoardLogger): {log_dir}"
    checkpoint = lines[5].removeprefix("Checkpoint: ")
    assert checkpoint.startswith(str(tmp_path / "checkpoints")) and Path(checkpoint).is_file()  # beside the curves


def test_fit_without_checkpoints_says_why_there_is_none(tmp_path, tiny_model, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    path = summary_config(tmp_path, tiny_model, limit_train_batches=1, num_sanity_val_steps=0, logger=False,
                          default_root_dir=str(tmp_path))  # where the CLI saves its config.yaml without a logger
    main(["fit", "--config", str(path)])
    out = capsys.readouterr().out
    lines = out[out.index("Held-out evaluation:"):].splitlines()
    assert lines[2].split()[:2] == ["addition", "1"]  # one evaluation: no "first and last"
    assert lines[3:] == ["Checkpoint: none (trainer.enable_checkpointing is false)"]


@pytest.mark.parametrize("stage", ["validate", "test"])
def test_validate_and_test_print_their_table(tmp_path, tiny_model, monkeypatch, capsys, stage):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main([stage, "--config", str(summary_config(tmp_path, tiny_model))])
    out = capsys.readouterr().out
    title = "Validation at step 0:" if stage == "validate" else "Test at step 0:"
    lines = out[out.index(title):].splitlines()
    assert lines[1].split() == ["set", "problems", "samples", "pass@1", "pass@4", "maj@4"]
    assert lines[2].split()[:3] == ["addition", "4", "4"]
    [written] = glob.glob(str(tmp_path / "tiny" / "version_*" / f"{'val' if stage == 'validate' else 'test'}"
                                                                   "_metrics.json"))
    assert lines[3] == f"Written to {Path(written).parent}/{Path(written).name}"
    table = yaml.safe_load(Path(written).read_text())["addition"]  # JSON is YAML
    assert figures(lines[2]) == [round(table[name], 3) for name in ("pass@1", "pass@4", "maj@4")]


def test_digits_out_of_range_names_the_setting():
    with pytest.raises(SettingError, match=r"RunSummary\.digits=7 is not allowed: an integer in \[0, 6\]"):
        RunSummary(digits=7)
