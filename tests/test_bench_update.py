"""python -m tools.bench.bench_update --quick --profile 5 --budget 192 runs end to end (tiny model, padded and packed
update); timings are not asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent.parent


def test_bench_update_quick_prints_both_paths():
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--quick", "--budget", "192",
                             "--checkpoint-every", "2"], check=False, capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "packed: budget 192 tokens" in result.stdout  # a flag beside a preset overrides the preset's value
    assert "gradient checkpointing on every 2nd layer," in result.stdout
    rows = {m.group(1): m.group(2).split(" | ")
            for m in re.finditer(r"^\| heavy \| (padded|packed) \| (.+) \|$", result.stdout, re.MULTILINE)}
    assert set(rows) == {"padded", "packed"}, result.stdout
    for path, cells in rows.items():
        passes, largest, padding, seconds, tokens_s, *_, gflops, mfu_bf16, mfu_fp32, block_mm = map(float, cells)
        assert min(passes, largest, seconds, tokens_s, gflops, mfu_bf16, mfu_fp32, block_mm) > 0
        assert (padding == 0) == (path == "packed"), (path, padding)  # padded: the heavy tail pads the short rows
    assert re.search(r"heavy, packed / padded: time [\d.]+x, peak \(update\) [\d.]+x, peak \(abs\) [\d.]+x; "
                     r"tokens computed 0\.\d+x", result.stdout)  # packed computes fewer tokens: no padding
    assert re.search(r"matmul peak \(\d+\^3, best of \d+\): bf16 [\d.]+ GFLOP/s, fp32 [\d.]+ GFLOP/s", result.stdout)


def test_the_shared_prompt_path_runs_beside_the_padded_one_and_counts_each_prompt_once_a_group():
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--quick", "--paths", "padded", "shared",
                             "--group", "4", "--no-gradient-checkpointing", "--repeats", "1"], check=False,
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {m.group(1): m.group(2).split(" | ")
            for m in re.finditer(r"^\| heavy \| (padded|shared) \| (.+) \|$", result.stdout, re.MULTILINE)}
    assert set(rows) == {"padded", "shared"}, result.stdout
    assert float(rows["shared"][1]) < float(rows["padded"][1])  # the largest pass: its prompts once
    assert re.search(r"heavy, shared / padded: time [\d.]+x, .*tokens computed 0\.\d+x", result.stdout)
    from tools.bench.bench_update import update_flops

    w = {"blocks": 10, "head": 3, "layers": 2, "width": 4}
    one = update_flops(w, [12, 9], prompt=6, mini_batch=2, kl=False)
    assert update_flops(w, [12, 9], prompt=6, mini_batch=2, kl=False, shared=1) == one
    saved = 2 * 3 * (2 * 10 * 6 / 2 + 2 * 2 * 4 * 6 * 7 / 2)  # two sequences, half their prompt each, 3 forwards
    assert update_flops(w, [12, 9], prompt=6, mini_batch=2, kl=False, shared=2) == pytest.approx(one - saved)
    refused = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--paths", "shared"], check=False,
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert refused.returncode == 2 and "--no-gradient-checkpointing" in refused.stderr, refused.stderr


def test_a_checkpoint_interval_below_one_or_a_gpus_flag_on_a_cpu_is_refused_before_anything_runs():
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--checkpoint-every", "0"], check=False,
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "--checkpoint-every 0: 1 or more" in result.stderr, result.stderr
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--device", "cpu", "--profile", "5"],
                            check=False, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "--profile 5: profiles a GPU's kernels" in result.stderr, result.stderr
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--device", "cpu", "--checkpoint-every",
                             "auto"], check=False, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "--checkpoint-every auto: sizes to a GPU" in result.stderr, result.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_update_on_a_gpu_prints_the_kernel_profile_and_the_memory_estimate():
    """The CUDA path: a named Qwen3 shape with random weights, FSDP2 over a mesh of the one GPU, the busy fraction,
    launches and top kernels of one update, the measured peak beside tools.commands.gpu_budget's estimate, and the
    checkpointing it fits to the card."""
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--quick", "--device", "cuda", "--models",
                             "qwen3-0.6b", "--profile", "5", "--budget", "192", "--checkpoint-every", "auto"],
                            check=False,
                            capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(re.findall(r"^GPU busy [\d.]+ of the update \([\d.]+ s of kernels\), \d+ kernel launches, \d+ kernels$",
                          result.stdout, re.MULTILINE)) == 2, result.stdout
    assert re.search(r"^heavy, packed: peak [\d.]+ GiB allocated; tools.commands.gpu_budget estimates [\d.]+ GiB",
                     result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^card peak: ", result.stdout, re.MULTILINE)
    assert re.search(r"^gradient checkpointing (off|on.*): what tools.commands.gpu_budget fits to this GPU's",
                     result.stdout, re.MULTILINE), result.stdout


def test_a_failed_childs_report_keeps_the_exception_lines_a_long_dump_pushes_out_of_the_tail():
    from tools.common import failure_report

    dump = "\n".join(f"[rank0]:   InputBuffer(name='arg{i}_1', layout=FixedLayout('cuda:0'))" for i in range(2000))
    stderr = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
              "[rank0]: torch._inductor.exc.InductorError: LoweringException: AssertionError: strides differ\n"
              + dump + "\n[rank0]: Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace\n")
    report = failure_report(stderr)
    assert "torch._inductor.exc.InductorError: LoweringException: AssertionError: strides differ" in report
    assert report.endswith("internal stack trace\n")  # the tail is still there
    assert len(report) < 4000
    assert failure_report("plain text, no exception\n") == "plain text, no exception\n"


def test_a_compiled_case_reports_its_warm_up_and_the_graphs_traced_before_and_during_the_timed_updates(tiny_model):
    from tools.bench.bench_update import compile_line, responses, run_case

    prompt = 12
    draws = [[prompt + n for n in responses("heavy", 4, median=24, sigma=1.0, cap=64, seed=s)] for s in (0, 1)]
    out = run_case(model=tiny_model, path="packed", draws=draws, prompt=prompt, seed=0, mini_batch=2, micro_batch=2,
                   budget=128, precision="bf16-mixed", gradient_checkpointing=True, kl_coef=0.001, entropy_coef=0.0,
                   temperature=1.0, chunk=1024, threads=2, allocator="default", compiled=True)
    warm, final = out["graphs"]
    assert warm > 0 and final >= warm and out["warmup_s"] > 0
    line = compile_line("heavy", "packed", out)
    assert line.startswith(f"heavy, packed: the warm-up update took {out['warmup_s']:.1f} s and traced {warm} graphs")
    assert compile_line("heavy", "packed", out | {"graphs": [5, 7]}).endswith(
        "2 more traced during the timed updates (their times include compiling)")
