"""One attention call per packed row: torch's varlen attention op, with CPU kernels of the project's.

``torch.nn.attention.varlen.varlen_attn`` (torch 2.10 and later) attends each sequence of a packed row to itself in
one call of the flash kernels that ship with torch, from the row's cumulative lengths ``cu_seqlens``. It is a custom op
(``torch_attn::_varlen_attn``, its backward ``torch_attn::_varlen_attn_backward``), so ``torch.compile`` traces a
block that calls it whole, where the per-sequence loop it replaces breaks the graph. The op has no CPU kernel: this
module registers one for each (:func:`install`), the loop of per-sequence sdpa calls the packed path used before, so
that CPU and GPU run the same code and the CPU tests exercise it. Both kernels call, sequence by sequence, the flash
kernels sdpa itself runs on a CPU (forward and backward, the forward's log-sum-exp ``[H, T]`` saved for the backward as
on a GPU), so the numbers are the per-sequence path's, bit for bit. Grouped key/value heads (GQA) go to those kernels
as they are where the kernels take them (:func:`native_gqa`: no copy of the keys and values per head, and the
backward sums a group's gradients inside the kernel), else repeated once per row.

Where torch has no varlen op, or the op no kernel for the row (:func:`runs`), the packed path keeps its per-sequence
loop.
"""

from __future__ import annotations

import functools
import inspect
import itertools

import torch
from torch import Tensor

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # torch before 2.10
    varlen_attn = None

CAUSAL = (-1, 0)
"""``varlen_attn``'s ``window_size`` for causal attention (2.13 has no ``is_causal``)."""


def available() -> bool:
    """Whether this torch has the varlen op (its CPU kernels then come from :func:`install`)."""
    return varlen_attn is not None


def runs(query: Tensor) -> bool:
    """Whether the op has a kernel for this row: any dtype on a CPU (:func:`install`'s), half precision on CUDA
    (torch's flash kernels take only float16 and bfloat16: a float32 run on a GPU keeps the per-sequence loop)."""
    kind = query.device.type
    return available() and (kind == "cpu" or kind == "cuda" and query.dtype in (torch.float16, torch.bfloat16))


def attend(query: Tensor, key: Tensor, value: Tensor, cu_seqlens: Tensor, max_len: int, scale: float) -> Tensor:
    """Causal attention of each sequence of a packed row with itself: ``query [T, H, D]``, ``key``/``value``
    ``[T, Hkv, D]`` (``Hkv`` divides ``H``), ``cu_seqlens [N + 1]`` int32 on their device; returns ``[T, H, D]``."""
    gqa = {"enable_gqa": query.shape[1] != key.shape[1]} if _takes_gqa_keyword() else {}
    return varlen_attn(query, key, value, cu_seqlens, cu_seqlens, max_len, max_len, scale=scale,
                       window_size=CAUSAL, **gqa)


@functools.cache
def _takes_gqa_keyword() -> bool:
    """Whether this torch's op has ``enable_gqa`` (2.13's has; 2.11's has not, and its flash kernels take fewer
    key/value heads as they are: the GPU script's versions section checks that against the per-sequence path)."""
    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def _sequences(cu_seq: Tensor) -> list[tuple[int, int]]:
    return list(itertools.pairwise(cu_seq.tolist()))


def _check(cu_seq_q: Tensor, cu_seq_k: Tensor | None, window_size: list[int] | None, is_causal: bool,
           **unsupported: object) -> None:
    if any(value is not None for value in unsupported.values()):
        raise NotImplementedError(f"the CPU varlen kernel does not take {', '.join(unsupported)}")
    if cu_seq_k is not None and not torch.equal(cu_seq_k, cu_seq_q):
        raise NotImplementedError("the CPU varlen kernel attends each sequence to itself (cu_seq_k == cu_seq_q)")
    if list(window_size or (-1, -1)) not in ([-1, -1], [-1, 0]):
        raise NotImplementedError(f"the CPU varlen kernel has no sliding window ({window_size})")


def _rows(x: Tensor, start: int, end: int) -> Tensor:
    """One sequence of a ``[T, H, D]`` tensor as sdpa's ``[1, H, s, D]`` (a view)."""
    return x[start:end].transpose(0, 1)[None]


def _repeated(x: Tensor, groups: int) -> Tensor:
    """Each key/value head repeated for its group of query heads (GQA), once for the whole row, where the CPU flash
    kernels do not take grouped heads (:func:`native_gqa`)."""
    return x.repeat_interleave(groups, 1) if groups > 1 and not native_gqa() else x


