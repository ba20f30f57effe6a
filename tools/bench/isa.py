"""``--isa avx2``: a benchmark's code paths as on an x86 CPU with AVX2 alone (no AVX-512, no AMX), on a newer CPU.

MKL, oneDNN (torch's and vLLM's) and ATen, hence the CLI's ``cpu_bf16`` check, cap their instruction set from an
environment variable; torch's CPU-feature queries, which vLLM reads to pick ``_C_AVX2`` and its attention, answer False.
Clock, caches and memory stay this CPU's: the figures rank the AVX2 paths, they are not an AVX2 machine's seconds.
"""

from __future__ import annotations

import os

CHOICES = ("native", "avx2")
ENV = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
QUERIES = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
           "_is_amx_tile_supported", "_is_amx_fp16_supported")
"""``torch.cpu``'s queries that vLLM 0.32 reads (``vllm/platforms/cpu.py``, ``v1/attention/backends/cpu_attn.py``)."""


def limit(isa: str) -> str:
    """Caps this process and the children it starts at ``isa``, before torch computes anything; returns what the
    header says (``""`` for ``native``)."""
    if isa == "native":
        return ""
    os.environ.update(ENV)
    import torch

    for name in QUERIES:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)
    return ("instruction set capped at AVX2 (" + ", ".join(f"{k}={v}" for k, v in ENV.items())
            + ", torch.cpu's AVX-512/AMX queries answer False) on this CPU's clock, caches and memory")
