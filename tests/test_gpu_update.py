"""python -m tools.bench.gpu_update in its CPU mode: end to end on tiny shapes (every section reported, one forced to
fail while the others run on), a section past its timeout, a run past its deadline, and a second run appending to the
same report. Timings are not asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import gpu_update

ROOT = Path(__file__).parent.parent
HEADING = re.compile(r"^## (\d+)\. ([a-z0-9-]+): (ok|FAILED|TIMED OUT|skipped) \(\d+ s\)$", re.MULTILINE)
OPENING = re.compile(r"^`python -m tools\.bench\.gpu_update [^`]+` \| CPU mode: .+ \| commit \S+ \| "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d UTC$")


@pytest.mark.slow  # builds and trains small random models in ~12 processes: ~3 min on 2 cores
def test_cpu_mode_reports_every_section_and_a_failed_one_leaves_the_others_running(tmp_path, monkeypatch):
    result = subprocess.run([sys.executable, "-m", "tools.bench.gpu_update", "--out", str(tmp_path), "--cpu",
                             "--sections", "all"], check=False, capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", gpu_update.FAIL: "4b-sgd"})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]  # one section failed
    report = (tmp_path / "report.md").read_text()
    assert OPENING.match(report.splitlines()[0]), report.splitlines()[0]
    headings = HEADING.findall(report)
    assert [name for _, name, _ in headings] == [s.name for s in gpu_update.SECTIONS], report
    status = {name: s for _, name, s in headings}
    assert status == {"versions": "ok", "paper": "ok", "4b-sgd": "FAILED", "lr0": "ok", "kl": "ok",
                      "paper-compiled": "skipped", "4b-budget": "ok", "4b-adamw": "ok", "embedder": "ok",
                      "gather": "ok", "flex": "skipped"}, report
    assert "RuntimeError: forced by EVOLRL_GPU_UPDATE_FAIL=4b-sgd" in report
    assert "skipped: CPU mode (compiling" in report and "skipped: CPU mode (FlexAttention runs on CUDA only" in report
    assert re.search(r"^\| torch \| \d", report, re.MULTILINE)
    assert re.search(r"`torch\.nn\.attention\.varlen\.varlen_attn`(: missing| exists: `varlen_attn\()", report)
    # the bench section's one-row summary: no GPU busy fraction, launches or estimate on a CPU
    assert re.search(r"^\| [\d.]+ \| [\d.]+ \| [\d.e-]+ \| - \| - \| \d+ MiB resident \| - \|$", report,
                     re.MULTILINE), report

    (run,) = json.loads((tmp_path / "report.json").read_text())["runs"]
    assert run["command"] in report.splitlines()[0]
    sections = {s["name"]: s for s in run["sections"]}
    assert {name: s["status"] for name, s in sections.items()} == status
    paper = sections["paper"]["figures"]
    assert paper["update s"] > 0 and paper["tokens/s"] > 0 and paper["busy"] is None
    # a bench section that times out after printing its row keeps it: the timeout stands in for the clock (the
    # section's real log, as the run above left it, is what is read)
    from tools.commands.gpu_check import runs as gpu_check_runs

    monkeypatch.setattr(gpu_check_runs, "run", lambda *args, **kwargs: (124, 1.0, "the log's tail"))
    timed_out = gpu_update.run_section(2, gpu_update.BY_NAME["paper"], tmp_path, gpu=False, timeout=1.0)
    assert timed_out["status"] == "TIMED OUT" and timed_out["figures"] == paper
    assert "what it printed before its timeout:" in timed_out["lines"]
    lr0 = sections["lr0"]["figures"]
    assert lr0["tokens"] > 0 and lr0["max_abs_ratio_minus_1"] < 1e-2, lr0  # lr 0: the policy has not moved
    assert set(lr0["clip_fractions"]) >= {"clip_low_frac", "clip_high_frac"}
    assert max(lr0["clip_fractions"].values()) == 0 and lr0["outside_clip_range"] == 0
    embedder = sections["embedder"]["figures"]
    assert sorted(embedder) == ["small 256", "small 512", "small 64"] and all(
        e["seconds"] > 0 and e["peak_gib"] is None for e in embedder.values())  # no memory figure on a CPU
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(tmp_path / "work" / "models" / "update").state_dict()
    gather = sections["gather"]["figures"]  # the small model's every tensor once, in bf16
    assert gather["tensors"] == len(state) and gather["bytes"] == 2 * sum(t.numel() for t in state.values())
    kl = sections["kl"]["figures"]
    assert all(kl[path]["k3"] >= 0 and len(kl[path]["bands"]) == 3 for path in ("single", "fsdp2"))  # measured
    assert "FSDP2, one-process mesh (policy FSDPQwen3ForCausalLM, reference FSDPQwen3ForCausalLM)" in report


def test_a_section_past_its_timeout_or_the_deadline_is_reported_and_a_later_run_appends(tmp_path, capsys):
    # the section's process is still importing torch when its half second is up
    assert gpu_update.main(["--out", str(tmp_path), "--cpu", "--sections", "versions", "--timeout", "0.5"]) == 1
    assert gpu_update.main(["--out", str(tmp_path), "--cpu", "--sections", "5", "--deadline", "1"]) == 0
    report = (tmp_path / "report.md").read_text()
    openings = [line for line in report.splitlines() if line.startswith("`python -m")]
    assert len(openings) == 2 and all(OPENING.match(line) for line in openings), report
    assert report.splitlines()[0] == openings[0]
    assert [(n, name, s) for n, name, s in HEADING.findall(report)] == [("1", "versions", "TIMED OUT"),
                                                                       ("5", "kl", "skipped")]
    assert "timed out after 0.5 s (its timeout; `--timeout versions=S` to change it)" in report
    assert "skipped: 1 s left of `--deadline 1`" in report or "skipped: 0 s left of `--deadline 1`" in report
    runs = json.loads((tmp_path / "report.json").read_text())["runs"]
    assert [[s["status"] for s in r["sections"]] for r in runs] == [["TIMED OUT"], ["skipped"]]
    assert "## 1. versions: TIMED OUT" in capsys.readouterr().out  # printed as it goes, too


def test_sections_and_timeouts_by_name_number_and_range():
    assert gpu_update.chosen_sections("1-3,kl") == ["versions", "paper", "4b-sgd", "kl"]
    assert gpu_update.chosen_sections("all") == [s.name for s in gpu_update.SECTIONS]
    defaults = gpu_update.chosen_sections(None)
    assert defaults == ["versions", "4b-budget", "4b-adamw", "embedder", "gather", "flex"]
    with pytest.raises(SystemExit, match="unknown"):
        gpu_update.chosen_sections("paper,nope")
    limits = gpu_update.timeouts(["90", "kl=5"], gpu=True)
    assert limits["kl"] == 5 and all(v == 90 for k, v in limits.items() if k != "kl")
    limits = gpu_update.timeouts([], gpu=True)  # the default run on a lent GPU: 15 min, starting included
    assert sum(limits[name] for name in defaults) <= 15 * 60 - 4 * 60
    with pytest.raises(SystemExit, match="no section"):
        gpu_update.timeouts(["nope=3"], gpu=False)
