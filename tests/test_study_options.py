"""tools.study.study's run overlay and its option checks (no training: tests/test_study.py runs the tool end to end)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tools.study import study

ROOT = Path(__file__).parent.parent


def resolved(configs: list[str]) -> dict:
    """The whole config ``python -m evolrl fit`` composes from ``configs`` (its ``--print_config``)."""
    args = [sys.executable, "-m", "evolrl", "fit", "--print_config"]
    for config in configs:
        args += ["--config", config]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return yaml.safe_load(result.stdout)


def test_a_run_keeps_the_study_length_unless_steps_are_given():
    overlay = study.run_overlay(Path("runs/x"), "ttrl", 2, smoke=False)
    assert "limit_train_batches" not in overlay["trainer"]  # configs/study.yaml's 80 steps apply
    assert overlay["seed_everything"] == 2 and overlay["data"] == {"seed": 2}
    assert overlay["trainer"]["logger"]["init_args"] == {"save_dir": "runs/x", "name": "ttrl", "version": "seed2"}
    short = study.run_overlay(Path("runs/x"), "evol", 0, smoke=False, steps=12)
    assert short["trainer"]["limit_train_batches"] == 12 and short["trainer"]["val_check_interval"] == 4
    assert study.run_overlay(Path("runs/x"), "evol", 0, smoke=False, steps=2)["trainer"]["val_check_interval"] == 1
    assert "model" not in overlay  # configs/demo.yaml's learning rate unless one is given
    assert study.run_overlay(Path("runs/x"), "evol", 0, smoke=False, lr=2e-6)["model"] == {"optim": {"lr": 2e-6}}


def test_steps_below_one_fail_at_start_naming_the_value():
    result = subprocess.run([sys.executable, "-m", "tools.study.study", "run", "--steps", "0", "--out", "/nonexistent"],
                            capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 2
    assert "--steps 0: a run needs at least 1 training step" in result.stderr


def test_a_summary_with_no_finished_run_says_so_and_how_to_finish_one(tmp_path):
    (tmp_path / "ttrl" / "seed7").mkdir(parents=True)  # a run under way: no done.json yet
    result = subprocess.run([sys.executable, "-m", "tools.study.study", "summary", "--methods", "ttrl", "--out",
                             str(tmp_path)], capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 1
    assert f"no finished run of ttrl under {tmp_path}" in result.stderr and "goes on with" in result.stderr


def test_the_summary_reads_the_trailing_fraction_beside_entropy_and_length():
    scalars = {f"train/{name}": [(0, 0.0), (1, 0.5), (2, 1.0)] for name in ("entropy", "response_length",
                                                                               "trailing_fraction")}
    numbers = study.run_numbers(scalars, tail=2)
    assert numbers["trailing_fraction first 2"] == 0.25 and numbers["trailing_fraction last 2"] == 0.75
    assert list(numbers).index("trailing_fraction last 2") > list(numbers).index("response_length last 2")


def test_the_verdict_rule_needs_every_criterion_in_every_seed_at_its_boundaries():
    def numbers(pass16, entropy, trailing):
        return {"pass@16 last": pass16, "entropy last 10": entropy, "trailing_fraction last 10": trailing}

    ttrl = {"seed0": numbers(0.25, 0.1, 0.0), "seed1": numbers(0.5, 0.2, 0.0)}
    # seed0 meets each criterion exactly at its boundary (>= margin, >= ratio, just under the trailing bound)
    arm = {"seed0": numbers(0.30, 0.2, 0.099), "seed1": numbers(0.6, 0.5, 0.05)}
    rows, shown = study.verdict_rows(arm, ttrl, tail=10)
    assert [r[0] for r in rows] == ["seed0", "seed1"] and shown
    assert rows[0][-1] == (True, True, True)
    for seed, broken in (("seed1", numbers(0.54, 0.5, 0.05)), ("seed1", numbers(0.6, 0.39, 0.05)),
                         ("seed0", numbers(0.30, 0.2, 0.1))):  # each criterion failed once, in one seed
        rows, shown = study.verdict_rows(arm | {seed: broken}, ttrl, tail=10)
        assert not shown and sum(not all(r[-1]) for r in rows) == 1
    assert study.verdict_rows({}, ttrl, tail=10) == ([], False)  # no seed in common: no signature


def test_the_word_task_composes_its_overlay_between_the_study_and_the_method():
    assert study.run_configs("addition", "ttrl") == ["configs/demo.yaml", "configs/study.yaml",
                                                     "configs/demo_ttrl.yaml"]
    assert study.run_configs("word", "evol") == ["configs/demo.yaml", "configs/study.yaml",
                                                 "configs/study_reasoning.yaml"]


def test_the_reasoning_config_parses_on_top_of_the_study():
    """The CLI resolves the three files; the word-problem sources it names build and differ only by seed."""
    from evolrl.data import WordProblems

    config = resolved(study.run_configs("word", "ttrl"))
    train, held_out = config["data"]["train"], config["data"]["eval_sets"][0]["init_args"]["source"]
    assert train["class_path"] == held_out["class_path"] == "evolrl.data.WordProblems"
    assert config["data"]["sampling"]["max_new_tokens"] >= 128 and config["data"]["prompt"]["system"]
    assert config["model"]["reward"]["class_path"] == "evolrl.rewards.MajorityVoteReward"  # the method's overlay
    train_set, eval_set = WordProblems(**train["init_args"]).load(), WordProblems(**held_out["init_args"]).load()
    assert {k: v for k, v in train["init_args"].items() if k not in ("seed", "count")} == \
        {k: v for k, v in held_out["init_args"].items() if k not in ("seed", "count")}
    assert not {p.question for p in eval_set} <= {p.question for p in train_set}


def test_the_study_ii_arms_differ_only_where_the_preregistration_says():
    """The four arms of docs/study.md's Study II, as the CLI resolves them on the addition task."""

    def arm(method: str) -> dict:
        config = resolved(study.run_configs("addition", method))["model"]
        reward = config["reward"]
        novelty = (reward["init_args"].get("novelty") or {}).get("init_args", {}).get("novelty_text")
        return {"reward": reward["class_path"].rsplit(".", 1)[1], "novelty_text": novelty,
                "clip": tuple(config["loss"]["policy_loss"]["init_args"][k] for k in ("clip_low", "clip_high")),
                "entropy_coef": config["loss"]["entropy_coef"]}

    arms = {m: arm(m) for m in ("ttrl", "ttrl_clip_entropy", "evol", "evol_until")}
    assert arms["ttrl"] == {"reward": "MajorityVoteReward", "novelty_text": None, "clip": (0.2, 0.2),
                            "entropy_coef": 0.0}
    assert arms["ttrl_clip_entropy"] == {**arms["ttrl"], "clip": (0.2, 0.28), "entropy_coef": 0.003}
    assert arms["evol"] == {"reward": "EvolReward", "novelty_text": "response", "clip": (0.2, 0.28),
                            "entropy_coef": 0.003}
    assert arms["evol_until"] == {**arms["evol"], "novelty_text": "until_answer"}


