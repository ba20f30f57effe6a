"""python -m tools.commands.gpu_check in its CPU mode, for real on tiny shapes: the report's structure, and broken
inputs reported as FAILED (a KL reference with bf16 rotary buffers, a section that raises, a fit the CLI refuses), and
the CPU mode run whole, as a user runs it."""

from __future__ import annotations

import copy
import importlib.util
import re

import pytest
import torch

from tools.commands.gpu_check import check as gpu_check

pytestmark = pytest.mark.slow  # each builds and runs a model; the whole CPU mode starts the CLI 6 times (~2 min)
HEADING = re.compile(r"^## (\d)\. ([a-z-]+): (ok|FAILED|skipped) \(\d+ s\)$", re.MULTILINE)


def keep_buffers_fp32(policy):
    """A reference with only its parameters in bfloat16 (the buffers, rotary frequencies among them, float32)."""
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    for p in reference.parameters():
        p.data = p.data.to(torch.bfloat16)
    return reference


@pytest.fixture
def check(tmp_path):
    return gpu_check.Check(gpu=False, quick=True, work=tmp_path, timeout=300)


def test_cpu_mode_run_whole_as_a_user_runs_it_reports_every_section_ok_or_skipped(tmp_path, capsys):
    """``python -m tools.commands.gpu_check --cpu --quick``: every section, through ``main``."""
    code = gpu_check.main(["--cpu", "--quick", "--out", str(tmp_path)])
    report = (tmp_path / "gpu_check.md").read_text()
    assert capsys.readouterr().out.count("## ") == len(gpu_check.SECTIONS)  # printed as it goes, too
    headings = HEADING.findall(report)
    assert [name for _, name, _ in headings] == list(gpu_check.SECTIONS)
    assert [int(n) for n, _, _ in headings] == list(range(1, len(gpu_check.SECTIONS) + 1))
    status = {name: s for _, name, s in headings}
    vllm = importlib.util.find_spec("vllm") is not None
    assert status == {"environment": "ok", "gpu-tests": "skipped", "fit": "ok", "kl": "ok",
                      "vllm": "ok" if vllm else "skipped", "lora": "ok"}, report
    for package in ("math-verify", "latex2sympy2_extended", "antlr4-python3-runtime", "jsonargparse", "datasets"):
        assert re.search(rf"^\| {package} \| \d", report, re.MULTILINE), package
    assert "skipped: no CUDA device" in report and (vllm or "vLLM is not installed" in report)
    assert "last band / first band: " in report  # the KL line, whatever the first band's gap
    # the LoRA section: the peak resident set varies by machine and library build (any size, in MiB or GiB)
    assert re.search(r"\| fit \| ok \(\d+ s\) \| [\d.]+ [MG]iB \(RSS\) \|", report), report
    assert re.search(r"\| resume \| ok \(\d+ s\) \| [\d.]+ [MG]iB \(RSS\) \|", report), report
    assert re.search(r"checkpoint: 0\.\d\d MiB \(adapters", report), report  # the tiny model's adapters, not its base
    summary = report.strip().splitlines()[-1]
    assert re.fullmatch(r"summary: \d ok, 0 FAILED, \d skipped in \d+ s", summary)
    assert code == 0


def test_kl_section_fails_bf16_rotary_buffers_and_passes_fp32_ones(check):
    # The same weights either way; only the reference's buffers differ. Over this quick 2,048-token probe the bf16
    # buffers' gap grows ~2.2x from the first band to the last (0.008 -> 0.019 on the development machine) and the
    # fp32 buffers' stays flat (~0.9x): the 1.5x line sits between, with room for other CPUs' bf16 kernels.
    bf16_buffers = gpu_check.run_section(4, "kl", check=check, section=lambda c: gpu_check.kl(
        c, reference=lambda policy: copy.deepcopy(policy).to(torch.bfloat16)))
    fp32_buffers = gpu_check.run_section(4, "kl", check=check, section=lambda c: gpu_check.kl(
        c, reference=keep_buffers_fp32))
    assert bf16_buffers[0] == "FAILED" and "rotary buffers torch.bfloat16" in "\n".join(bf16_buffers[1])
    assert fp32_buffers[0] == "ok" and "rotary buffers torch.float32" in "\n".join(fp32_buffers[1])
    assert HEADING.match(bf16_buffers[1][0]) and HEADING.match(fp32_buffers[1][0])


def test_a_section_that_raises_is_failed_with_the_error(check):
    from evolrl.settings import SettingError

    def broken(c):
        raise SettingError("Batching.max_tokens_per_micro_batch=0 is not allowed: an integer [1, ...]")

    status, lines = gpu_check.run_section(4, "kl", check, section=broken)
    assert status == "FAILED" and lines[0].startswith("## 4. kl: FAILED")
    assert "SettingError" in "\n".join(lines) and "max_tokens_per_micro_batch=0" in "\n".join(lines)


def test_a_fit_the_cli_refuses_is_failed_with_its_output(check):
    check.size["fit"]["new_tokens"] = 0  # Sampling.max_new_tokens must be >= 1: a usage error at the CLI's start
    good, lines = gpu_check.fit(check, engines=(("auto", "hf"),))
    text = "\n".join(lines)
    assert not good
    row = r"^\| auto \| hf \| FAILED \(\d+ s\) \| not run \| none \| none \| none \| FAILED \|$"
    assert re.search(row, text, re.MULTILINE), text
    assert "max_new_tokens" in text and "(exit 2" in text
