"""``--isa avx2``: run a benchmark's code paths as an x86 CPU with AVX2 alone would, on a newer CPU.

A CPU with AVX2 alone (no AVX-512, no AMX) takes other paths through every library a step uses: MKL's sgemm, oneDNN
(torch's and vLLM's own copy), ATen's vectorized kernels, vLLM's kernel build (``_C_AVX2``) and attention ISA, and so
the CLI's ``cpu_bf16`` rule, which asks oneDNN. The libraries cap their instruction set from an environment variable
read at first use. torch's CPU-feature queries, which vLLM reads to choose its build, have none, so they are
replaced in the process, before vLLM loads. Clock, cores, caches and memory stay this machine's. The figures show
the AVX2 paths' speeds relative to each other, not what an AVX2 machine would measure.
"""

from __future__ import annotations

import os

CHOICES = ("native", "avx2")

ENV = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
"""MKL's, oneDNN's and ATen's own caps; a child process inherits them."""

QUERIES = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
           "_is_amx_tile_supported", "_is_amx_fp16_supported")
"""``torch.cpu``'s feature queries that vLLM 0.32 reads to pick its kernels (``vllm/platforms/cpu.py``,
``vllm/v1/attention/backends/cpu_attn.py``, ``vllm/model_executor/layers/utils.py``)."""


def limit(isa: str) -> str:
    """Caps this process (and the children it starts) at ``isa``; call it before torch computes anything. Returns
    what the header says, ``""`` for ``native``."""
    if isa == "native":
        return ""
    if isa not in CHOICES:
        raise ValueError(f"--isa {isa!r}: choose one of {', '.join(CHOICES)}")
    os.environ.update(ENV)
    import torch

    for name in QUERIES:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, _no)
    return ("instruction set capped at AVX2 (" + ", ".join(f"{k}={v}" for k, v in ENV.items())
            + ", torch.cpu's AVX-512/AMX queries answer False), on this CPU's clock, caches and memory")


def _no() -> bool:
    return False
