"""``python -m evolrl fit|validate|test --config ...``: LightningCLI over the module and data module.

Every class (reward, embedder, engine, prompt source, logger, callbacks) is chosen by
``class_path`` in the YAML; ``--help`` documents each option from the docstrings,
``--print_config`` shows the resolved configuration.
"""

from __future__ import annotations

import os

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningCLI

from evolrl.data.datamodule import RolloutDataModule
from evolrl.training.module import EvolRLModule


class EvolRLCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # One model string and one temperature for sampler and trainer alike.
        parser.link_arguments("model.model", "data.model")
        parser.link_arguments("data.temperature", "model.temperature")


def main(args: list[str] | None = None) -> EvolRLCLI:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # dataclass field docs in --help
    return EvolRLCLI(
        EvolRLModule,
        RolloutDataModule,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        args=args,
    )