def test_float32_runs_train_and_sample_in_float32_and_keep_the_rest_of_the_engine(tmp_path):
    """Study II's ``--float32``: the seed overlay sets both dtypes; the engine keeps its class and other settings."""
    overlay = tmp_path / "seed0.yaml"
    overlay.write_text(yaml.safe_dump(study.run_overlay(tmp_path, "evol_until", 0, smoke=False, float32=True)))
    config = resolved(study.run_configs("addition", "evol_until") + [str(overlay)])
    assert config["trainer"]["precision"] == "32-true"
    engine = config["data"]["engine"]
    assert engine["class_path"] == "evolrl.rollout.VLLMEngine"
    assert engine["init_args"]["dtype"] == "float32" and engine["init_args"]["enforce_eager"] is True
    assert study.run_overlay(tmp_path, "evol", 0, smoke=False)["trainer"].get("precision") is None  # off by default


def test_a_run_keeps_the_study_callbacks_and_saves_its_latest_checkpoint(tmp_path):
    """The seed overlay's callbacks replace configs/study.yaml's list, so they repeat it before the checkpoint saver;
    an unfinished run goes on from its newest checkpoint: the ``last.ckpt`` a SIGTERM saved after ``step=10.ckpt``,
    then a ``step=20.ckpt`` saved after it."""
    overlay = tmp_path / "seed0.yaml"
    overlay.write_text(yaml.safe_dump(study.run_overlay(tmp_path, "ttrl", 0, smoke=False)))
    trainer = resolved(study.run_configs("addition", "ttrl") + [str(overlay)])["trainer"]
    assert trainer["enable_checkpointing"] is True
    assert [c["class_path"].rsplit(".", 1)[1] for c in trainer["callbacks"]] == ["PassAtK", "CollapseMonitor",
                                                                                 "EvalResponses", "ModelCheckpoint"]
    saver = trainer["callbacks"][-1]["init_args"]
    assert saver["dirpath"] == str(tmp_path / "ttrl" / "seed0" / "checkpoints")
    assert (saver["every_n_train_steps"], saver["save_top_k"]) == (study.CHECKPOINT_EVERY, 1)

    run = tmp_path / "ttrl" / "seed0"
    assert study.latest_checkpoint(run) is None
    (run / "checkpoints").mkdir(parents=True)
    for age, name in enumerate(["step=10.ckpt", "last.ckpt", "step=20.ckpt"]):  # written in this order
        (run / "checkpoints" / name).write_bytes(b"")
        os.utime(run / "checkpoints" / name, (1e9 + age, 1e9 + age))
        assert study.latest_checkpoint(run).name == name


