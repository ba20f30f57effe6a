"""Where one update's time goes, for ``tools.bench.bench_update``: model shapes by name, and a profile of one update on
a GPU.

On a GPU (``cuda_profile``): torch.profiler's CUDA activity over one update gives the kernels that ran, when, and the
launches the CPU made (``LAUNCHES``), and where the GPU idled (``idle_by_cpu``). The **GPU-busy fraction** is the time
covered by at least one kernel (overlaps counted once) over the update's wall time measured *without* the profiler
(the profiler slows the CPU side that launches kernels, hardly the kernels themselves), capped at 1. Shapes
(``QWEN3``): the published Qwen3 configs' decoder shapes, random weights (``write_random_model``), no download.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from tools.commands.gpu_budget import QWEN3, QWEN3_COMMON, Update, fitting_every, from_config, update_gib
from tools.common import matmul_peak

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
"""The CPU-side calls that start work on the GPU (a CUDA graph's launch counts once)."""

DENSE_BF16_TFLOPS = {"H200": 989, "H100 PCIe": 756, "H100 NVL": 835, "H100": 989, "A100": 312, "L40S": 362,
                     "L40": 181, "L4": 121}
"""Published dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, by a part of the device's name (first match, so
the longer names come first); another card's peak is measured."""


def write_random_model(shape: str, directory: Path, device: str = "cpu") -> Path:
    """A Qwen3 of the named shape with random weights (``gpu_check``'s ``runs.random_qwen3``), saved in bfloat16 to
    ``directory`` once (an existing one is reused)."""
    from tools.commands.gpu_check.runs import random_qwen3

    if shape not in QWEN3:
        raise SystemExit(f"unknown shape {shape!r}: one of {', '.join(QWEN3)}")
    fields = {**QWEN3_COMMON, **QWEN3[shape]}
    return random_qwen3(directory, fields, vocab=fields.pop("vocab_size"), device=device)


def covered(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def kernel_summary(kernels: list[tuple[str, float, float]], launches: int, wall_s: float, top: int) -> dict:
    """From kernels ``(name, start_us, end_us)`` and the launch count: the busy fraction of ``wall_s`` (capped at 1),
    the launches, the kernels, and the ``top`` kernels by total time ``[(name, calls, seconds, share of busy)]``."""
    busy = covered((start, end) for _, start, end in kernels) / 1e6
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for name, start, end in kernels:
        totals[name][0] += 1
        totals[name][1] += (end - start) / 1e6
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return {"busy_s": busy, "busy_fraction": min(1.0, busy / wall_s), "launches": launches, "kernels": len(kernels),
            "top": [(name, calls, seconds, seconds / busy if busy else 0.0) for name, (calls, seconds) in ranked]}


def cuda_profile(run: Callable[[], None], wall_s: float, top: int) -> dict:
    """``run()`` (one update) under torch.profiler with CUDA activity: ``kernel_summary`` of what it launched, against
    ``wall_s``, the same update's time without the profiler, and under ``"idle"`` where the GPU waited
    (:func:`idle_by_cpu`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in events  # not the GPU-side spans of
               if e.device_type == DeviceType.CUDA and not e.is_user_annotation]  # record_function ranges
    launches = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name in LAUNCHES)
    summary = kernel_summary(kernels, launches=launches, wall_s=wall_s, top=top)
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    summary["idle"] = idle_by_cpu([(start, end) for _, start, end in kernels], cpu, top=top)
    return summary


NO_OPERATOR = "(no operator: Python between operators)"


def idle_by_cpu(kernels: list[tuple[float, float]], cpu: list, top: int) -> dict[str, list[tuple[str, float]]]:
    """Where the GPU waits on the CPU: every gap between kernels (``(start_us, end_us)``, overlaps merged) in the span
    of the CPU events ``cpu`` (profiler events: ``name``, ``time_range``, ``cpu_parent``), charged to the innermost
    CPU event running at the gap's middle (of any thread: the one that began last), by its name
    (``"operator"``) and by :func:`call_place` (``"place"``), ``top`` of each as ``[(label, seconds)]``, most first;
    a gap no event covers is charged to :data:`NO_OPERATOR`. Profiled, the CPU side runs slower than it does
    unprofiled, so the seconds are shares of a slowed CPU side, to rank, not to add up to the update's idle time."""
    if not cpu:
        return {"operator": [], "place": []}
    first, last = min(e.time_range.start for e in cpu), max(e.time_range.end for e in cpu)
    gaps, reach = [], first
    for start, end in sorted(kernels):
        if start > reach:
            gaps.append((reach, start))
        reach = max(reach, end)
    if last > reach:
        gaps.append((reach, last))
    spans = sorted(cpu, key=lambda e: (e.time_range.start, -e.time_range.end))  # a parent before a child it starts with
    operator: dict[str, float] = defaultdict(float)
    place: dict[str, float] = defaultdict(float)
    open_, i = [], 0  # events begun before the current middle, in the order they began
    for start, end in gaps:  # gaps in time order: an event that ended before one middle ended before the next
        middle = (start + end) / 2
        while i < len(spans) and spans[i].time_range.start <= middle:
            open_.append(spans[i])
            i += 1
        while open_ and open_[-1].time_range.end < middle:
            open_.pop()
        inner = open_[-1] if open_ else None
        seconds = (end - start) / 1e6
        operator[inner.name if inner else NO_OPERATOR] += seconds
        place[call_place(inner) if inner else NO_OPERATOR] += seconds

    def ranked(totals):
        return sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return {"operator": ranked(operator), "place": ranked(place)}


COMPILED_GRAPH, COMPILED_REGION, BACKWARD = "## Call CompiledFxGraph", "Torch-Compiled Region", \
    "autograd::engine::evaluate_function: "
"""Profiler events that enclose a call: a graph torch.compile built, a compiled function's frame (where its graph
breaks run eagerly), and the autograd engine running one node's backward."""


def call_place(event) -> str:
    """Where a kernel call ran, from ``event`` or the nearest event enclosing it that says: inside a compiled graph;
    inside a compiled function but outside its graphs (a graph break); in the backward of an autograd node (named, e.g.
    the gradient accumulation into ``.grad`` or an eager operator's backward); inside a named region (a custom autograd
    function's forward, the optimizer step); else among the eager operators of the update's own code."""
    while event is not None:
        name = event.name
        if name.startswith(COMPILED_GRAPH):
            return "compiled graphs"
        if name.startswith(COMPILED_REGION):
            return "compiled functions, outside their graphs"
        if name.startswith(BACKWARD) or re.search(r"Backward\d*$", name):
            return "backward of " + name.removeprefix(BACKWARD)
        if "::" not in name and not name.startswith("## ") and not re.match(r"cuda?[A-Z]", name):  # not a runtime call
            return name
        event = event.cpu_parent
    return "eager operators"


def summary_lines(profiled: dict, top: int) -> list[str]:
    """The GPU profile as printed: one line of figures, then the top kernels as a table."""
    figures = (f"GPU busy {profiled['busy_fraction']:.2f} of the update ({profiled['busy_s']:.2f} s of kernels), "
               f"{profiled['launches']} kernel launches, {profiled['kernels']} kernels")
    lines = [figures, "", "| kernel | calls | s | of the busy time |", "| --- | --- | --- | --- |"]
    for name, calls, seconds, share in profiled["top"][:top]:
        lines.append(f"| {name[:90]} | {calls} | {seconds:.3f} | {share:.1%} |")
    for key, what in (("operator", "innermost CPU event"), ("place", "where it ran")):
        lines += ["", f"| GPU idle while the CPU ran: {what} | idle s (profiled) |", "| --- | --- |"]
        lines += [f"| {label[:90]} | {seconds:.3f} |" for label, seconds in profiled.get("idle", {}).get(key, [])]
    return lines


def card_peak(device: torch.device) -> tuple[float, str]:
    """``(FLOP/s, where from)``: the card's published dense bf16 peak, else a measured bf16 matmul's rate."""
    name = torch.cuda.get_device_name(device)
    for part, tflops in DENSE_BF16_TFLOPS.items():
        if part in name:
            return tflops * 1e12, f"{name}: {tflops} TFLOP/s dense bf16, published"
    rate = matmul_peak("bfloat16", 8192, repeats=10, device=device)
    return rate, f"{name}: not in the table, measured 8192^3 bf16 matmul {rate / 1e12:.0f} TFLOP/s"


def estimated_update_gib(model_dir: Path, plan: list[list[int]], adamw: bool = True, checkpoint_every: int = 1,
                         chunk: int = 1024, compiled: bool = False, fit_gib: float = 0.0) -> float | int | None:
    """``tools.commands.gpu_budget``'s update-time estimate for ``bench_update``'s build on one GPU (FSDP2 over a
    one-process mesh, gathered copies held) and ``plan`` (each mini-batch's pass tokens); ``adamw=False``: an
    optimizer without state, as its ``--sgd``; ``checkpoint_every`` 0: no checkpointing. With ``fit_gib``: instead
    the checkpointing that fits that many GiB (``gpu_budget.fitting_every``)."""
    shape, update = from_config(str(model_dir / "config.json")), Update(
        1, "held", plan=tuple(tuple(passes) for passes in plan), every=checkpoint_every, compiled=compiled,
        chunk=chunk, adamw=adamw)
    return fitting_every(shape, update, fit_gib) if fit_gib else update_gib(shape, update)