def _joined(parts: list[Tensor]) -> Tensor:
    """Per-sequence ``[1, H, s, D]`` results as one ``[T, H, D]`` tensor: one copy for the row."""
    return torch.cat([part[0].transpose(0, 1) for part in parts])


_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


@functools.cache
def native_gqa() -> bool:
    """Whether this torch's CPU flash kernels attend two query heads to one key/value head and return that head's
    summed gradient (torch 2.13's do): tried on a tiny causal sequence against the heads repeated, once, at the CPU
    kernels' first call rather than at import."""
    q, k, v = (torch.linspace(-1, 1, heads * 3 * 4, dtype=torch.float64).reshape(1, heads, 3, 4).sin() * (i + 1)
               for i, heads in enumerate((2, 1, 1)))
    try:
        out, lse = _FORWARD(q, k, v, 0.0, True)
        _, dk, dv = _BACKWARD(out, q, k, v, out, lse, 0.0, True)
    except RuntimeError:
        return False
    wide = [x.expand(1, 2, 3, 4) for x in (k, v)]
    out_wide, lse_wide = _FORWARD(q, *wide, 0.0, True)
    _, dk_wide, dv_wide = _BACKWARD(out_wide, q, *wide, out_wide, lse_wide, 0.0, True)
    return (dk.shape == k.shape and torch.allclose(out, out_wide) and torch.allclose(dk, dk_wide.sum(1, True))
            and torch.allclose(dv, dv_wide.sum(1, True)))


def _varlen_cpu(query: Tensor, key: Tensor, value: Tensor, cu_seq_q: Tensor, cu_seq_k: Tensor | None, max_q: int,
                max_k: int, is_causal: bool = False, scale: float | None = None, window_size: list[int] | None = None,
                enable_gqa: bool = False, seqused_k: Tensor | None = None, block_table: Tensor | None = None,
                num_splits: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The forward on a CPU: per sequence, the flash kernel sdpa runs on a CPU (the per-sequence path's numbers, bit
    for bit), which also returns the log-sum-exp (float32; float64 for float64 inputs, as that kernel returns it)."""
    _check(cu_seq_q, cu_seq_k, window_size, is_causal, seqused_k=seqused_k, block_table=block_table,
           num_splits=num_splits)
    causal = is_causal or list(window_size or ()) == [-1, 0]
    groups = query.shape[1] // key.shape[1]
    key, value = _repeated(key, groups), _repeated(value, groups)
    outs, lses = [], []
    for start, end in _sequences(cu_seq_q):
        out, lse = _FORWARD(*(_rows(x, start, end) for x in (query, key, value)), 0.0, causal, scale=scale)
        outs.append(out)
        lses.append(lse[0])
    return _joined(outs), torch.cat(lses, dim=1), torch.zeros(2, dtype=torch.uint64)


def _varlen_backward_cpu(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor, lse: Tensor,
                         cu_seq_q: Tensor, cu_seq_k: Tensor, max_q: int, max_k: int, is_causal: bool,
                         rng_state: Tensor, scale: float | None = None,
                         window_size: list[int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The backward on a CPU: per sequence, the CPU flash kernel's backward from the saved log-sum-exp; a key/value
    head shared by a group of query heads (GQA) sums the group's gradients, in float32."""
    _check(cu_seq_q, cu_seq_k, window_size, is_causal)
    causal = is_causal or list(window_size or ()) == [-1, 0]
    kv_heads = key.shape[1]
    groups = query.shape[1] // kv_heads
    rows = (grad_out, query, _repeated(key, groups), _repeated(value, groups), out)
    grads: tuple[list[Tensor], list[Tensor], list[Tensor]] = ([], [], [])
    for start, end in _sequences(cu_seq_q):
        parts = _BACKWARD(*(_rows(x, start, end) for x in rows), lse[None, :, start:end], 0.0, causal, scale=scale)
        for total, part in zip(grads, parts):
            total.append(part)
    dq, dk, dv = (_joined(parts) for parts in grads)
    if groups > 1 and not native_gqa():
        dk, dv = (g.unflatten(1, (kv_heads, groups)).sum(2, dtype=torch.float32).to(key.dtype) for g in (dk, dv))
    return dq, dk, dv


def install() -> None:
    """Register the CPU kernels of torch's varlen ops (once; nothing where torch has no such op)."""
    if not available() or getattr(install, "done", False):
        return
    torch.library.register_kernel("torch_attn::_varlen_attn", "cpu", _varlen_cpu)
    torch.library.register_kernel("torch_attn::_varlen_attn_backward", "cpu", _varlen_backward_cpu)
    install.done = True


install()
