"""Regional compilation: every decoder block's forward through ``torch.compile`` (``Batching.compile_blocks``).

A block is compiled, not the model: the blocks share one code object, so one trace serves every layer (and the
reference's), and the trace stays small. What is inside a block's graph (the norms, rotary embedding, SwiGLU, the
casts autocast inserts, the residual adds) becomes a few fused kernels in place of dozens of operator calls, forward
and backward; the matmuls stay library calls. Non-obvious decisions:

* The block's ``forward`` is replaced on the instance, not ``__call__``: the hooks around it (FSDP2's all-gather and
  reduce-scatter, gradient checkpointing's recomputation, which calls the block again) run outside the graph as they
  do uncompiled, and the state dict keeps its keys.
* ``dynamic=True``: a packed pass has a new row length every time; one trace with a symbolic length serves them all.
* A block is traced again for each way a run calls it (grad mode on or off, the policy's float32 or the reference's
  bf16 weights, an input that requires grad or not, the first fixed then the symbolic lengths; each piece around a
  graph break too): about ten traces, more than dynamo's default limit of 8 per function, so
  :func:`compile_blocks` raises that limit to :data:`TRACES`; beyond it dynamo falls back to the uncompiled block.
* The packed row's attention (``sequencewise_attention``, one sdpa call per sequence) is left out of the graph (a
  graph break): traced, it would be specialised on the tuple of sequence lengths and traced again for every pass.
"""

from __future__ import annotations

import torch
from torch import nn

from evolrl.settings import require

TRACES = 64
"""The most traces of one function (``torch._dynamo.config.recompile_limit``) once blocks are compiled."""


def compile_blocks(model: nn.Module) -> nn.Module:
    """``model`` with each of its decoder blocks (``model.model.layers``) running a compiled forward. The forward is
    an attribute of the block: a deep copy of the model would call the original's blocks, so copy before."""
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__}: no `model.layers` to compile; Batching.compile_blocks expects a "
                         "decoder LM")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, TRACES)
    for block in blocks:
        block.forward = torch.compile(block.forward, dynamic=True)
    return model


def check_compiler(device: torch.device, key: str = "Batching.compile_blocks") -> None:
    """Raise :class:`~evolrl.settings.SettingError` at start unless ``torch.compile`` can build kernels for ``device``:
    a C++ compiler on a CPU (``torch._inductor.config.cpp.cxx``), Triton on a GPU. Otherwise the first pass would
    fail deep inside a training step."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        require(has_triton(), key, True, allowed="false on a GPU without Triton (torch.compile builds its kernels with "
                "it; install the triton package that matches torch)")
        return
    from torch._inductor import config
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        get_cpp_compiler()
    except InvalidCxxCompiler:
        require(False, key, True, allowed=f"false on a CPU without a C++ compiler (torch.compile builds its kernels with "
                f"one; none of {config.cpp.cxx} runs: install g++ or set $CXX)")
