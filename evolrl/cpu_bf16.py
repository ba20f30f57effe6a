"""bf16 on a CPU only where the CPU computes it: elsewhere a CPU run falls back to float32 (the CLI's ``cpu_bf16``).

oneDNN runs bf16 matmuls on the CPU's own instructions where it has AVX-512 or AMX. On a CPU with AVX2 alone, torch's
bf16 matmul is emulated: a matmul benchmark measured 0.3 GFLOP/s in bf16 against 97-112 in float32 on a
2-core AVX2 EPYC (two runs), and one update of the study's smoke run took 600 s there in bf16. ``cpu_bf16: auto``
(the default) keeps a config's bf16 where the CPU computes it and runs float32 elsewhere, saying so at start;
``keep`` always runs what the config says.
"""

from __future__ import annotations

import torch
from lightning.pytorch.utilities import rank_zero_warn

CHOICES = ("auto", "keep")


def native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (oneDNN's own test: AVX-512 or AMX present)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def on_cpu(accelerator: object) -> bool:
    """Whether a run with this ``trainer.accelerator`` computes on the CPU."""
    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__.lower()
    return name.startswith("cpu") or (name == "auto" and not torch.cuda.is_available())


def emulated(precision: str, native: bool) -> bool:
    """Whether ``precision`` asks for bf16 that this CPU would emulate (``native``: :func:`native_bf16`)."""
    return str(precision).startswith("bf16") and not native


def float32_where_bf16_is_emulated(config, native: bool) -> list[str]:
    """On a CPU without native bf16, ``trainer.precision`` bf16-* becomes ``32-true`` and a rollout engine's
    ``dtype: bfloat16`` becomes ``float32``, in ``config`` (the parsed CLI namespace, so the saved config.yaml
    holds what ran). Returns the changes, ``key: old -> new``; none on a GPU run, with ``native``, or with
    ``cpu_bf16: keep``."""
    if config.cpu_bf16 == "keep" or native or not on_cpu(config.trainer.accelerator):
        return []
    changes = []
    precision = str(config.trainer.precision)
    if emulated(precision, native):
        config.trainer.precision = "32-true"
        changes.append(f"trainer.precision: {precision} -> 32-true")
    engine = getattr(config.data, "engine", None)
    init_args = getattr(engine, "init_args", None)
    if init_args is not None and getattr(init_args, "dtype", None) == "bfloat16":
        init_args.dtype = "float32"
        changes.append("data.engine.init_args.dtype: bfloat16 -> float32")
    return changes


def warn(changes: list[str]) -> None:
    if changes:
        rank_zero_warn(f"This CPU has no native bf16 (no AVX-512 or AMX): bf16 matmuls would be emulated, hundreds of "
                       f"times slower than float32, so this run uses float32 ({'; '.join(changes)}). Set `cpu_bf16: keep` "
                       "to run bf16 anyway.")