def test_study_three_adds_a_novelty_floor_that_a_run_without_novelty_fails():
    def numbers(novelty):
        run = {"pass@16 last": 0.6, "entropy last 10": 0.5, "trailing_fraction last 10": 0.0}
        return run if novelty is None else run | {"novelty_mean last 10": novelty}

    ttrl = {"seed0": {"pass@16 last": 0.3, "entropy last 10": 0.1, "trailing_fraction last 10": 0.0}}
    rule = study.RULES["III"]
    rows, shown = study.verdict_rows({"seed0": numbers(0.031)}, ttrl, tail=10, rule=rule)
    assert shown and rows[0][-1] == (True, True, True, True) and rows[0][6] == 0.031
    for flat in (0.03, 0.006, None):  # at the floor, Study II's collapsed run's 0.006, never logged
        rows, shown = study.verdict_rows({"seed0": numbers(flat)}, ttrl, tail=10, rule=rule)
        assert not shown and rows[0][-1][:3] == (True, True, True) and rows[0][-1][3] is False
    assert study.verdict_rows({"seed0": numbers(None)}, ttrl, tail=10)[1]  # Study II's rule has no fourth criterion


def test_the_chain_task_resolves_to_the_probed_candidate():
    """configs/study_chain.yaml, as the CLI composes it for a run, is the candidate the probe picked: its examples,
    bare questions (no instruction kept from configs/study.yaml), the stop string in both samplings."""
    from tools.study.probe import ORDERS_3, REASONING

    picked = REASONING["chain"]["3 terms, 0-9, four worked examples in different orders"]
    data = resolved(study.run_configs("chain", "ttrl"))["data"]
    assert data["prompt"]["examples"] == ORDERS_3 == picked["data"]["prompt"]["examples"]
    for source in (data["train"], data["eval_sets"][0]["init_args"]["source"]):
        assert source["class_path"] == "evolrl.data.AdditionPrompts"
        assert {k: source["init_args"][k] for k in ("terms", "max_operand", "min_operand", "instruction")} == {
            "terms": 3, "max_operand": 9, "min_operand": 0, "instruction": ""}
    for sampling in (data["sampling"], data["eval_sampling"]):
        assert sampling["stop"] == ["</answer>"] and sampling["max_new_tokens"] == picked["sampling"]["max_new_tokens"]


def test_study_three_held_out_four_of_its_training_problems():
    """docs/study.md's addendum to Study III: 4 of its 32 held-out problems are among its 320 training prompts (both
    drawn with replacement from the same 1,000 sums); Study IV keeps them apart (``evolrl.data.Excluding``)."""
    from evolrl.data import AdditionPrompts

    data = resolved(study.run_configs("chain", "ttrl"))["data"]
    train = AdditionPrompts(**data["train"]["init_args"]).load()
    held_out = AdditionPrompts(**data["eval_sets"][0]["init_args"]["source"]["init_args"]).load()
    assert sum(p.question in {t.question for t in train} for p in held_out) == 4 and len(held_out) == 32


def test_an_interrupted_start_counts_up_to_the_checkpoint_the_next_goes_on_from(tmp_path):
    import json
    import time

    parts_file = tmp_path / "parts.json"
    first = study.new_start(parts_file, resume=None)
    assert len(first) == 1 and first[0]["seconds"] is None and first[0]["from"] is None
    checkpoint = tmp_path / "step=20.ckpt"
    checkpoint.write_bytes(b"")
    started = time.mktime(time.strptime(first[0]["started"], study.STARTED))
    os.utime(checkpoint, (started + 600, started + 600))  # saved 10 minutes after the first start
    parts = study.new_start(parts_file, resume=checkpoint)
    assert parts[0]["seconds"] == 600 and parts[0]["until"] == "step=20.ckpt"
    assert parts[1]["from"] == "step=20.ckpt" and parts[1]["seconds"] is None
    assert json.loads(parts_file.read_text()) == parts
    assert len(study.new_start(parts_file, resume=None)) == 1  # started again from the beginning: a new record


