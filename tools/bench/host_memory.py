"""Peak host memory per rank while the policy and its reference are built for FSDP2: old loading vs new, one run.

    python -m tools.bench.host_memory                      # a random ~270M-parameter Llama (bf16 safetensors, temp dir)
    python -m tools.bench.host_memory --model MODEL        # any model string evolrl loads (directory, .gguf, pkg://...)
    python -m tools.bench.host_memory --precision 32-true  # the reference in float32 too

For each loading, fresh CPU processes (gloo, ``--ranks`` of them) build what ``EvolRLModule.configure_model``
builds under ModelParallelStrategy with ``kl_coef > 0`` (policy + reference), and report the resident set size
after imports, the peak (``VmHWM``: a process's high-water mark, hence fresh processes per loading) and the
size once built:

* ``every-rank`` (the code before): every rank loads the whole policy, deep-copies it for the reference, and
  shards both;
* ``rank0`` (``evolrl.training.build.build_models``): the architecture on the meta device on every rank, sharded,
  filled from the one copy that rank 0 loads; the reference in ``reference_dtype`` (bf16 under bf16 precision).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.common import ROOT, free_port, status_mib

LOADINGS = ("every-rank", "rank0")


def build_every_rank(name: str, with_reference: bool, mesh, dtype: str = "float32"):
    """The loading before sharded loading from rank 0: ``(policy, reference or None)``, both sharded, fp32 all-gathers."""
    from evolrl.distributed import shard
    from evolrl.models import load_policy

    policy = load_policy(name, dtype).train()
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if with_reference else None
    shard(policy, mesh)
    if reference is not None:
        shard(reference, mesh)
    return policy, reference


def worker(loading: str, model: str, precision: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from evolrl.training.build import Dtypes, build_models

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    before = status_mib()
    if loading == "every-rank":
        policy, reference = build_every_rank(model, True, mesh)
    else:
        policy, reference = build_models(model, Dtypes.resolve(precision, "float32"), with_reference=True, mesh=mesh,
                                         device=torch.device("cpu"))
    dist.barrier()
    peak = status_mib("VmHWM")
    numel = sum(p.numel() for p in policy.parameters())
    print(json.dumps({"rank": dist.get_rank(), "before": before, "peak": peak, "built": status_mib(), "params": numel,
                      "reference_dtype": str(next(reference.parameters()).dtype)}), flush=True)
    dist.destroy_process_group()


def random_llama(directory: Path) -> str:
    """A randomly initialised ~270M-parameter Llama, saved in bf16 like Hub checkpoints (loaded as float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                         num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return str(directory)


def measure(loading: str, model: str, precision: str, ranks: int) -> list[dict]:
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tools.bench.host_memory", "--worker", loading, "--model", model, "--precision",
         precision], stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
             "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r)}) for r in range(ranks)]
    reports = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{loading}: a rank failed (exit {p.returncode})")
        reports += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return sorted(reports, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.host_memory",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model string (default: a random ~270M Llama in a temp dir)")
    parser.add_argument("--precision", default="bf16-mixed", help="trainer precision (sets the reference dtype)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--worker", choices=LOADINGS, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        return worker(a.worker, a.model, a.precision)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or random_llama(Path(tmp) / "llama")
        results = {loading: measure(loading, model, precision=a.precision, ranks=a.ranks) for loading in LOADINGS}
    params = results["rank0"][0]["params"]
    print(f"model {a.model or 'random Llama'}: {params / 1e6:.0f}M parameters ({params * 4 / 2**20:.0f} MiB in fp32); "
          f"precision {a.precision}; {a.ranks} CPU ranks (gloo)")
    print("loading     rank  RSS after imports  peak RSS  RSS built  peak - imports  reference")
    for loading, reports in results.items():
        for r in reports:
            print(f"{loading:<11} {r['rank']:>4}  {r['before']:>13.0f} MiB  {r['peak']:>4.0f} MiB  {r['built']:>5.0f} MiB"
                  f"  {r['peak'] - r['before']:>10.0f} MiB  {r['reference_dtype']}")


if __name__ == "__main__":
    main()
