"""Trainer counts given as whole numbers stay counts: ``limit_val_batches: 1`` is one batch, not all of them.

``typing`` may hand Lightning's ``Trainer`` a float-first ``Optional[Union[float, int]]`` that another module made
first (its union cache compares keys as sets); jsonargparse then parses ``1`` as ``1.0``, which Lightning reads as
100% of the batches. These tests put that float-first union in place on purpose, so they fail without the repair
whatever this process happened to import before."""

from __future__ import annotations

import inspect
import typing

import pytest
from helpers import build_config
from lightning.pytorch import Trainer

from evolrl.cli import counts_stay_ints, main

FLOAT_FIRST = typing.Union[float, int, None]  # noqa: UP007 (the typing form is the one that goes through the cache)
COUNTS = ("limit_train_batches", "limit_val_batches", "limit_test_batches")


@pytest.fixture
def float_first_trainer(monkeypatch):
    annotations = inspect.unwrap(Trainer.__init__).__annotations__
    for name in COUNTS:
        monkeypatch.setitem(annotations, name, FLOAT_FIRST)
    monkeypatch.setattr("sys.argv", ["evolrl"])  # the CLI gets its arguments from ``args`` alone


def test_a_float_first_union_is_reordered_int_first():
    def f(a=None, b=0, c=0.0):
        pass

    f.__annotations__ = {"a": FLOAT_FIRST, "b": int, "c": typing.Union[float, str]}  # noqa: UP007 (as Lightning's)
    counts_stay_ints(f)
    assert typing.get_args(f.__annotations__["a"]) == (int, float, type(None))
    assert f.__annotations__["b"] is int and f.__annotations__["c"] == typing.Union[float, str]  # noqa: UP007


def test_whole_numbers_reach_the_trainer_as_counts_and_fractions_as_fractions(float_first_trainer, tmp_path,
                                                                              tiny_model):
    path = build_config(tmp_path, tiny_model, trainer={"limit_train_batches": 2, "limit_val_batches": 1,
                                                       "limit_test_batches": 0.5})
    for args in (["--config", str(path)], ["--config", str(path), "--trainer.limit_val_batches", "1"]):
        trainer = main(args, run=False).trainer
        assert (trainer.limit_train_batches, trainer.limit_val_batches, trainer.limit_test_batches) == (2, 1, 0.5)
        assert type(trainer.limit_val_batches) is int and type(trainer.limit_test_batches) is float
