"""``python -m evolrl compare`` end to end on the tiny model: two overlays of a tiny config over two seeds, planned,
one run started from a line ``commands`` printed, the rest run by ``compare run`` (stopped by SIGTERM in between and
gone on with; a run another process holds left to it), a changed arm and rule refused after the first run, then the
report read back from the real event files and held-out responses. Sampled numbers are not asserted: the random
model scores what it scores."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from helpers import tiny_config

from evolrl.checkpoints import RunLock
from evolrl.checkpoints.record import record
from evolrl.compare.paired import bootstrap, differences, evaluated_step, outcome, per_problem
from evolrl.compare.plan import run_dir
from evolrl.compare.report import runs_table

ROOT = Path(__file__).parent.parent
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
       "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def compare(*args: str, cwd: Path, code: int = 0) -> str:
    result = subprocess.run([sys.executable, "-m", "evolrl", "compare", *args], cwd=cwd, env=ENV, capture_output=True,
                            text=True, timeout=900, check=False)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def spec(tmp_path: Path, model: str) -> Path:
    """Two arms over two seeds of a two-step tiny run (evaluated before training and after each step), with progress
    lines so that a SIGTERM can wait for a step."""
    config = yaml.safe_load(tiny_config(tmp_path / "base", model).read_text())
    config["trainer"] |= {"max_epochs": -1, "max_steps": 2, "limit_train_batches": None, "enable_progress_bar": True}
    config["model"]["reward"]["class_path"] = "evolrl.rewards.MajorityVoteReward"
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"model": {"optim": {"lr": 0.001}}}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"model": {"optim": {"lr": 0.003}}}))
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({"configs": ["tiny.yaml"], "arms": {"a": ["a.yaml"], "b": ["b.yaml"]},
                                    "seeds": [0, 1], "out": "out", "eval_set": "addition",
                                    "rule": {"metric": "pass@4", "baseline": "a", "threshold": 0.05}}))
    return path


def wait_for(path: Path, text: str, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() or text not in path.read_text():
        assert process.poll() is None, f"ended ({process.returncode}) before {text!r} in {path}"
        assert time.monotonic() < deadline, f"no {text!r} in {path} after {seconds} s"
        time.sleep(0.1)


def test_plan_run_and_report_two_overlays_over_two_seeds(tmp_path, tiny_model):
    spec(tmp_path, tiny_model)
    given = ("--config", "compare.yaml")
    assert "2 arms x 2 seeds = 4 runs" in compare("plan", *given, cwd=tmp_path)
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["rule"] == {"metric": "pass@4", "baseline": "a", "direction": "greater", "threshold": 0.05,
                            "confidence": 0.9, "resamples": 10_000}
    assert plan["runs"]["b/seed1"]["model"]["optim"]["lr"] == 0.003 and plan["runs"]["b/seed1"]["seed_everything"] == 1

    lines = compare("commands", *given, cwd=tmp_path).splitlines()
    assert len(lines) == 4 and all(line.startswith("python -m evolrl fit --config ") for line in lines)
    first = subprocess.run(["bash", "-c", lines[0]], cwd="/", env=ENV, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]  # a job array's task 0, from another folder

    runs = tmp_path / "out" / "runs"
    process = subprocess.Popen([sys.executable, "-m", "evolrl", "compare", "run", *given], cwd=tmp_path, env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(runs / "b" / "seed0" / "console.log", "] step 1/2", process)
    process.send_signal(signal.SIGTERM)
    log = process.communicate(timeout=300)[0]
    assert process.returncode == 143, log
    assert "a seed 0: finished already" in log and "b seed 0: stopped by SIGTERM" in log
    assert (runs / "b" / "seed0" / "checkpoints" / "last.ckpt").exists()

    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"model": {"optim": {"lr": 0.004}}}))
    refused = compare("plan", *given, "--rule.threshold", "0.1", cwd=tmp_path, code=1)
    assert "2 run(s) have started (a/seed0, b/seed0)" in refused
    assert "arm b: model.optim.lr: 0.003 -> 0.004" in refused and "rule.threshold: 0.05 -> 0.1" in refused
    assert "arm a:" not in refused
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"model": {"optim": {"lr": 0.003}}}))

    held = RunLock(runs / "a" / "seed1" / "checkpoints")
    held.acquire()  # as a second `compare run` on another node holds the run it is running
    log = compare("run", *given, cwd=tmp_path)
    held.release()
    assert "b seed 0: goes on" in log and f"a seed 1: skipped, in use by another run (pid {os.getpid()} on " in log
    assert "1 of 4 runs left to the runs that hold them (a seed 1)" in log and "all 4 runs finished" not in log
    log = compare("run", *given, cwd=tmp_path)
    assert "a seed 1: starts" in log and "all 4 runs finished" in log
    starts = [json.loads(line) for line in (runs / "b" / "seed0" / "run_record.jsonl").read_text().splitlines()]
    assert [s["event"] for s in starts] == ["start", "start", "end"] and starts[1]["from"].endswith("last.ckpt")
    assert "finished already" in compare("run", *given, cwd=tmp_path).splitlines()[0]

    report = compare("report", *given, cwd=tmp_path)
    assert re.search(r"^\| b \| 0 \| finished \| 2 \| 2 \| \w+", report, re.MULTILINE), report
    assert starts[0]["processor"] in report and starts[0]["commit"] in report
    for arm in ("a", "b"):
        table = report[report.index(f"{arm} (2 seeds), on addition"):]
        for step in (0, 1, 2):  # every evaluation: the sanity check before training, then after each step
            assert re.search(rf"^\| {step} \| [\d.]+ \+- [\d.]+ \| [\d.]+ \+- [\d.]+ \| [\d.]+ \+- [\d.]+ \|", table,
                             re.MULTILINE), table
    assert re.search(r"^\| b \| 2 \| 4 \| [+-][\d.]+ \| \([+-][\d.]+, [+-][\d.]+\) \| 0: [+-][\d.]+, 1: [+-][\d.]+ "
                     r"\| (not )?shown \|$", report, re.MULTILINE), report
    assert (tmp_path / "out" / "curves.png").stat().st_size > 10_000
    for run in runs.glob("*/seed*"):  # b seed 0's evaluation the SIGTERM skipped was made when it went on
        assert sorted(evaluated_step(f) for f in run.rglob("val_responses_step*.jsonl")) == [0, 1, 2], run
    assert (tmp_path / "out" / "report.md").read_text() == report

    saved = runs / "a" / "seed1" / "config.yaml"
    saved.write_text(saved.read_text().replace("lr: 0.001", "lr: 0.002"))  # a run that did not run the plan
    (runs / "b" / "seed1").rename(tmp_path / "elsewhere")
    report = compare("report", *given, cwd=tmp_path)
    assert "- a seed 1: refused\n    model.optim.lr: 0.001 -> 0.002" in report and "- b seed 1: missing" in report
    assert re.search(r"^\| b \| 1 \| 4 \| ", report, re.MULTILINE), report  # seed 0 alone is paired
    next(runs.glob("b/seed0/**/val_responses_step2.jsonl")).unlink()  # a run that ended without its last evaluation
    report = compare("report", *given, cwd=tmp_path)
    assert "- b - a, seed 0: left out, its last evaluations are at different steps (b 1, a 2)" in report
    assert "no seed finished in both arms at one step" in report


def test_the_runs_table_names_a_seed_whose_arms_ran_at_different_commits_or_processors(tmp_path):
    ran = {("a", 0): ("e23a072", "AMD EPYC"), ("b", 0): ("e23a072", "Intel Xeon"),
           ("a", 1): ("e23a072", "AMD EPYC"), ("b", 1): ("8590dac", "AMD EPYC"),
           ("a", 2): ("e23a072", "AMD EPYC"), ("b", 2): ("e23a072", "AMD EPYC")}
    for (arm, seed), (commit, processor) in ran.items():
        directory = run_dir(tmp_path, arm, seed)
        record(directory, event="start", commit=commit, processor=processor, host="h", **{"from": None})
        record(directory, event="end", step=40)
    text = "\n".join(runs_table({key: ("finished", []) for key in ran}, tmp_path, "e23a072"))
    assert "The arms of seed(s) [1] ran at different commits." in text
    assert "The arms of seed(s) [0] ran on different processors." in text
    unfinished = {key: ("unfinished" if key == ("b", 0) else "finished", []) for key in ran}  # a run left out: no line
    assert "different processors" not in "\n".join(runs_table(unfinished, tmp_path, "e23a072"))


def test_the_spec_names_a_bad_field_and_its_value(tmp_path, tiny_model):
    spec(tmp_path, tiny_model)
    bad = compare("plan", "--config", "compare.yaml", "--rule.baseline", "c", cwd=tmp_path, code=1)
    assert "compare: rule.baseline='c': one of the arms (a, b)" in bad
    bad = compare("plan", "--config", "compare.yaml", "--eval_set", "math", cwd=tmp_path, code=1)
    assert "eval_set='math': arm a evaluates ['addition']" in bad
    bad = compare("run", "--config", "compare.yaml", cwd=tmp_path, code=1)
    assert "no plan in" in bad


def rows(correct: list[list[bool]]) -> list[dict]:
    """``EvalResponses`` lines: one problem per list, one response per entry (its answer "1" when right)."""
    return [{"dataset": "heldout", "id": f"add-{i}", "responses": [{"answer": "1" if c else "0", "correct": c}
                                                                   for c in problem]}
            for i, problem in enumerate(correct)]


def test_an_evaluation_some_seeds_lack_says_how_many_it_covers():
    from evolrl.compare.report import seeds_mean

    assert seeds_mean([0.5, 0.7], 2) == "0.600 +- 0.141"
    assert seeds_mean([0.5], 2) == "0.500 +- 0.000 (1 of 2 seeds)"


def test_pass_and_majority_per_problem_from_the_responses():
    problems = rows([[True, False, False, False], [False] * 4, [True, True, True, False]])
    assert per_problem(problems, "pass@4", "heldout") == {"add-0": 1.0, "add-1": 0.0, "add-2": 1.0}
    assert per_problem(problems, "pass@1", "heldout")["add-2"] == 0.75
    assert per_problem(problems, "maj@4", "heldout") == {"add-0": 0.0, "add-1": 0.0, "add-2": 1.0}
    assert per_problem(problems, "pass@4", "other") == {}


def test_the_bootstrap_over_seeds_and_problems_widens_where_the_seeds_disagree():
    """Study IV's shape: the seeds' own gaps far apart. Resampling problems after averaging the seeds ignores that
    spread; resampling seeds, then problems, does not."""
    rng = np.random.default_rng(0)
    matrix = np.array([0.07, -0.31, -0.06])[:, None] + rng.normal(0, 0.05, (3, 96))
    gap, low, high = bootstrap(matrix, 10_000, 0.9)
    _, problems_low, problems_high = bootstrap(matrix.mean(axis=0, keepdims=True), 10_000, 0.9)
    assert abs(gap - matrix.mean()) < 1e-12 and low < problems_low < problems_high < 0 < high
    assert not outcome(gap, low, high, "less", 0.05) and outcome(gap, problems_low, problems_high, "less", 0.05)
    same = np.full((2, 5), 0.2)
    assert np.allclose(bootstrap(same, 1000, 0.9), 0.2)  # no spread: the interval is the mean
    arm, base = [{"p1": 1.0, "p2": 0.5}, {"p1": 0.0, "p2": 1.0}], [{"p1": 0.5, "p2": 0.5, "p3": 1.0}] * 2
    matrix, names = differences(arm, base)
    assert names == ["p1", "p2"] and matrix.tolist() == [[0.5, 0.0], [-0.5, 0.5]]


def test_the_readme_comparison_of_the_demo_plans_arms_that_differ_where_the_ttrl_overlay_says(tmp_path):
    """configs/compare_demo.yaml, planned as the README says (into another folder): four runs, the demo's held-out
    set, and per seed the two arms differ in the TTRL overlay's settings and the run's own folder, nothing else."""
    out = compare("plan", "--config", "configs/compare_demo.yaml", "--out", str(tmp_path), cwd=ROOT)
    assert "2 arms x 2 seeds = 4 runs" in out
    runs = json.loads((tmp_path / "plan.json").read_text())["runs"]
    from evolrl.compare.resolve import changes

    keys = {line.split(":")[0] for line in changes(runs["evol/seed0"], runs["ttrl/seed0"])}
    assert {k for k in keys if not k.startswith(("model.reward", "model.loss"))} == {
        "trainer.default_root_dir", "trainer.logger.init_args.save_dir"}
    assert {"model.reward.class_path", "model.loss.entropy_coef",
            "model.loss.policy_loss.init_args.clip_high"} <= keys
    seeds = {line.split(":")[0] for line in changes(runs["ttrl/seed0"], runs["ttrl/seed1"])}
    assert seeds == {"seed_everything", "data.seed", "trainer.default_root_dir", "trainer.logger.init_args.save_dir"}
