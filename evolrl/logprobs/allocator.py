"""The CPU allocator: keep freed buffers for reuse instead of handing every large tensor back to the OS.

glibc's ``malloc`` serves any allocation above its mmap threshold (at most 32 MiB by default) with a fresh ``mmap``
and unmaps it on ``free``. A CPU training step allocates and frees such buffers all the time (the vocabulary-sized
log-softmax chunks, bf16 copies of the LM head, weight gradients), so each one is page-faulted in again, a page at a
time: at the demo's settings about a quarter of the update went to that. Raising the mmap and trim thresholds to
1 GiB keeps freed blocks in the heap, where the next allocation of that size reuses them (``tools.bench.bench_update
--demo`` measures the update both ways). Peak RSS stays the same there, because the step's peak is reached with those
buffers live anyway; freed memory below the trim threshold is kept, not returned to the OS, between steps.

Process-wide, glibc only (elsewhere nothing changes); ``EvolRLModule(cpu_keep_freed_memory=...)`` applies it when
training on a CPU. On a GPU the tensors live in PyTorch's caching allocator and this does not matter.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30
"""1 GiB: larger than any buffer of a CPU-sized step; ``mallopt`` takes a C int."""


def keep_freed_memory(threshold: int = THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds to ``threshold`` bytes; ``False`` where there is no glibc ``mallopt``."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, threshold))
