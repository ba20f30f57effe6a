"""``cpu_bf16``: a CPU run asked for bf16 runs float32 where the CPU has no native bf16, and says so."""

from __future__ import annotations

import pytest
from helpers import build_config
from jsonargparse import Namespace

from evolrl.cli import main
from evolrl.cpu_bf16 import float32_where_bf16_is_emulated, native_bf16


def parsed(accelerator="cpu", precision="bf16-mixed", dtype="bfloat16", choice="auto") -> Namespace:
    engine = Namespace(class_path="evolrl.rollout.VLLMEngine", init_args=Namespace(dtype=dtype))
    return Namespace(cpu_bf16=choice, trainer=Namespace(accelerator=accelerator, precision=precision),
                     data=Namespace(engine=engine))


def test_emulated_bf16_becomes_float32_in_the_trainer_and_the_engine():
    config = parsed()
    changes = float32_where_bf16_is_emulated(config, native=False)
    assert changes == ["trainer.precision: bf16-mixed -> 32-true", "data.engine.init_args.dtype: bfloat16 -> float32"]
    assert config.trainer.precision == "32-true" and config.data.engine.init_args.dtype == "float32"


@pytest.mark.parametrize("case", ["native", "keep", "cuda", "float32 already"])
def test_nothing_changes_with_native_bf16_keep_a_gpu_or_float32(case):
    config = parsed(accelerator="cuda" if case == "cuda" else "cpu", choice="keep" if case == "keep" else "auto",
                    precision="32-true" if case == "float32 already" else "bf16-mixed",
                    dtype="float32" if case == "float32 already" else "bfloat16")
    before = config.clone()
    assert float32_where_bf16_is_emulated(config, native=case == "native") == []
    assert config == before


def test_the_cli_builds_the_trainer_with_what_this_cpu_computes(tmp_path, tiny_model, monkeypatch):
    """Either branch, whichever this CPU takes: native bf16 keeps bf16-mixed, emulated runs 32-true."""
    monkeypatch.setattr("sys.argv", ["evolrl"])
    config = str(build_config(tmp_path, tiny_model, trainer={"precision": "bf16-mixed"}))
    expected = "bf16-mixed" if native_bf16() else "32-true"
    assert main(["--config", config], run=False).trainer.precision == expected
    assert main(["--config", config, "--cpu_bf16", "keep"], run=False).trainer.precision == "bf16-mixed"


def test_an_unknown_choice_fails_at_start_naming_the_choices(tmp_path, tiny_model, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    with pytest.raises(SystemExit):
        main(["--config", str(build_config(tmp_path, tiny_model)), "--cpu_bf16", "always"], run=False)
    err = capsys.readouterr().err
    assert "cpu_bf16" in err and "auto" in err and "keep" in err


@pytest.mark.parametrize(("native", "device", "choice", "expected"), [
    (False, "cpu", "auto", "32-true"), (False, "cpu", "keep", "bf16-mixed"), (True, "cpu", "auto", "bf16-mixed"),
    (False, "cuda", "auto", "bf16-mixed")])
def test_the_trl_benchmark_applies_the_same_rule_to_both_frameworks_and_the_engine(monkeypatch, native, device, choice,
                                                                                  expected):
    """``tools.bench.bench`` on a CPU that reports no native bf16 (the CLI's own check, patched): both frameworks train
    in the precision it resolves (the runners read ``a.precision``), and the vLLM engine samples in its dtype."""
    from evolrl import cpu_bf16
    from tools.bench import bench

    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: native)
    a = Namespace(device=device, cpu_bf16=choice, precision="bf16-mixed")
    why = bench.precision_rule(a)
    assert a.precision == expected and bool(why) == (expected == "32-true")
    assert bench.vllm_engine(a).dtype == ("float32" if expected == "32-true" else "bfloat16")


def test_the_benchmarks_avx2_cap_takes_the_paths_of_a_cpu_without_native_bf16():
    """``tools.bench.bench --isa avx2`` (in a fresh process, as its children run): the CLI's own check then finds no
    native bf16 whatever this CPU has, ATen's kernels drop below AVX-512, vLLM's kernel queries answer no, and the
    benchmark's precision rule runs float32, the same as on a CPU with AVX2 alone."""
    import json
    import subprocess
    import sys

    from tools.common import ROOT

    code = """
import json, argparse
from tools.bench import isa, bench
said = isa.limit("avx2")
import torch
from evolrl import cpu_bf16
a = argparse.Namespace(device="cpu", cpu_bf16="auto", precision="bf16-mixed")
why = bench.precision_rule(a)
print(json.dumps({"said": said, "native": cpu_bf16.native_bf16(), "aten": torch.backends.cpu.get_cpu_capability(),
                  "queries": [getattr(torch.cpu, q)() for q in isa.QUERIES if hasattr(torch.cpu, q)],
                  "precision": a.precision, "why": why}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "AVX2" in got["said"] and got["native"] is False and not any(got["queries"])
    assert got["aten"] in ("AVX2", "DEFAULT")  # DEFAULT on a CPU older than AVX2: the cap only lowers
    assert got["precision"] == "32-true" and "float32" in got["why"]
