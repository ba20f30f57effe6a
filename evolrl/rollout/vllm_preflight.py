"""Before ``vllm.LLM(...)``: the common reasons a start fails, checked on every rank, and agreed on.

On several ranks each engine joins the trainer's process group (``external_launcher``), and inside ``LLM(...)`` the
ranks meet in vLLM's own collectives. A rank whose start raises there leaves the others waiting in one of them until
the process group's timeout (an hour in the paper configs): ``ranks.fail_together`` only helps once every rank is
back from the call. So the causes that can be seen from outside are checked first, on every rank, and turned into one
error on all of them (``fail_together``), before any rank enters ``LLM(...)``:

* the installed vLLM is the release the engine supports (:func:`~evolrl.rollout.vllm_setup.check_vllm_version`), and
  every rank runs the same one;
* the configuration vLLM will read (written from the policy's) loads, and vLLM knows its architecture;
* on a GPU, the device's free memory covers ``gpu_memory_utilization`` of it, which vLLM requires at start (what
  the trainer already holds there, and any other process's memory, count against it).

What still hangs (until the timeout): a failure inside ``LLM(...)`` after these checks on some ranks only, e.g. an
out-of-memory error while vLLM profiles or captures CUDA graphs on a rank whose free memory fell in between, a
rank killed by the kernel's OOM killer, an NCCL or compile error on one node.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
from torch import nn

from evolrl.rollout.ranks import RankFailed, several_ranks
from evolrl.rollout.vllm_setup import import_llm


def write_config(policy: nn.Module, config_dir: str) -> None:
    """The policy's configuration and generation settings, written where vLLM reads them (no weights: those are
    streamed from the policy). A model loaded from a GGUF file has no ``architectures``; the causal-LM class
    transformers maps its ``model_type`` to is named then (left out, vLLM would pick the headless base model)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = policy.config
    if not config.architectures and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        config = copy.deepcopy(config)
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.save_pretrained(config_dir)
    policy.generation_config.save_pretrained(config_dir)


def preflight(config_dir: str, gpu_memory_utilization: float) -> str:
    """Raise (ImportError, ValueError) naming the fix for what would fail vLLM's start; else the vLLM version."""
    import_llm()  # the supported release, or an ImportError with the pip command
    import vllm
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(config_dir)
    except Exception as err:
        raise ValueError(f"vLLM could not read the policy's configuration written to {config_dir}: {err}") from err
    from vllm.model_executor.models import ModelRegistry

    unknown = [arch for arch in config.architectures or [] if arch not in ModelRegistry.get_supported_archs()]
    if unknown or not config.architectures:
        raise ValueError(f"vLLM {vllm.__version__} has no model class for the policy's architecture "
                         f"{config.architectures}: use the Hugging Face engine (data.engine.class_path: "
                         "evolrl.rollout.HFEngine) or a vLLM release that supports it")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the trainer's cached but unused blocks are free for vLLM
        free, total = torch.cuda.mem_get_info()
        wanted = math.ceil(total * gpu_memory_utilization)
        if free < wanted:
            raise ValueError(
                f"VLLMEngine.gpu_memory_utilization={gpu_memory_utilization} asks vLLM for {wanted / 2**30:.1f} GiB "
                f"of cuda:{torch.cuda.current_device()}, but only {free / 2**30:.1f} of its {total / 2**30:.1f} GiB "
                f"are free now (the trainer's models and any other process count against it): lower "
                f"gpu_memory_utilization to at most {math.floor(100 * free / total) / 100:.2f}, or free the device")
    return vllm.__version__


def same_on_every_rank(what: str, value: str) -> None:
    """On several ranks, a :class:`RankFailed` on every rank unless all have the same ``value`` (a collective)."""
    if not several_ranks():
        return
    values: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    if len(set(values)) > 1:
        found = ", ".join(f"rank {rank}: {v}" for rank, v in enumerate(values))
        raise RankFailed(f"the ranks disagree on the {what} ({found}); install the same one everywhere")
