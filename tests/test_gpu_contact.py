"""What a first run on a GPU meets that a CPU run does not: a process group of one, and where metric states live.

A single-GPU run has a torch.distributed group even with one rank (Lightning's ModelParallelStrategy sets up NCCL,
vLLM its own one-process group), and torchmetrics gathers metric states over it. NCCL gathers CUDA tensors only, so
the evaluation metric must sit on the module's device. The CPU test runs the same path over a one-process gloo group
(which gathers CPU tensors, so it guards the single-process CPU path, not the NCCL failure); the GPU test is the
NCCL case as a single-GPU run meets it.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager

import lightning as L
import pytest
import torch
import torch.distributed as dist
from test_callbacks import ForeignRL, eval_view

from evolrl.callbacks import PassAtK

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@contextmanager
def one_process_group(backend: str):
    """A default process group of one rank, as vLLM or an NCCL strategy leaves on a single device."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def validate_with_a_process_group(backend: str, accelerator: str) -> tuple[PassAtK, ForeignRL, dict]:
    callback = PassAtK(extract=eval_view)
    module = ForeignRL()
    trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    with one_process_group(backend):
        trainer.validate(module, verbose=False)
    return callback, module, {name: value.item() for name, value in trainer.callback_metrics.items()}


def check_scores(metrics: dict) -> None:
    # as tests/test_callbacks.py: pass@1 is the mean accuracy of the two problems, each votes right with 4 samples
    assert metrics["val/toy/pass@1"] == pytest.approx(0.5)
    assert metrics["val/toy/maj@4"] == 1.0


def test_evaluation_metrics_sync_over_a_one_process_gloo_group_on_the_cpu():
    callback, module, metrics = validate_with_a_process_group("gloo", "cpu")
    check_scores(metrics)
    assert callback.metrics["toy"].device == module.device == torch.device("cpu")


@pytest.mark.parametrize("backend", [pytest.param("nccl", marks=GPU)])
def test_evaluation_metrics_sync_over_a_one_process_nccl_group_on_a_gpu(backend):
    """The measured first-contact failure: with the states on the CPU, NCCL raised "No backend type associated with
    device type cpu" at the end of the first (sanity) validation of a single-GPU run."""
    callback, module, metrics = validate_with_a_process_group(backend, "gpu")
    check_scores(metrics)
    assert callback.metrics["toy"].device.type == "cuda" == module.device.type
