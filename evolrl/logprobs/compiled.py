"""Regional compilation: every decoder block's forward through ``torch.compile`` (``Batching.compile_blocks``).

A block is compiled, not the model: the blocks share one code object, so one trace serves every layer (and the
reference's), and the trace stays small. What is inside a block's graph (the norms, rotary embedding, SwiGLU, the
casts autocast inserts, the residual adds) becomes a few fused kernels in place of dozens of operator calls, forward
and backward; the matmuls stay library calls. Non-obvious decisions:

* The block's ``forward`` is replaced on the instance, not ``__call__``: the hooks around it (FSDP2's all-gather and
  reduce-scatter, gradient checkpointing's recomputation, which calls the block again) run outside the graph as they
  do uncompiled, and the state dict keeps its keys. Where transformers checkpoints inside ``forward`` (a wrapper on
  the layer class, in recent transformers releases) the compiled function is the layer's own ``forward`` beneath it, and the instance's
  ``forward`` checkpoints around it as the wrapper did (:func:`own_forward`); traced whole, the checkpoint with the
  attention's graph break inside would have run every training pass's blocks uncompiled.
* ``dynamic=True``: a packed pass has a new row length every time; one trace with a symbolic length serves them all.
* A block is traced again for each way a run calls it (grad mode on or off, the policy's float32 or the reference's
  bf16 weights, an input that requires grad or not, the first fixed then the symbolic lengths; each piece around a
  graph break too): about ten traces, more than dynamo's default limit of 8 per function, so
  :func:`compile_blocks` raises that limit to :data:`TRACES`; beyond it dynamo falls back to the uncompiled block.
* The packed row's attention (``sequencewise_attention``, one sdpa call per sequence) is left out of the graph (a
  graph break): traced, it would be specialised on the tuple of sequence lengths and traced again for every pass.
* Under FSDP2 a block's submodules are "FSDP-managed", and dynamo by default skips guards on such modules
  (``skip_fsdp_guards``) and so traces their integer attributes as symbols: the attention's ``head_dim`` became a
  symbol and the head count ``2048 // head_dim`` (the 1.7B shape), which FlexAttention's lowering in inductor cannot take, and which keeps the kernels from knowing the head width. Each compiled forward runs with those guards on
  (:data:`GUARDED`): dynamo then treats the attributes as a plain module's, constants behind a guard, as without
  FSDP2 (``tests/test_compiled.py`` reads the graphs; the same graph count either way).
* Projections of the same input become one matmul (:func:`fuse_shared_input_linears`, a graph pass run before
  autograd's graph is made): q, k and v, gate and up. Their weights are concatenated inside the graph on every call
  (the parameters, their names and their sharding stay as they are), so the forward, the recomputation and both
  matmuls of the backward run once per group instead of once per projection.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from functools import partial
from types import MethodType

import torch
from torch import fx, nn
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from evolrl.settings import require

TRACES = 64
"""The most traces of one function (``torch._dynamo.config.recompile_limit``) once blocks are compiled."""


def compile_blocks(model: nn.Module) -> nn.Module:
    """``model`` with each of its decoder blocks (``model.model.layers``) running a compiled forward, and its final
    norm and rotary embedding (``model.model.norm``, ``model.model.rotary_emb``, where it has them): a few operators
    each, once per pass, that would otherwise run eagerly. The forward is an attribute of the module: a deep copy of
    the model would call the original's modules, so copy before."""
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__}: no `model.layers` to compile; Batching.compile_blocks expects a "
                         "decoder LM")
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, TRACES)
    for block in blocks:
        forward, checkpointed = own_forward(block)
        compiled = GUARDED(torch.compile(MethodType(forward, block), dynamic=True,
                                         options={"pre_grad_custom_pass": FUSE}))
        block.forward = partial(_checkpointing, block, compiled) if checkpointed else compiled
    for name in ("norm", "rotary_emb"):  # the final norm, and the rotary tables every block reads: once per pass
        module = getattr(model.model, name, None)
        if isinstance(module, nn.Module):
            module.forward = GUARDED(torch.compile(module.forward, dynamic=True))
    return model


CHECKPOINTING = "forward_with_checkpointing"
"""The code name of the wrapper recent transformers releases put around a layer class's ``forward`` to checkpoint it
(``GradientCheckpointingLayer``; older ones checkpoint in ``__call__``, outside ``forward``)."""


