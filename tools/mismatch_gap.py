"""The sampler/trainer gap at a config's settings: the engine's log-probs of the tokens it samples vs the trainer's.

    python tools/mismatch_gap.py                                  # configs/demo.yaml: bf16 vLLM, bf16 autocast, T 0.7
    python tools/mismatch_gap.py --engine-dtype float32 --precision 32-true     # both sides float32: the floor
    python tools/mismatch_gap.py --config configs/paper/common.yaml --config configs/paper/qwen3-4b.yaml \
        --config configs/paper/math500.yaml --config configs/paper/evol.yaml --steps 1        # a paper run (GPU)

Reads the model, the training prompts, the engine, the sampling and the precision from the configs (``--config``,
merged in order as the CLI does), starts the engine with the policy's weights (as ``fit`` does before its first step),
samples ``--steps`` training steps' prompts x V responses, scores every response token as the update does
(``GRPOUpdate.forward``, under the trainer's autocast, on one device: FSDP's bf16 all-gathered weights are not
reproduced) and prints the ``mismatch/*`` numbers that each ``GRPOLoss.mismatch_correction`` would log for them
(``evolrl/algorithms/mismatch.py``), over all the sampled responses. Nothing is trained.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import time
from pathlib import Path

import torch
import yaml

from evolrl.algorithms import CORRECTIONS, mismatch_summary
from evolrl.data import RolloutDataModule
from evolrl.models import load_policy
from evolrl.rollout import Sampling
from evolrl.training import GRPOLoss, GRPOUpdate
from evolrl.training.sequences import pack
from evolrl.types import RolloutBatch

DEMO = Path(__file__).parent.parent / "configs" / "demo.yaml"


def merged(configs: list[dict]) -> dict:
    """Later configs override earlier ones key by key, nested mappings merged (as the CLI composes them)."""
    out: dict = {}
    for config in configs:
        for key, value in config.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merged([out[key], value]) if both else value
    return out


def build(spec: dict, **overrides):
    """The object a ``{class_path, init_args}`` entry names (plain init_args only)."""
    module, name = spec["class_path"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**{**spec.get("init_args", {}), **overrides})


def measure(config: dict, steps: int, engine_dtype: str | None, precision: str | None, model: str | None) -> dict:
    """``{correction: mismatch summary}`` over ``steps`` training steps' responses, and what was measured."""
    data, module = config["data"], config["model"]
    precision = str(precision or config["trainer"].get("precision", "32-true"))
    model = model or module["model"]
    engine = build(data["engine"], **({"dtype": engine_dtype} if engine_dtype else {}))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    datamodule = RolloutDataModule(
        build(data["train"]), model=model, engine=engine,
        prompts_per_step=data["prompts_per_step"], vote_samples=data["vote_samples"],
        trained_samples=data["trained_samples"], sampling=Sampling(**data["sampling"]),
        max_prompt_tokens=data.get("max_prompt_tokens", 1024), system_prompt=data.get("system_prompt"))
    datamodule.setup("fit")
    rollouts = datamodule.rollouts
    policy = load_policy(model).to(device)  # float32: the trainer's master weights
    rollouts.push(policy)
    update = GRPOUpdate(GRPOLoss(), mini_batch_size=module.get("mini_batch_size", 32),
                        micro_batch_size=module.get("micro_batch_size", 2), chunk_size=1024, max_grad_norm=1.0)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision.startswith("bf16")
                else contextlib.nullcontext())
    losses = {mode: GRPOLoss(mismatch_correction=mode) for mode in (None, *CORRECTIONS)}
    totals = {mode: [] for mode in losses}
    p, v = rollouts.prompts_per_step, rollouts.vote_samples
    tokens = 0
    for step in range(steps):
        items = datamodule.train_items[step * p : (step + 1) * p]
        sampled = rollouts.sample([q for q, _ in items], [ids for _, ids in items])
        batch = RolloutBatch(sampled.groups, sampled.weights_version, torch.arange(v).repeat(p, 1))  # all V
        seqs = pack(batch, torch.zeros(p, v), rollouts.pad_token_id).to(device)
        tokens += int(seqs.response_mask.sum())
        for start in range(0, len(seqs), update.micro_batch_size):
            part = seqs.select(list(range(start, min(start + update.micro_batch_size, len(seqs)))))
            with torch.no_grad(), autocast:
                old = update.forward(policy, part, rollouts.temperature)[0]
            for mode, loss in losses.items():
                totals[mode].append(loss.correct(old, part)[1])
    summaries = {}
    for mode, parts in totals.items():
        sums, maxima = zip(*parts)
        summaries[mode] = mismatch_summary(torch.stack(sums).sum(0), torch.stack(maxima).amax(0), mode)
    return {"model": model, "engine_dtype": getattr(engine, "dtype", "?"), "precision": precision,
            "temperature": rollouts.temperature, "responses": steps * p * v, "tokens": tokens,
            "summaries": summaries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", help="a fit config, repeatable (default: configs/demo.yaml)")
    parser.add_argument("--steps", type=int, default=2, help="training steps' prompts to sample (default 2)")
    parser.add_argument("--engine-dtype", help="override the engine's dtype, e.g. float32")
    parser.add_argument("--precision", help="override the trainer's precision, e.g. 32-true")
    parser.add_argument("--model", help="override the model")
    args = parser.parse_args()
    start = time.perf_counter()
    config = merged([yaml.safe_load(Path(path).read_text()) for path in args.config or [DEMO]])
    result = measure(config, args.steps, args.engine_dtype, args.precision, args.model)
    print(f"{result['model']}: vLLM {result['engine_dtype']}, trainer {result['precision']}, temperature "
          f"{result['temperature']}: {result['responses']} responses, {result['tokens']} tokens "
          f"({time.perf_counter() - start:.0f} s)")
    for mode, summary in result["summaries"].items():
        print(f"  {mode!s:15s}" + "  ".join(f"{k} {v:.4g}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
