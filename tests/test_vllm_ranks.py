"""Two gloo processes: an engine call that raises on one rank raises on both within seconds, and vLLM's start
sees this rank's device as LOCAL_RANK while the launcher's value stays for everything else.

The engine here is a stand-in that raises on rank 1: what is tested is the agreement between ranks
(``evolrl.rollout.ranks.fail_together``), which the real engine wraps around its start, pushes and sampling.
"""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import free_port

HOLD = 8
"""Seconds a failed rank stays alive after its error, as a trainer tearing down does; a rank that learns of the
failure only when the other exits (or at the collective's timeout) takes at least this long."""

RANK_SCRIPT = f"""
import datetime, os, sys, time
import torch.distributed as dist
from evolrl.rollout.ranks import fail_together
from evolrl.rollout.vllm_setup import launcher_env

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
with launcher_env():
    print("LOCAL_RANK during start", os.environ["LOCAL_RANK"], flush=True)
print("LOCAL_RANK after start", os.environ["LOCAL_RANK"], flush=True)

def sample():
    if rank == 1:
        raise ValueError("engine broke")
    return "groups"

start = time.monotonic()
try:
    fail_together("vLLM sampling", sample)
except Exception as err:
    print(f"RAISED after {{time.monotonic() - start:.1f}} s: {{err}}", flush=True)
    time.sleep({HOLD})
    dist.destroy_process_group()  # a gloo group left open at exit can abort the process while the other leaves
    sys.exit(1)
dist.barrier()  # the next collective: without the agreement, rank 0 waits here for rank 1
print("PASSED", flush=True)
dist.destroy_process_group()
"""


def test_a_failure_on_one_rank_stops_both_promptly():
    launcher = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    # LOCAL_RANK 5: a launcher counting GPUs that this process (one visible device, or none) does not see
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env={**env, "RANK": str(r), "LOCAL_RANK": "5"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outputs = [rank.communicate(timeout=HOLD + 120) for rank in ranks]
    for rank, (out, err) in zip(ranks, outputs):
        assert rank.returncode == 1, err[-2000:]
        assert "LOCAL_RANK during start 0\n" in out and "LOCAL_RANK after start 5\n" in out
        raised = [line for line in out.splitlines() if line.startswith("RAISED")]
        assert raised, f"this rank learnt of the failure only from the other's exit: {err[-1000:]}"
        raised = raised[0]
        assert float(raised.split()[2]) < HOLD / 2, raised  # at once, not when the other rank exits
        assert "vLLM sampling failed on rank 1" in raised
    assert "ValueError: engine broke" in outputs[1][0]  # the failing rank's own error, in its message
    assert "this rank stops too" in outputs[0][0]
