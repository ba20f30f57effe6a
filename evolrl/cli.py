"""``python -m evolrl fit|validate|test --config ...``: LightningCLI over the module and data module.

Every class (reward, embedder, engine, prompt source, logger, callbacks) is chosen by
``class_path`` in the YAML; ``--help`` documents each option from the docstrings,
``--print_config`` shows the configuration as given (``data.seed: null`` there means "follow
``seed_everything``": one seed makes a run reproducible; the saved ``config.yaml`` holds the resolved value).
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import os
import sys
import types
import typing
import warnings

from jsonargparse import set_parsing_settings
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI

from evolrl import cpu_bf16
from evolrl.data.datamodule import RolloutDataModule
from evolrl.rollout.engine_sync import check_engine
from evolrl.settings import SettingError
from evolrl.training.module import EvolRLModule
from evolrl.upgrade import moved_keys


class EvolRLCLI(LightningCLI):
    def parse_arguments(self, parser, args) -> None:
        # A key that moved gets an error naming its new place (evolrl.upgrade), not jsonargparse's "not expected".
        moved = moved_keys(sys.argv[1:] if args is None else args)
        if moved:
            parser.error("; ".join(f"{old} moved to {new}" for old, new in moved)
                         + " (README.md, 'Upgrading': the table of moved keys)")
        super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser) -> None:
        # One model string for the policy and the tokenizer.
        parser.link_arguments("model.model", "data.model")
        parser.add_argument("--cpu_bf16", choices=cpu_bf16.CHOICES, default="auto",
                            help="auto: on a CPU without native bf16 (no AVX-512 or AMX), run float32 where the config "
                                 "asks for bf16 (trainer.precision, the engine's dtype); keep: run what it says")

    def before_instantiate_classes(self) -> None:
        # data.seed follows seed_everything unless set. Not a parser link: a linked key cannot be set by the user,
        # and a run that sets data.seed must keep it. Runs after LightningCLI has resolved ``seed_everything: true``
        # to the seed it drew, so the data module gets that same number.
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.data.seed is None:
            seed = config.seed_everything
            config.data.seed = 0 if seed is False else int(seed)
        cpu_bf16.warn(cpu_bf16.float32_where_bf16_is_emulated(config, native=cpu_bf16.native_bf16()))

    def instantiate_classes(self) -> None:
        # Settings are checked as each object is built (evolrl.settings): report a bad one as a usage error.
        # jsonargparse wraps an error raised inside a class chosen by ``class_path`` (a reward, an
        # evaluation set, a grader) in its own ValueError: the SettingError is then in the cause chain.
        try:
            super().instantiate_classes()
            if self.subcommand == "fit":  # what the module needs of the data module's engine, checked before loading
                check_engine(self.model.mismatch_correction, self.datamodule.rollouts.engine)
        except (SettingError, ValueError) as err:
            setting = _setting_error(err)
            if setting is None:
                raise
            self.parser.error(f"{setting} (in the configuration of `{self.subcommand}`)")


def _setting_error(err: BaseException | None) -> SettingError | None:
    """The SettingError ``err`` is or was raised from, if any."""
    while err is not None and not isinstance(err, SettingError):
        err = err.__cause__ or err.__context__
    return err


def counts_stay_ints(function) -> None:
    """Puts ``int`` before ``float`` in each ``int``/``float`` union among ``function``'s annotations, so that
    ``limit_val_batches: 1`` is one batch, not ``1.0`` (all of them).

    ``typing`` caches unions under keys that compare as sets, so ``Optional[Union[int, float]]`` in Lightning's
    ``Trainer`` can come back as an ``Optional[Union[float, int]]`` that another module (e.g. Lightning's own
    ``Fabric.clip_gradients``) made first, depending on what was imported and what the cache has evicted since.
    jsonargparse tries a union's members in their order, so ``1`` then parses as ``1.0``. A PEP 604 union
    (``int | float | None``) is built without that cache and keeps the order written here."""
    annotations = inspect.unwrap(function).__annotations__
    for name, hint in annotations.items():
        members = typing.get_args(hint)
        if typing.get_origin(hint) is not typing.Union or not {int, float} <= set(members):
            continue
        if not all(isinstance(m, (type, types.GenericAlias)) for m in members):
            continue  # a member `|` would send back through typing's cache
        ordered = [int, float] + [m for m in members if m not in (int, float)]
        annotations[name] = functools.reduce(operator.or_, ordered)


def quiet_start() -> None:
    """Drop two start-up lines a user cannot act on: Lightning's advertisement for a logging service, and a
    deprecation inside Lightning's own pytree helper."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith("💡 Tip:"))


def main(args: list[str] | None = None, run: bool = True) -> EvolRLCLI:
    """The CLI on ``args`` (default: the command line); ``run=False`` only builds the module, data module and trainer
    from ``args`` without a subcommand (tools that must set up exactly what ``fit`` would)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    quiet_start()
    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # dataclass field docs in --help
    counts_stay_ints(Trainer.__init__)
    return EvolRLCLI(
        EvolRLModule,
        RolloutDataModule,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )
