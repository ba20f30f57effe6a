"""The sampler/trainer gap at a config's settings: the engine's log-probs of the tokens it samples vs the trainer's.

    python -m tools.commands.mismatch_gap                   # configs/demo.yaml: bf16 vLLM, bf16 autocast, T 0.7
    python -m tools.commands.mismatch_gap --engine-dtype float32 --precision 32-true   # both sides float32: the floor
    python -m tools.commands.mismatch_gap --config configs/paper/common.yaml --config configs/paper/qwen3-4b.yaml \\
        --config configs/paper/math500.yaml --config configs/paper/evol.yaml --steps 1      # a paper run (GPU)

Builds the module, data module and trainer from the configs (``--config``, repeatable) through the CLI itself
(``evolrl.cli.main(..., run=False)``), so model, prompts, engine, sampling, passes and precision are ``fit``'s; starts
the engine with the policy's weights, samples ``--steps`` steps' prompts x V responses and scores every response token
as the update does (``build_models``, ``GRPOUpdate.forward`` over ``GRPOUpdate.plan``'s passes, the trainer's autocast,
one device: FSDP's bf16 gathers are not reproduced). Prints the ``mismatch/*`` numbers that no correction,
``TokenTruncate()`` and ``SequenceMask()`` (``evolrl/algorithms/corrections.py``) would log. Nothing is trained. On a
CPU without native bf16 a bf16 config runs float32, as in ``fit``, unless ``--engine-dtype`` or ``--precision`` asks.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from evolrl.algorithms import SequenceMask, TokenTruncate, mismatch_summary
from evolrl.cli import main as cli_main
from evolrl.logprobs import trained_sequences
from evolrl.training import GRPOLoss
from evolrl.training.build import Dtypes, build_models
from evolrl.training.scoring import PAD_ID
from evolrl.types import RolloutBatch
from tools.common import ROOT

DEMO = ROOT / "configs" / "demo.yaml"


def configured(configs: list[str], engine_dtype: str | None, precision: str | None, model: str | None):
    """The module, data module and trainer exactly as ``python -m evolrl fit --config ...`` builds them."""
    args = [arg for path in configs for arg in ("--config", path)]
    args += ["--data.engine.init_args.dtype", engine_dtype] if engine_dtype else []
    args += ["--trainer.precision", precision] if precision else []
    args += ["--model.model", model] if model else []
    args += ["--cpu_bf16", "keep"] if engine_dtype or precision else []  # dtypes asked for are the ones measured
    cli = cli_main(args, run=False)
    return cli.model, cli.datamodule, str(cli.trainer.precision)


def measure(configs: list[str], steps: int, engine_dtype: str | None, precision: str | None,
            model: str | None) -> dict:
    """``{correction: mismatch summary}`` over ``steps`` training steps' responses, and what was measured."""
    module, datamodule, precision = configured(configs, engine_dtype, precision=precision, model=model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    datamodule.setup("fit")
    rollouts, update = datamodule.rollouts, module.update
    dtypes = Dtypes.resolve(precision, module.dtype_name, reference=module.reference_dtype,
                            fsdp_param=module.fsdp_param_dtype)
    policy, _ = build_models(module.model_name, dtypes, with_reference=False, device=device,  # as configure_model
                             trust_remote_code=module.trust_remote_code, passes=update.batching.passes)
    policy = policy.to(device)
    rollouts.push(policy)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if precision.startswith("bf16")
                else contextlib.nullcontext())
    # Each correction at its default settings, by the name its table column uses; None: no correction.
    corrections = {None: None, TokenTruncate.name: TokenTruncate(), SequenceMask.name: SequenceMask()}
    losses = {name: GRPOLoss(mismatch_correction=correction) for name, correction in corrections.items()}
    totals = {mode: [] for mode in losses}
    p, v = rollouts.prompts_per_step, rollouts.vote_samples
    tokens = 0
    for step in range(steps):
        items = datamodule.train_items[step * p : (step + 1) * p]
        sampled = rollouts.sample([q for q, _ in items], [ids for _, ids in items])
        batch = RolloutBatch(sampled.groups, sampled.weights_version, torch.arange(v).repeat(p, 1))  # all V
        seqs = trained_sequences(batch, torch.zeros(p, v), PAD_ID).to(device)
        tokens += int(seqs.response_mask.sum())
        for micro in (micro for mini in update.plan(seqs) for micro in mini if micro):  # the update's passes
            part = update.micro_batch(seqs, micro)
            with torch.no_grad(), autocast:
                old = update.forward(policy, part, rollouts.temperature)[0]
            for mode, loss in losses.items():
                totals[mode].append(loss.correct(old, part)[1])
    summaries = {}
    for mode, parts in totals.items():
        sums, maxima = zip(*parts)
        summaries[mode] = mismatch_summary(torch.stack(sums).sum(0), torch.stack(maxima).amax(0),
                                           losses[mode].mismatch_correction)
    return {"model": module.model_name, "engine_dtype": getattr(rollouts.engine, "dtype", "?"),
            "precision": precision, "temperature": rollouts.temperature, "responses": steps * p * v, "tokens": tokens,
            "summaries": summaries}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.commands.mismatch_gap",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", help="a fit config, repeatable (default: configs/demo.yaml)")
    parser.add_argument("--steps", type=int, default=2, help="training steps' prompts to sample (default 2)")
    parser.add_argument("--engine-dtype", help="override the engine's dtype, e.g. float32")
    parser.add_argument("--precision", help="override the trainer's precision, e.g. 32-true")
    parser.add_argument("--model", help="override the model")
    args = parser.parse_args()
    start = time.perf_counter()
    result = measure(args.config or [str(DEMO)], args.steps, engine_dtype=args.engine_dtype, precision=args.precision,
                     model=args.model)
    print(f"{result['model']}: vLLM {result['engine_dtype']}, trainer {result['precision']}, temperature "
          f"{result['temperature']}: {result['responses']} responses, {result['tokens']} tokens "
          f"({time.perf_counter() - start:.0f} s)")
    for mode, summary in result["summaries"].items():
        print(f"  {mode!s:15s}" + "  ".join(f"{k} {v:.4g}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
