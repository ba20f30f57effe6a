"""On-policy lockstep against one step off-policy with a sampler process of its own, in one invocation.

Both arms run the demo made sampling-heavy (``--vote-samples`` responses per prompt of up to ``--max-new-tokens``
tokens). ``k0``: ``data.max_staleness: 0``, the engine in the training process, both on every core (the default).
``k1``: ``max_staleness: 1`` and ``data.sampler_process`` on the last core, the trainer on the others. Each (arm,
repeat) is a ``python -m evolrl fit`` process of its own, arms alternating; its TensorBoard curves give the medians
over the steps after the first (the step time is ``time/step + time/sync``: a push waits for the batch in progress).

    python -m tools.bench.async_rollouts                      # 6 steps x 2 repeats per arm (about 30 minutes)
    python -m tools.bench.async_rollouts --steps 3 --repeats 1 --vote-samples 8 --max-new-tokens 16   # a quick look

Prints medians per arm and the k1 / k0 ratios, and writes them as JSON (``--out``). Needs the demo extra.
``--estimate`` prints the labelled GPU estimate of docs/performance.md instead (a formula: :func:`estimate`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tools.common import ROOT, failure_report, pass_on_sigterm, read_scalars

METRICS = ("step_s", "sample_s", "update_s", "rollout_wait_s", "sampler_idle_s", "pass@1")


def arm_settings(arm: str, a: argparse.Namespace, cores: list[int], log_dir: Path) -> dict:
    """The demo's settings changed for ``arm`` (``k0`` or ``k1``)."""
    data = {"vote_samples": a.vote_samples, "trained_samples": a.trained_samples, "prompts_per_step": a.prompts,
            "sampling": {"temperature": 0.7, "max_new_tokens": a.max_new_tokens},
            "engine": {"class_path": "evolrl.rollout.VLLMEngine", "init_args": {
                "dtype": "bfloat16", "enforce_eager": True}}}
    if arm == "k1":
        data |= {"max_staleness": 1, "sampler_process": {"cpus": [str(cores[-1])]}}
    trainer = {"limit_train_batches": None, "max_epochs": -1, "max_steps": a.steps, "val_check_interval": a.steps,
               "num_sanity_val_steps": 0, "default_root_dir": str(log_dir), "enable_progress_bar": False,
               "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                          "init_args": {"save_dir": str(log_dir), "name": "bench"}}}
    model = {"loss": {"mismatch_correction": {"class_path": "evolrl.algorithms.TokenTruncate"}}} if arm == "k1" else {}
    return {"trainer": trainer, "data": data, "model": model}


def run_arm(arm: str, a: argparse.Namespace, cores: list[int], work: Path, repeat: int) -> dict[str, float]:
    log_dir = work / f"{arm}-{repeat}"
    override = work / f"{arm}-{repeat}.yaml"
    override.write_text(yaml.safe_dump(arm_settings(arm, a, cores, log_dir)))
    command = [sys.executable, "-m", "evolrl", "fit", "--config", str(ROOT / "configs" / "demo.yaml"),
               "--config", str(override)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise SystemExit(f"{arm} run {repeat} failed:\n{failure_report(done.stderr)}")
    curves = {tag: [value for _, value in points] for tag, points in read_scalars(log_dir).items()}
    steps = range(1, len(curves["time/step"]))  # the first step warms up
    median = lambda tag: statistics.median(curves[tag][i] for i in steps) if tag in curves else 0.0  # noqa: E731
    pass1 = next((v[-1] for tag, v in curves.items() if tag.startswith("val/") and tag.endswith("pass@1")), float("nan"))
    return {"step_s": statistics.median(curves["time/step"][i] + curves["time/sync"][i] for i in steps),
            "sample_s": median("time/sample"), "update_s": median("time/update"),
            "rollout_wait_s": median("time/rollout_wait"), "sampler_idle_s": median("time/sampler_idle"),
            "pass@1": pass1}


def estimate(gpus: int, shares: list[float], sampler_gpus: list[int]) -> str:
    """The labelled estimate of docs/performance.md (its derivation there): lockstep on ``gpus`` colocated GPUs,
    ``T0 = S + U`` with ``S = f T0``, against one step off-policy with ``a`` of them sampling,
    ``T1 = max(sampling, U x gpus / (gpus - a))``, the sampling between ``S`` (latency-bound) and ``S x gpus / a``
    (throughput-bound); the pushes and the colocated engine's sleep/wake left out."""
    rows = ["| sampling share f | sampler GPUs | gain, latency-bound sampling | gain, throughput-bound sampling |",
            "|---|---|---|---|"]
    for f in shares:
        for a in sampler_gpus:
            update = (1 - f) * gpus / (gpus - a)
            best, worst = 1 / max(f, update), 1 / max(f * gpus / a, update)
            rows.append(f"| {f:.2f} | {a} of {gpus} | {best:.2f}x | {worst:.2f}x |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--vote-samples", type=int, default=64)
    parser.add_argument("--trained-samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None, help="write the medians as JSON here")
    parser.add_argument("--estimate", action="store_true", help="print the GPU estimate's table only (no runs)")
    a = parser.parse_args()
    if a.estimate:
        print(estimate(8, [0.5, 0.7, 0.85], [2, 4]))
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores: one for the sampler, the others for the trainer")
    runs: dict[str, list[dict[str, float]]] = {"k0": [], "k1": []}
    with tempfile.TemporaryDirectory(prefix="evolrl-async-bench-") as tmp:
        for repeat in range(a.repeats):
            for arm in runs:
                runs[arm].append(run_arm(arm, a, cores, Path(tmp), repeat))
                print(f"{arm} repeat {repeat}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[arm][-1].items()),
                      flush=True)
    medians = {arm: {m: statistics.median(r[m] for r in rs) for m in METRICS} for arm, rs in runs.items()}
    print(f"\n{len(cores)} cores; V={a.vote_samples}, G={a.trained_samples}, P={a.prompts}, "
          f"{a.max_new_tokens} new tokens; medians of {a.repeats} runs x {a.steps - 1} steps")
    print(f"{'':4}" + "".join(f"{m:>16}" for m in METRICS))
    for arm, row in medians.items():
        print(f"{arm:4}" + "".join(f"{row[m]:16.3f}" for m in METRICS))
    ratio = medians["k1"]["step_s"] / medians["k0"]["step_s"]
    print(f"k1 / k0 step time: {ratio:.3f}")
    if a.out is not None:
        a.out.write_text(json.dumps({"settings": vars(a) | {"out": str(a.out)}, "cores": cores, "runs": runs,
                                     "medians": medians, "k1_over_k0_step": ratio}, indent=1))


if __name__ == "__main__":
    pass_on_sigterm()
    main()