def test_study_four_verdict_needs_ttrls_collapse_then_the_paired_gap(tmp_path):
    """``summary --rule IV`` on hand-made runs: per-problem pass@16 from each run's last evaluation file, paired over
    problems and pooled over seeds; inconclusive unless TTRL collapsed in 2 of 3 seeds; shown only with a gap of at
    least +0.05 whose 90% bootstrap interval stays above 0."""
    import json

    def runs(arm: str, right: list[int]) -> list:
        dirs = []
        for seed in range(3):
            directory = tmp_path / arm / f"seed{seed}" / "version_0"
            directory.mkdir(parents=True)
            for step, correct in ((0, [0] * 20), (80, right)):  # the last evaluation is the one read
                rows = [{"id": f"add-{i}", "responses": [{"correct": bool(c)}] * 16} for i, c in enumerate(correct)]
                (directory / f"val_responses_step{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            dirs.append(directory.parent)
        return dirs

    paths = {"evol_until": runs("evol", [1] * 20), "ttrl_watch": runs("ttrl", [1, 0] * 10)}
    gap, low, high, problems = study.paired_pass16(paths["evol_until"], paths["ttrl_watch"])
    assert (gap, problems) == (0.5, 20) and 0.05 < low < gap < high <= 1.0

    def numbers(first: float, last: float) -> dict:
        return {"entropy first 10": first, "entropy last 10": last, "novelty_mean last 10": 0.1, "pass@1 last": 0.5}

    collapsed = {"evol_until": [numbers(1, 1)] * 3, "ttrl_watch": [numbers(1, 0.4), numbers(1, 0.3), numbers(1, 0.9)]}
    assert study.verdict_iv(collapsed, paths, 10) == "shown"
    held = {**collapsed, "ttrl_watch": [numbers(1, 0.41), numbers(1, 0.3), numbers(1, 0.9)]}
    assert study.verdict_iv(held, paths, 10) == "inconclusive at this scale"
    paths["ttrl_watch"] = runs("ttrl_b", [1] * 19 + [0])  # a gap of 0.05 whose interval reaches 0
    assert study.verdict_iv(collapsed, paths, 10) == "not shown"


def test_the_study_four_arms_differ_in_novelty_alone():
    """docs/study.md's Study IV: the TTRL arm takes EVOL-RL's clipping, entropy bonus and answer rules, and watches
    novelty as EVOL-RL reads it; beyond the reward's class and its novelty bands, the resolved runs are the same."""
    evol, ttrl = (resolved(study.run_configs("chain4", m)) for m in ("evol_until", "ttrl_watch"))
    e, t = evol["model"].pop("reward"), ttrl["model"].pop("reward")
    for config in (evol, ttrl):
        config["trainer"].pop("logger")  # its name only
    assert evol == ttrl
    assert (e["class_path"], t["class_path"]) == ("evolrl.rewards.EvolReward", "evolrl.rewards.MajorityVoteReward")
    assert e["init_args"]["answers"] == t["init_args"]["answers"] and e["init_args"]["gate"] == t["init_args"]["gate"]
    assert e["init_args"]["novelty"] == t["init_args"]["watch_novelty"]


def test_study_four_trains_on_none_of_its_96_held_out_problems_and_runs_the_probed_task():
    from evolrl.data import AdditionPrompts, Excluding
    from tools.study.probe import REASONING

    data = resolved(study.run_configs("chain4", "ttrl_watch"))["data"]
    held_out = AdditionPrompts(**data["eval_sets"][0]["init_args"]["source"]["init_args"])
    train = data["train"]["init_args"]
    assert train["exclude"]["init_args"] == data["eval_sets"][0]["init_args"]["source"]["init_args"]
    questions = {p.question for p in held_out.load()}
    prompts = Excluding(AdditionPrompts(**train["source"]["init_args"]), held_out).load()
    assert len(questions) == 96 and not questions & {p.question for p in prompts} and len(prompts) >= 80 * 4
    picked = REASONING["chain"]["3 terms, 1-5, four worked examples in different orders"]
    assert data["prompt"]["examples"] == picked["data"]["prompt"]["examples"]
    assert {k: held_out.__dict__[k] for k in ("terms", "min_operand", "max_operand", "distinct")} == {
        k: picked["source"]["init_args"][k] for k in ("terms", "min_operand", "max_operand", "distinct")}
