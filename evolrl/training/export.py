"""Turn a training checkpoint into a Hugging Face model directory (safetensors + tokenizer).

The directory loads with ``AutoModelForCausalLM.from_pretrained`` and with vLLM, like any Hub model:

    python -m evolrl export runs/demo/checkpoints/last.ckpt exported/

A LoRA run's checkpoint (adapters only) is merged into its base; ``--adapter-dir DIR`` also writes the adapter alone
in peft's format (``peft.PeftModel.from_pretrained(base, DIR)``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from lightning.fabric.utilities.load import _METADATA_FILENAME, _load_distributed_checkpoint
from transformers import AutoModelForCausalLM

from evolrl.lora import LoRA, add_adapters, merged_tensors, save_adapter, with_base
from evolrl.models import load_policy, load_tokenizer, model_config


def load_full_checkpoint(checkpoint: str) -> dict:
    """A checkpoint file, or a sharded checkpoint directory gathered into one, as a dict of full tensors."""
    path = Path(checkpoint)
    if path.is_dir():
        if not (path / _METADATA_FILENAME).is_file():
            raise FileNotFoundError(f"{checkpoint!r} is a directory but not a sharded checkpoint (no {_METADATA_FILENAME})")
        return _load_distributed_checkpoint(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint!r} does not exist")
    return torch.load(path, map_location="cpu", weights_only=True)


def export_checkpoint(checkpoint: str, out_dir: str, model: str | None = None, dtype: str = "bfloat16",
                      adapter_dir: str | None = None) -> Path:
    """Write the policy of a Lightning ``checkpoint`` to ``out_dir``; a LoRA run's (adapters only) merged into its base.

    Args:
        checkpoint: A ``.ckpt`` file written by ``python -m evolrl fit``, or the directory a run on several
            devices writes (ModelParallelStrategy's sharded checkpoint: one shard per rank + ``meta.pt``).
        out_dir: Target directory (created).
        model: The base model string, for the architecture and tokenizer; default: the one the
            checkpoint was trained from (its ``model`` hyperparameter).
        dtype: Dtype of the saved weights.
        adapter_dir: For a LoRA checkpoint, also write its adapters alone there, in peft's format.
    """
    ckpt = load_full_checkpoint(checkpoint)
    model = model or ckpt.get("hyper_parameters", {}).get("model")
    if not model:
        raise ValueError(f"{checkpoint}: no `model` hyperparameter; pass the base model explicitly")
    state = {k.removeprefix("policy."): v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")}
    if not state:
        raise ValueError(f"{checkpoint}: no policy weights (keys starting with 'policy.') in its state_dict")
    settings = ckpt.get("hyper_parameters", {}).get("lora")
    if adapter_dir is not None and not settings:
        raise ValueError(f"{checkpoint}: not a LoRA run's checkpoint, so it has no adapters to write to {adapter_dir}")
    if settings:  # adapters only: onto the base the model string names, then merged
        adapted = add_adapters(load_policy(model), LoRA(**settings))
        state = with_base(state, adapted.state_dict())
        _load(adapted, state, checkpoint, model)
        if adapter_dir is not None:
            save_adapter(adapted, LoRA(**settings), adapter_dir, base=model)
        state = dict(merged_tensors(adapted))
    policy = AutoModelForCausalLM.from_config(model_config(model), dtype=getattr(torch, dtype))
    _load(policy, state, checkpoint, model)
    out = Path(out_dir)
    policy.save_pretrained(out)
    load_tokenizer(model).save_pretrained(out)
    return out


def _load(policy, state: dict, checkpoint: str, model: str) -> None:
    try:
        policy.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{checkpoint}: its weights do not fit the architecture of {model!r}: {err}") from err


def main(argv: list[str]) -> None:
    """``python -m evolrl export CHECKPOINT OUT_DIR``: the command line of :func:`export_checkpoint`."""
    parser = argparse.ArgumentParser(prog="python -m evolrl export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a .ckpt written by `python -m evolrl fit` (a file, or the directory of "
                                           "a sharded checkpoint from a run on several devices)")
    parser.add_argument("out_dir", help="directory to write")
    parser.add_argument("--model", help="base model string (default: the checkpoint's own)")
    parser.add_argument("--dtype", help="dtype of the saved weights (default: bfloat16)")
    parser.add_argument("--adapter-dir", help="a LoRA checkpoint: also write its adapter, in peft's format, here")
    args = parser.parse_args(argv)
    dtype = {"dtype": args.dtype} if args.dtype else {}  # export_checkpoint's own default otherwise
    print(export_checkpoint(args.checkpoint, args.out_dir, model=args.model, adapter_dir=args.adapter_dir, **dtype))
