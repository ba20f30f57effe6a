"""One seed: ``data.seed`` follows ``seed_everything`` unless the configuration sets it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import build_config

from evolrl.cli import main

CONFIGS = Path(__file__).parent.parent / "configs"


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])  # the CLI gets its arguments from ``args`` alone


def _built_seed(tmp_path: Path, model: str, *args: str, **top) -> int:
    cli = main(["--config", str(build_config(tmp_path, model, **top)), *args], run=False)
    return cli.datamodule.seeds.seed


def test_data_seed_follows_seed_everything(tmp_path, tiny_model):
    assert _built_seed(tmp_path, tiny_model, seed_everything=7) == 7
    assert _built_seed(tmp_path, tiny_model, "--seed_everything", "11") == 11


def test_seed_everything_true_gives_the_data_module_the_drawn_seed(tmp_path, tiny_model):
    cli = main(["--config", str(build_config(tmp_path, tiny_model, seed_everything=True))], run=False)
    drawn = cli.config.seed_everything
    assert isinstance(drawn, int) and not isinstance(drawn, bool)
    assert cli.datamodule.seeds.seed == drawn


def test_seed_everything_false_leaves_the_data_seed_at_zero(tmp_path, tiny_model):
    assert _built_seed(tmp_path, tiny_model, seed_everything=False) == 0


def test_an_explicit_data_seed_wins(tmp_path, tiny_model):
    assert _built_seed(tmp_path, tiny_model, "--data.seed", "5", seed_everything=7) == 5
    assert _built_seed(tmp_path, tiny_model, "--data.seed", "0", seed_everything=7) == 0  # 0 is a value, not "unset"


def test_the_saved_config_holds_the_resolved_seed(tmp_path, tiny_model):
    cli = main(["fit", "--config", str(build_config(tmp_path, tiny_model, seed_everything=9)),
                "--trainer.default_root_dir", str(tmp_path), "--trainer.max_steps", "0"])
    assert cli.datamodule.seeds.seed == 9
    saved = yaml.safe_load(next(tmp_path.rglob("config.yaml")).read_text())
    assert saved["seed_everything"] == 9 and saved["data"]["seed"] == 9


def test_a_bad_data_seed_fails_at_start_naming_the_key(tmp_path, tiny_model, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(build_config(tmp_path, tiny_model, seed_everything=7)), "--data.seed", "-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "RolloutDataModule.seed" in err and "-1" in err and ">= 0" in err


def test_help_says_data_seed_follows_seed_everything(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--data.seed" in help_text and "the CLI's ``seed_everything``" in help_text


def test_top_level_help_names_export(capsys):
    # export is not a Trainer method, so LightningCLI's list of subcommands leaves it out; the epilog names it.
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert help_text.startswith("usage: python -m evolrl ") and "python -m evolrl export --help" in help_text


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_shipped_configs_keep_their_seeds(path):
    # A config that sets data.seed keeps it; one that does not now follows its seed_everything (0 in every shipped
    # config that sets one, the old data.seed default), so no shipped run changes its random streams.
    config = yaml.safe_load(path.read_text()) or {}
    data_seed = (config.get("data") or {}).get("seed")
    assert data_seed is not None or config.get("seed_everything", 0) == 0
