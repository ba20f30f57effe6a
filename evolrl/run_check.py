"""One check of a run's settings against each other, before anything loads: each cross-setting rule written once.

It reads the module, the data module and the trainer as built, so it lives above ``training`` (which imports neither
the rollout nor the data package, ``tests/test_replay_data.py``).
"""

from __future__ import annotations

from evolrl.rollout.remote import check_placement, trainer_gpus
from evolrl.rollout.sampler import check_engine
from evolrl.settings import require


def check_run(module, data, trainer) -> None:
    """Every rule between the settings of the module, the data module and the trainer, each written here once: a
    SettingError naming the setting. ``python -m evolrl fit`` calls it before any model loads; without the CLI the
    data module's ``setup`` calls it (Lightning runs it first, before a sampler process starts) and the module's
    (for a data module of recorded rollouts). The rules are pure: a second call finds what the first found. The
    reward's rules come first: what it cannot run with at all (a sampler process, a lag) is the error to read before
    one about that setting's own values."""
    module.reward_hooks.check(module, data, trainer)
    if hasattr(data, "rollouts"):  # a data module that samples, not recorded rollouts
        check_engine(module.mismatch_correction, data.rollouts.engine, data.max_staleness)
        if data.sampler_process is not None and data.supply.remote is None:  # against the trainer's devices, before
            # the process starts (once started, this process no longer runs on the sampler's cores)
            check_placement(data.sampler_process, trainer.world_size, trainer_gpus(trainer))
            sleep = getattr(data.rollouts.engine, "sleep_level", 0)
            require(sleep == 0, "VLLMEngine.sleep_level", sleep,
                    allowed="0 with a sampler process of its own (sleep mode frees memory for a trainer beside it)")
        if module.overlong is not None:  # its buffer against the sampling budget
            module.overlong.check(data.rollouts.sampling.max_new_tokens)