def own_forward(block: nn.Module) -> tuple:
    """The block class's ``forward`` beneath transformers' checkpointing wrappers (one per class in its lineage, FSDP2's
    ``FSDP<Layer>`` included), and whether there was one: the wrapper stays outside the compiled graph (a checkpoint
    traced with the attention's graph break inside it would run the whole block eagerly)."""
    forward, wrapped = type(block).forward, False
    while getattr(getattr(forward, "__code__", None), "co_name", None) == CHECKPOINTING:
        forward, wrapped = forward.__wrapped__, True
    return forward, wrapped


def _checkpointing(block: nn.Module, compiled, *args, **kwargs):
    """What transformers' wrapper does around ``forward``, around the compiled one: checkpoint it when the block is set
    to (``gradient_checkpointing``), training and gradients are on; the tensors positional, as the wrapper passes them."""
    if block.gradient_checkpointing and block.training and torch.is_grad_enabled():
        if kwargs.get("use_cache"):  # as the wrapper: a cache written twice (pass and recomputation) would be wrong
            kwargs["use_cache"] = False
        return block._gradient_checkpointing_func(partial(compiled, **kwargs), *args)
    return compiled(*args, **kwargs)


GUARDED = torch._dynamo.config.patch(skip_fsdp_guards=False)
"""Around each compiled forward: dynamo guards FSDP-managed modules as plain ones while it traces (module docstring)."""


LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)


class FuseSharedInputLinears(CustomGraphPass):
    """:func:`fuse_shared_input_linears` as inductor's pre-grad pass; its ``uuid`` (this file's hash) lets inductor
    cache the graphs it built."""

    def __call__(self, graph: fx.Graph) -> None:
        fuse_shared_input_linears(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


FUSE = FuseSharedInputLinears()
"""The one instance every block's compile gets: dynamo reuses a block's graphs for the next block only if their
compile options are equal, and two instances of a pass are not, so per-block instances would trace every layer anew
(and run past :data:`TRACES` into uncompiled blocks)."""


def fuse_shared_input_linears(graph: fx.Graph) -> None:
    """Rewrite each group of ``linear(x, w_i[, b_i])`` calls on one input ``x`` (weights and biases graph inputs of
    one dtype) as one ``linear(x, cat(w_i)[, cat(b_i)])`` split back into the group's outputs: the same dot
    products, one matmul. Under autocast the concatenated weight is cast once, as each weight was."""
    groups: dict[tuple, list[fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in LINEAR or node.kwargs:
            continue
        x, weight, bias = (*node.args, None)[:3]
        written = any(str(getattr(user.target, "__name__", user.target)).endswith("_") for user in node.users)
        if _is_input(weight, dims=2) and (bias is None or _is_input(bias, dims=1)) and not written:
            groups[(x, bias is None, weight.meta["example_value"].dtype)].append(node)
    for (x, no_bias, _), nodes in groups.items():
        if len(nodes) < 2:
            continue
        weights = [node.args[1] for node in nodes]
        sizes = [int(w.meta["example_value"].shape[0]) for w in weights]
        with graph.inserting_before(nodes[0]):
            weight = graph.call_function(torch.cat, (weights,), {"dim": 0})
            bias = None if no_bias else graph.call_function(torch.cat, ([node.args[2] for node in nodes],), {"dim": 0})
            parts = graph.call_function(torch.split, (graph.call_function(torch._C._nn.linear, (x, weight, bias)),
                                                      sizes), {"dim": -1})
            for i, node in enumerate(nodes):
                part = graph.call_function(operator.getitem, (parts, i))
                part.meta.update(node.meta)
                node.replace_all_uses_with(part)
        for node in nodes:
            graph.erase_node(node)


def _is_input(node, dims: int) -> bool:
    """A graph input (a parameter) of ``dims`` dimensions and a fixed shape: it can be concatenated up front."""
    if not isinstance(node, fx.Node) or node.op not in ("placeholder", "get_attr"):
        return False
    value = node.meta.get("example_value")
    return isinstance(value, torch.Tensor) and value.dim() == dims and all(isinstance(d, int) for d in value.shape)


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
