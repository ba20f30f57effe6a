"""``python -m evolrl fit|validate|test --config ...``: LightningCLI over the module and data module.

Every class (reward, embedder, engine, prompt source, logger, callbacks) is chosen by
``class_path`` in the YAML; ``--help`` documents each option from the docstrings,
``--print_config`` shows the configuration as given (``data.seed: null`` there means "follow
``seed_everything``": one seed makes a run reproducible; the saved ``config.yaml`` holds the resolved value).

``fit`` runs as a cluster job should (``evolrl.checkpoints``, docs/cluster.md): checkpoints go to
``<default_root_dir>/checkpoints`` (the same directory on a requeue, whatever the logger's version), written
atomically; the directory is checked and locked at start; ``--ckpt_path last`` is the newest checkpoint there, or
step 0 with a line saying so; a resumed run uses the settings given now and lists those that differ from the
checkpoint's; SIGTERM/SIGUSR1 save ``last.ckpt`` and exit ``128 + signal``; without a terminal, progress comes as
lines; a run that cannot go on (a non-finite reward, a failed save) ends with one line and exit 1.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import operator
import os
import re
import sys
import types
import typing
import warnings

import yaml
from jsonargparse import Namespace, set_parsing_settings
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from evolrl import cpu_bf16
from evolrl.checkpoints import CheckpointError, RunLock, check_writable, checkpoint_dir, refused
from evolrl.checkpoints.job import job_parts, own_checkpoint_dir, resume_point
from evolrl.data.datamodule import RolloutDataModule
from evolrl.rollout.ranks import RankFailed
from evolrl.rollout.remote import SamplerFailed
from evolrl.run_check import check_run
from evolrl.settings import SettingError
from evolrl.training.module import EvolRLModule
from evolrl.training.run_checks import TrainingStopped
from evolrl.upgrade import moved_keys


class EvolRLCLI(LightningCLI):
    def __init__(self, *args, **kwargs) -> None:
        self.lock: RunLock | None = None  # the checkpoint directory's, taken by ``before_fit``
        try:
            super().__init__(*args, **kwargs)  # parses, builds, and runs the subcommand
        finally:
            if self.lock is not None:
                self.lock.release()

    def parse_arguments(self, parser, args) -> None:
        # A key that moved gets an error naming its new place (evolrl.upgrade), not jsonargparse's "not expected".
        if isinstance(args, (dict, Namespace)):  # a configuration as an object: nothing written to read
            return super().parse_arguments(parser, args)
        given = sys.argv[1:] if args is None else list(args)
        moved = moved_keys(given)
        if moved:
            parser.error("; ".join(f"{old} moved to {new}" for old, new in moved)
                         + " (evolrl/upgrade.py lists every moved key)")
        self.given_args = given  # for the command that resumes a preempted run
        self.config = parser.parse_args(with_class_defaults(given))  # as LightningCLI's own, on the rewritten list

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
            if self.subcommand == "fit":  # the settings against each other, before anything loads
                check_run(self.model, self.datamodule, self.trainer)
        except (SettingError, ValueError) as err:
            setting = _setting_error(err)
            if setting is None:
                raise
            self.parser.error(f"{setting} (in the configuration of `{self.subcommand}`)")

    def _parse_ckpt_path(self) -> None:
        """Nothing: LightningCLI would parse a checkpoint file's hyper-parameters over the configuration and the command
        line; a resumed run here uses what it is given, and ``fit`` lists what differs (``job.resume_point``). The one
        private method overridden (no public switch): tests/test_lightning_api.py fails on a release that changes it."""

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The trainer, and for ``fit`` what a cluster job adds to it (``job.job_parts``), with checkpoints under
        ``<default_root_dir>/checkpoints``."""
        if self.subcommand != "fit":
            return super().instantiate_trainer(**kwargs)
        config = {**(self.config_init["fit"].get("trainer") or {}), **kwargs}
        given_callbacks = config.get("callbacks") or []
        config["callbacks"] = given_callbacks if isinstance(given_callbacks, list) else [given_callbacks]
        settings = yaml.safe_load(self.parser.dump(self.config, skip_link_targets=False, skip_none=False))["fit"]
        given = getattr(self, "given_args", [])  # none where the configuration came as an object
        parts = job_parts(config, settings, given)  # may add a plugin to config
        trainer = super().instantiate_trainer(**{**kwargs, "plugins": config.get("plugins"),
                                                 "callbacks": [*config["callbacks"], *parts]})
        own_checkpoint_dir(trainer)
        self.settings = settings
        return trainer

    def before_fit(self) -> None:
        """Checks and locks the checkpoint directory (held until the CLI returns), and resolves ``--ckpt_path``: the
        newest checkpoint for ``last``, the settings that differ listed, a change its tensors cannot take refused."""
        directory = checkpoint_dir(self.trainer)
        if rank_zero_only.rank == 0:  # one process checks and holds the directory
            check_writable(directory)
            self.lock = RunLock(directory)
            self.lock.acquire()
        path, changes = resume_point(self.config_init["fit"].get("ckpt_path"), directory, self.settings,
                                     dict(self.model.hparams), self.config_init["fit"].get("weights_only"))
        bad = refused(changes)
        if bad:
            self.parser.error("; ".join(f"{key}={new!r} cannot resume {path}, saved with {key}={old!r}"
                                        for key, old, new in bad) + ": its tensors have that setting's shape")
        self.config_init["fit"]["ckpt_path"] = str(path) if path is not None else None


CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*\.[A-Z]\w*")
"""A value naming a class: a dotted path ending in a CapWords name."""


def with_class_defaults(args: list[str]) -> list[str]:
    """``args`` with the defaults of each class chosen on the command line written out after it, where a later
    argument does not set them (``--model.loss.policy_loss=evolrl.algorithms.CISPO`` gets ``CISPO``'s
    ``clip_low=1.0``, ``clip_high=4.0``).

    jsonargparse carries over the settings a new class shares with the one it replaces, so ``CISPO`` chosen after a
    config with ``ClippedSurrogate`` would silently clip at ``ClippedSurrogate``'s 0.2 and 0.28. Only plain defaults
    (numbers, strings, booleans, ``null``) are written; a nested object's settings carry over as jsonargparse does.
    """
    out: list[str] = []
    pairs = [(i, *(a[2:].split("=", 1) if "=" in a else (a[2:], args[i + 1] if i + 1 < len(args) else "")))
             for i, a in enumerate(args) if a.startswith("--")]
    ends = {i + (0 if "=" in args[i] else 1): (key, value) for i, key, value in pairs}
    for i, arg in enumerate(args):
        out.append(arg)
        if i not in ends or ends[i][0].endswith("+") or not CLASS_PATH.fullmatch(ends[i][1]):  # not an append
            continue
        key, class_path = ends[i]
        later = {k[len(key) + 1 :].removeprefix("init_args.") for j, k, _ in pairs if j > i and k.startswith(f"{key}.")}
        out += [f"--{key}.init_args.{name}={value}" for name, value in plain_defaults(class_path).items()
                if name not in later]
    return out


def plain_defaults(class_path: str) -> dict[str, str]:
    """The plain defaults of ``class_path``'s constructor, as YAML values; none where it does not import."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        parameters = inspect.signature(cls).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return {}  # jsonargparse names the bad class itself
    plain = (int, float, str, bool, type(None))
    return {p.name: yaml.safe_dump(p.default, default_flow_style=True).removesuffix("\n...\n").strip()
            for p in parameters if p.default is not inspect.Parameter.empty and isinstance(p.default, plain)}


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
    """Drop start-up lines a user cannot act on: Lightning's advertisement for a logging service, a deprecation inside
    Lightning's own pytree helper, its advice on manual optimization and checkpoints (evolrl checkpoints the weights
    after the step, as intended), and the zero-length warning a run without evaluation sets gets."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    warnings.filterwarnings("ignore", message=r"Using ModelCheckpoint with manual optimization")
    warnings.filterwarnings("ignore", message=r"Total length of `\w+` across ranks is zero")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith("💡 Tip:"))


TOP_LEVEL = {
    "prog": "python -m evolrl",
    "description": "EVOL-RL and the other label-free rewards on PyTorch Lightning (README.md).",
    "epilog": "python -m evolrl export CHECKPOINT OUT_DIR (python -m evolrl export --help) writes a Hugging Face model; "
              "python -m evolrl compare plan|run|commands|report (--help) compares methods over seeds.",
}
"""The top-level ``--help``: ``export`` and ``compare`` are not Trainer methods, so LightningCLI does not list them."""


def main(args: list[str] | None = None, run: bool = True, cli: type[EvolRLCLI] = EvolRLCLI) -> EvolRLCLI:
    """The CLI on ``args`` (default: the command line); ``run=False`` only builds the module, data module and trainer
    from ``args`` without a subcommand (what ``fit`` would); ``cli``: a subclass (``compare.resolve``: parse only)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    quiet_start()
    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # dataclass field docs in --help
    counts_stay_ints(Trainer.__init__)
    try:
        return cli(
            EvolRLModule,
            RolloutDataModule,
            seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
            parser_kwargs=TOP_LEVEL,
            args=args,
            run=run,
        )
    except (TrainingStopped, CheckpointError, SamplerFailed) as err:  # the cause and what to do, in one line
        sys.exit(f"evolrl: error: {err}")
    except RankFailed as err:
        if not str(err).startswith("sampler process"):
            raise
        sys.exit(f"evolrl: error: {err}")
