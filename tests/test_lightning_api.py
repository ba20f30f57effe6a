"""The parts of Lightning evolrl relies on that Lightning does not promise to keep.

``EvolRLCLI`` uses LightningCLI's public hooks and overrides one private method, ``_parse_ckpt_path``, for which
Lightning has no public switch; ``evolrl.distributed.ModelParallelStrategy`` reads one private attribute;
``evolrl.checkpoints.preemption`` asks the training loop whether an evaluation follows a step and runs the evaluation
loop itself (an evaluation a signal skipped, made on resuming, ahead of the fit loop's ``run``). These tests fail on a
Lightning release that changes any of them: read the new code, adapt evolrl's (a checkpoint's hyper-parameters must
not replace the settings given), then update what is expected here and the ``lightning`` range in ``pyproject.toml``.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import tomllib
from pathlib import Path

import lightning
from lightning.pytorch.cli import LightningCLI
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from evolrl.cli import EvolRLCLI

PARSE_CKPT_PATH_SHA256 = "9c48f812abdba883dd1afcbf8865519aac31770aa194b822db394971f24a49ea"
"""``LightningCLI._parse_ckpt_path``'s source, unchanged from Lightning 2.6.0 to 2.6.6."""

PYPROJECT = Path(__file__).parent.parent / "pyproject.toml"


def test_the_only_private_method_overridden_is_parse_ckpt_path():
    private = {name for name in vars(EvolRLCLI) if name.startswith("_") and not name.startswith("__")}
    assert private == {"_parse_ckpt_path"}, f"pin each private override here: {sorted(private)}"


def test_parse_ckpt_path_is_the_method_the_override_was_written_against():
    assert inspect.signature(LightningCLI._parse_ckpt_path, eval_str=True) == \
        inspect.signature(EvolRLCLI._parse_ckpt_path, eval_str=True)
    source = inspect.getsource(LightningCLI._parse_ckpt_path)
    assert hashlib.sha256(source.encode()).hexdigest() == PARSE_CKPT_PATH_SHA256, (
        f"Lightning {lightning.__version__} changed LightningCLI._parse_ckpt_path (this module's docstring)")


def test_lightning_calls_parse_ckpt_path_after_parsing_and_before_building():
    """The override only helps where it runs: after the arguments are parsed, before any class is built."""
    lines = [line.strip() for line in inspect.getsource(LightningCLI.__init__).splitlines()]
    order = [lines.index(line) for line in ("self.parse_arguments(self.parser, args)", "self._parse_ckpt_path()",
                                            "self.instantiate_classes()")]
    assert order == sorted(order)


def test_the_public_hooks_overridden_keep_their_parameters():
    for name in ("instantiate_trainer", "parse_arguments", "instantiate_classes"):
        ours = inspect.signature(getattr(EvolRLCLI, name)).parameters
        theirs = inspect.signature(getattr(LightningCLI, name)).parameters
        assert [(p.name, p.kind) for p in ours.values()] == [(p.name, p.kind) for p in theirs.values()], name


def test_the_installed_lightning_is_in_the_range_pyproject_pins():
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (pin,) = [d for d in dependencies if re.match(r"lightning\b", d)]
    specifier = SpecifierSet(pin.removeprefix("lightning"))
    assert any(s.operator == "<" for s in specifier), f"{pin}: a release past the checked ones may change the method"
    assert Version(lightning.__version__) in specifier, (lightning.__version__, pin)


def test_the_private_attribute_the_fsdp2_strategy_reads_is_set_by_lightning():
    """``evolrl.distributed.ModelParallelStrategy.save_checkpoint`` reads it; only a sharded save would meet its
    absence (on GPUs), so it is checked here, on any machine. Private imports elsewhere fail at import instead."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    assert "self._save_distributed_checkpoint = save_distributed_checkpoint" in inspect.getsource(
        ModelParallelStrategy.__init__)


def test_the_training_loop_evaluates_as_preemption_asks_and_runs_it():
    """``evaluation_follows`` asks the test ``on_advance_end`` makes next, with the fit loop's data fetcher;
    ``evaluate_now`` runs the evaluation as ``on_advance_end`` does (validating, then training again)."""
    from lightning.pytorch.loops.fit_loop import _FitLoop
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    after_a_step = inspect.getsource(_TrainingEpochLoop.on_advance_end)
    order = [after_a_step.index(line) for line in ("should_check_val = self._should_check_val_fx(data_fetcher)",
                                                   "self.trainer.validating = True", "self.val_loop.run()",
                                                   "self.trainer.training = True")]
    assert order == sorted(order)
    assert list(inspect.signature(_TrainingEpochLoop._should_check_val_fx).parameters) == ["self", "data_fetcher"]
    assert "self.epoch_loop.run(self._data_fetcher)" in inspect.getsource(_FitLoop.advance)
    assert "self.val_loop.restarting = False" in inspect.getsource(_TrainingEpochLoop.advance)


def test_the_fit_loop_sets_up_its_data_then_may_end_before_any_hook():
    """``run_first`` calls ``_FitLoop.setup_data`` itself, then the evaluation a resumed run owes, then Lightning's
    ``run``: which sets up the data (a no-op the second time), returns at once where no step is left, and only
    otherwise calls ``on_train_start``. A release that adds a hook between the two lets the hook do it."""
    from lightning.pytorch.loops.fit_loop import _FitLoop

    run = inspect.getsource(_FitLoop.run)
    order = [run.index(line) for line in ("self.setup_data()", "if self.skip:", "return", "self.on_run_start()")]
    assert order == sorted(order)
    assert "if self._combined_loader is not None and not self._should_reload_train_dl:" in inspect.getsource(
        _FitLoop.setup_data)
