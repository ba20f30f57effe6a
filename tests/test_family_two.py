"""Label-free family II: consensus gating (CuMa, SCRL), RESTRAIN, Co-rewarding II's EMA teacher, URLVR's Model
Collapse Step.

Known answers are hand-computed groups (a unanimous vote, a split vote, no answers, one dominant wrong answer)
checked against each paper's formulas as docs/method.md writes them: Co-rewarding's Eq. 10 (reward) and Eq. 11 (EMA
teacher) are numbered as in its paper; RESTRAIN's and SCRL's equation numbers could not be read (only their formulas,
from secondary sources and SCRL's code), so the tests name the formula instead. Advantages use GRPO's std with the
G - 1 denominator and eps 1e-6 (``group_advantages``); tolerances are float32 rounding of a few operations (1e-5).
Runs go through ``python -m evolrl fit`` on the tiny model with the Hugging Face engine.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import scalars, tiny_config

from evolrl.algorithms import GroupAdvantages
from evolrl.callbacks import CollapseMonitor
from evolrl.cli import main
from evolrl.rewards.restrain.prompt_weights import NAME, majority_share, read_shares
from evolrl.rewards import (
    ConsensusGate,
    CoRewardingReward,
    MajorityVoteReward,
    PromptWeights,
    RestrainReward,
    SelfHarmonyReward,
)
from evolrl.settings import SettingError
from evolrl.rewards.co_rewarding import EMATeacher, decay_at
from evolrl.types import Prompt, ResponseGroup, RolloutBatch

ROOT = Path(__file__).parent.parent
LAUNCHER = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")


@pytest.fixture(autouse=True)
def plain_argv(monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])


def batch(*rows: list[str | None]) -> RolloutBatch:
    """One group per row; ``None`` is a response without an answer."""
    groups = tuple(ResponseGroup(Prompt(f"p{i}", "What is 1 + 2?", "3"),
                                 tuple("I do not know." if a is None else f"\\boxed{{{a}}}" for a in row))
                   for i, row in enumerate(rows))
    return RolloutBatch(groups, weights_version=0, trained=torch.stack([torch.arange(len(r)) for r in rows]))


UNANIMOUS = ["3"] * 4
SPLIT = ["3", "3", "4", "5"]
NONE = [None] * 4
WRONG = ["4", "4", "4", "3"]  # one dominant wrong answer


# ---- consensus gating ------------------------------------------------------------------------------------------------
def test_a_gate_closes_the_groups_without_a_majority_share_or_margin():
    classes = MajorityVoteReward().read(batch(UNANIMOUS, SPLIT, NONE, WRONG, ["3", "3", "4", "4"])).answer_class
    # top shares 1, 0.5, 0, 0.75, 0.5; runner-up shares 0, 0.25, 0, 0.25, 0.5
    assert ConsensusGate(min_share=0.5).closed(classes).tolist() == [False, False, True, False, False]
    assert ConsensusGate(min_share=0.6).closed(classes).tolist() == [False, True, True, False, True]
    assert ConsensusGate(min_share=0.5, min_margin=0.3).closed(classes).tolist() == [False, True, True, False, True]


def test_scrl_s_margin_is_strict_so_a_lead_equal_to_it_is_no_label():
    """SCRL's positive label needs ``margin > tau_marg`` (its ``scrl_utils.py``; docs/method.md 4.4): 4 votes
    against 3 of V = 8 lead by exactly 0.125, so at 0.125 the group is gated; its share 0.5 meets ``min_share``."""
    classes = MajorityVoteReward().read(batch(["3", "3", "3", "3", "5", "5", "5", None])).answer_class
    assert ConsensusGate(min_share=0.5, min_margin=0.125).closed(classes).tolist() == [True]
    assert ConsensusGate(min_share=0.5, min_margin=0.12).closed(classes).tolist() == [False]
    assert ConsensusGate(min_share=0.5).closed(classes).tolist() == [False]  # margin 0: no margin
    # 4 against 3 of 10 lead by 0.1 exactly, though 0.4 - 0.3 is 0.10000000000000003 in doubles
    ten = MajorityVoteReward().read(batch(["3"] * 4 + ["5"] * 3 + ["6"] * 3)).answer_class
    assert ConsensusGate(min_share=0.4, min_margin=0.1).closed(ten).tolist() == [True]


def test_masked_groups_keep_their_rewards_but_leave_the_loss():
    out = MajorityVoteReward(gate=ConsensusGate(min_share=0.6))(batch(UNANIMOUS, SPLIT))
    assert out.rewards.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert out.components["left_out"].tolist() == [[False] * 4, [True] * 4]
    assert out.components["gated"].tolist() == out.components["left_out"].tolist()


def test_scrl_negatives_score_rare_uncertain_answers_and_no_answer_minus_one():
    """SCRL's rule (its code's ``scrl_utils``): in a group without a label, -1 for an answer under tau_neg whose
    members' mean token entropy is at least the group's, -1 for no answer, 0 otherwise."""
    rollouts = batch(["3", "3", "4", "5", None, "6", "6", "7"])  # shares 0.25, 0.125, 0.125, -, 0.25, 0.125
    gate = ConsensusGate(min_share=0.5, gated="negative", negative_share=0.2)
    entropy = torch.tensor([[1.0, 1.0, 2.0, 0.5, 1.0, 1.0, 1.0, float("nan")]])  # group mean over known: 1.0714
    rewards, parts = gate(torch.zeros(1, 8), MajorityVoteReward().read(rollouts).answer_class, entropy)
    # "4" (0.125, entropy 2 >= mean): -1; "5" (0.125, 0.5 < mean): 0; "7" (entropy unknown): 0; no answer: -1
    assert rewards.tolist() == [[0, 0, -1, 0, -1, 0, 0, 0]]
    assert parts["gated"].all() and "left_out" not in parts
    without = ConsensusGate(min_share=0.5, gated="negative", negative_share=0.2, entropy_gate=False)
    assert without(torch.zeros(1, 8), MajorityVoteReward().read(rollouts).answer_class)[0].tolist() == [
        [0, 0, -1, -1, -1, 0, 0, -1]]


def test_a_gate_with_the_entropy_rule_reads_the_policy():
    assert MajorityVoteReward(gate=ConsensusGate(gated="negative")).needs_policy
    assert not MajorityVoteReward(gate=ConsensusGate(gated="negative", entropy_gate=False)).needs_policy
    assert not MajorityVoteReward(gate=ConsensusGate()).needs_policy


# ---- RESTRAIN --------------------------------------------------------------------------------------------------------
def grpo(rewards: list[float]) -> torch.Tensor:
    return GroupAdvantages()(torch.tensor([rewards]))[0]


def restrain_advantages(reward: RestrainReward, rollouts: RolloutBatch) -> torch.Tensor:
    return reward.advantages(reward(rollouts), rollouts.trained, GroupAdvantages())


def test_restrain_weighs_every_answer_by_g_of_its_share():
    """Pseudo-label weighting: w_j = g(f_j) / sum_l g(f_l), g(f) = exp(-(f - center)^2 / (2 sigma^2)); the prompt's
    advantage is sum_j w_j A_j, A_j GRPO's with answer j as the label."""
    reward = RestrainReward(sigma=0.5, min_majority=1)
    out = reward(batch(SPLIT))
    g = {0.5: math.exp(-0.25 / 0.5), 0.25: math.exp(-0.5625 / 0.5)}  # shares of "3", "4", "5"
    total = g[0.5] + 2 * g[0.25]
    w3, w4 = g[0.5] / total, g[0.25] / total
    torch.testing.assert_close(out.components["label_weight"][0], torch.tensor([w3, w3, w4, w4]))
    expected = w3 * grpo([1, 1, 0, 0]) + w4 * grpo([0, 0, 1, 0]) + w4 * grpo([0, 0, 0, 1])
    torch.testing.assert_close(restrain_advantages(reward, batch(SPLIT))[0], expected, rtol=1e-5, atol=1e-5)


def test_restrain_on_a_unanimous_vote_no_answers_and_a_dominant_wrong_answer():
    reward = RestrainReward(sigma=0.5, min_majority=2, delta=0.5)
    rollouts = batch(UNANIMOUS, NONE, WRONG)
    advantages = restrain_advantages(reward, rollouts)
    assert advantages[0].abs().max() < 1e-6  # one label, held by all: every A_j is 0
    assert advantages[1].tolist() == [-0.5] * 4  # majority 0 < kappa = 2: penalized, -delta for every response
    w4, w3 = (math.exp(-((f - 1) ** 2) / 0.5) for f in (0.75, 0.25))
    expected = (w4 * grpo([1, 1, 1, 0]) + w3 * grpo([0, 0, 0, 1])) / (w4 + w3)
    torch.testing.assert_close(advantages[2], expected, rtol=1e-5, atol=1e-5)  # the wrong majority still leads
    out = reward(rollouts)
    assert out.components["penalized"][:, 0].tolist() == [False, True, False] and out.rewards[1].tolist() == [0] * 4


def test_restrain_with_its_parts_off_is_ttrl():
    reward = RestrainReward(label_weighting=False, negative_penalty=False)
    rollouts = batch(SPLIT, WRONG, NONE)
    ttrl = GroupAdvantages()(MajorityVoteReward()(rollouts).rewards)
    torch.testing.assert_close(restrain_advantages(reward, rollouts), ttrl)


def test_restrain_prompt_weights_scale_each_prompt_and_average_one():
    """Prompt-level weighting: u_x = g(base model's majority share), here scaled to mean 1 over the prompts."""
    reward = RestrainReward(sigma=0.5, min_majority=1, prompt_weights=PromptWeights())
    reward.set_prompt_weights({"p0": 1.0, "p1": 0.25})
    g1, g2 = 1.0, math.exp(-0.5625 / 0.5)
    assert reward.weights["p0"] == pytest.approx(2 * g1 / (g1 + g2)) and sum(reward.weights.values()) == 2.0
    plain = RestrainReward(sigma=0.5, min_majority=1)
    rollouts = batch(SPLIT, SPLIT)
    torch.testing.assert_close(restrain_advantages(reward, rollouts),
                               restrain_advantages(plain, rollouts) * torch.tensor([[reward.weights["p0"]],
                                                                                    [reward.weights["p1"]]]))
    with pytest.raises(ValueError, match="'p1' has majority share nan"):
        reward.set_prompt_weights({"p0": 1.0, "p1": float("nan")})


def test_the_base_model_s_majority_share_and_a_weights_file_cut_by_a_kill(tmp_path):
    assert majority_share(["\\boxed{3}", "3", "\\boxed{4}", "none"], MajorityVoteReward().answers) == 0.5
    key = {"model": "m", "samples": 8}
    path = tmp_path / f"{NAME}-x.jsonl"
    header = json.dumps({"measured_with": key}) + "\n"
    path.write_text(header + '{"id": "a", "share": 0.5}\n{"id": "b", "sha')
    assert read_shares(path, key) == {"a": 0.5}  # the cut last line is measured again
    path.write_text(header + '{"id": "a", "share": Infinity}\n')
    with pytest.raises(ValueError, match=f"{path.name}:2: share inf is not a number in"):
        read_shares(path, key)
    with pytest.raises(ValueError, match=f"{path.name}: measured with another model, samples than this run's"):
        read_shares(path, {"model": "other", "samples": 4})


# ---- Self-Harmony ----------------------------------------------------------------------------------------------------
def test_self_harmony_takes_the_answer_with_the_largest_harmonic_mean_over_the_two_views():
    """Theorem 3.2's selector, argmax_a 2 p0(a) p1(a) / (p0(a) + p1(a)): the original view votes 5 six times and 7
    twice, the rewrite's answers are 7 x3, 9 x4, 5 x1. HMS(5) = 2(6/8)(1/8)/(7/8) = 3/14, HMS(7) = 2(2/8)(3/8)/(5/8)
    = 0.3, HMS(9) = 0 (one view only): the label is 7, where the majority of either view or of both is not."""
    original = batch(["5", "5", "5", "5", "5", "5", "7", "7"])
    reframed = batch(["7", "7", "7", "9", "9", "9", "9", "5"])
    out = SelfHarmonyReward().against(original, reframed)
    assert out.labels == ("7",) and out.rewards.tolist() == [[0.0] * 6 + [1.0] * 2]
    assert out.components["harmony"][0].tolist() == pytest.approx([3 / 14] * 6 + [0.3] * 2)
    assert out.components["reframed_share"][0, 0].item() == pytest.approx(3 / 8)
    disjoint = SelfHarmonyReward().against(batch(["3", "3", "4", "4"]), batch(["5", "5", "6", None]))
    assert disjoint.labels == (None,) and disjoint.rewards.tolist() == [[0.0] * 4]  # no answer in both: no label
    tie = SelfHarmonyReward().against(batch(["3", "4", "4", "3"]), batch(["4", "3", "3", "4"]))
    assert tie.labels == ("3",)  # equal scores and counts: the class the original view met first


def test_self_harmony_s_settings_are_checked_where_declared():
    with pytest.raises(SettingError, match="SelfHarmonyReward.reframe='Say it again' is not allowed"):
        SelfHarmonyReward(reframe="Say it again")
    with pytest.raises(SettingError, match="SelfHarmonyReward.reframed_samples=0 is not allowed"):
        SelfHarmonyReward(reframed_samples=0)


# ---- Co-rewarding II -------------------------------------------------------------------------------------------------
def test_co_rewarding_scores_agreement_with_the_teacher_s_majority():
    """Eq. 10: r = 1 when the response's answer is the teacher's majority answer, else 0; no teacher answer: 0."""
    policy = batch(SPLIT, WRONG, UNANIMOUS)
    teacher = batch(["4", "4", "3", "4"], UNANIMOUS, NONE)
    out = CoRewardingReward().against(policy, teacher)
    assert out.rewards.tolist() == [[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert out.labels == ("4", "3", None)
    assert out.components["majority"][1].tolist() == [True, True, True, False]  # the policy's own vote, for logs
    with pytest.raises(TypeError, match="teacher"):
        CoRewardingReward()(policy)


def test_the_ema_teacher_follows_eq_11_and_swaps_in_without_a_copy():
    """Eq. 11: teacher <- decay * teacher + (1 - decay) * policy, the decay cosine-annealed over the run."""
    policy = torch.nn.Linear(2, 1)
    with torch.no_grad():
        policy.weight.fill_(1.0)
        policy.bias.fill_(0.0)
    teacher = EMATeacher(policy)
    with torch.no_grad():
        policy.weight.fill_(3.0)
    teacher.update(policy, 0.75)
    assert teacher.tensors["weight"].tolist() == [[1.5, 1.5]]  # 0.75 * 1 + 0.25 * 3
    own = policy.weight.data_ptr()
    with teacher.swapped_into(policy):
        assert policy.weight.tolist() == [[1.5, 1.5]] and policy.weight.data_ptr() == teacher.tensors["weight"].data_ptr()
    assert policy.weight.data_ptr() == own and policy.weight.tolist() == [[3.0, 3.0]]
    # steps 0..9 of 10: the first step has the initial decay and the last the final one (a run of 6 steps ends at 0.99)
    assert decay_at(0, 10, 0.99, 0.9999) == 0.99 and decay_at(9, 10, 0.99, 0.9999) == pytest.approx(0.9999)
    assert decay_at(5, 6, 0.9, 0.99) == pytest.approx(0.99) and decay_at(4, 9, 0.9, 0.99) == pytest.approx(0.945)
    assert decay_at(5, 10, 0.9, None) == 0.9 and decay_at(0, 1, 0.9, 0.99) == 0.9


# ---- URLVR's Model Collapse Step -------------------------------------------------------------------------------------
def test_the_model_collapse_step_is_the_first_step_below_one_percent_reward_accuracy():
    monitor = CollapseMonitor()
    assert monitor.summary()[1].endswith("not measured (the training prompts carry no answers)")
    for step, accuracy in enumerate([0.9, 0.5, 0.02, 0.009, 0.0]):
        monitor.watch_model_collapse(step, accuracy)
    assert monitor.model_collapse_step == 3
    assert monitor.summary()[1] == "Model collapse step (URLVR, the first step with reward accuracy < 0.01): 3"
    fresh = CollapseMonitor()
    fresh.watch_model_collapse(0, 0.5)
    fresh.load_state_dict(monitor.state_dict())
    assert fresh.model_collapse_step == 3 and fresh.accuracy_steps == 5


# ---- through the CLI -------------------------------------------------------------------------------------------------
OVERLAYS = {"restrain": ["demo_restrain"], "co_rewarding": ["demo_co_rewarding"], "self_harmony": ["demo_self_harmony"],
            "ttrl_gated": ["demo_ttrl", "demo_ttrl_gated"], "ttrl_scrl": ["demo_ttrl", "demo_ttrl_scrl"]}


def overlay_run(tmp_path: Path, model: str, method: str, steps: int = 2, extra: dict | None = None) -> list[str]:
    config = yaml.safe_load(tiny_config(tmp_path, model, steps=steps).read_text())
    config["trainer"]["callbacks"].append({"class_path": "evolrl.callbacks.CollapseMonitor"})
    config["trainer"] |= extra or {}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({"trainer": {"default_root_dir": str(tmp_path), "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": str(tmp_path)}}}}))
    args = ["fit", "--config", str(tmp_path / "config.yaml")]
    for name in OVERLAYS.get(method, [f"demo_{method}"]):  # another method: its own overlay
        args += ["--config", str(ROOT / "configs" / f"{name}.yaml")]
    return [*args, "--config", str(own)]


@pytest.mark.parametrize("method", sorted(OVERLAYS))
def test_a_two_step_cli_run_through_each_overlay(tmp_path, tiny_model, method, capsys):
    main(overlay_run(tmp_path, tiny_model, method))
    logged = scalars(tmp_path)
    assert len(logged["train/loss"]) == 2 and all(math.isfinite(v) for v in logged["train/loss"])
    assert {"train/majority_ratio", "train/label_accuracy", "train/entropy"} <= logged.keys()
    printed = capsys.readouterr().out
    assert "Collapse step (CollapseMonitor): none in 2 steps" in printed
    assert "Model collapse step (URLVR, the first step with reward accuracy < 0.01): " in printed
    if method.startswith("ttrl_"):
        assert len(logged["train/gated_groups"]) == 2
    if method == "co_rewarding":
        assert logged["train/teacher_decay"][0] == pytest.approx(0.99) and len(logged["time/teacher"]) == 2
        assert 0 <= logged["train/teacher_share_mean"][0] <= 1
    if method == "self_harmony":
        assert 0 <= logged["train/reframed_share_mean"][0] <= 1
    if method == "restrain":
        (path,) = tmp_path.glob(f"{NAME}-*.jsonl")
        shares = read_shares(path, json.loads(path.read_text().splitlines()[0])["measured_with"])
        assert len(shares) == 8  # every training prompt of the tiny config
        assert {"train/penalized_groups", "train/prompt_weight_mean"} <= logged.keys()


@pytest.mark.parametrize(("setting", "named"), [
    ({"decay": 1.0}, "CoRewardingReward.decay=1.0 is not allowed"),
    ({"decay": 0.0}, "CoRewardingReward.decay=0.0 is not allowed"),
    ({"final_decay": 1.5}, "CoRewardingReward.final_decay=1.5 is not allowed"),
])
def test_a_teacher_decay_outside_0_1_stops_fit_at_start(tmp_path, tiny_model, capsys, setting, named):
    args = overlay_run(tmp_path, tiny_model, "co_rewarding")
    key, value = next(iter(setting.items()))
    with pytest.raises(SystemExit):
        main([*args, f"--model.reward.init_args.{key}", str(value)])
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(("key", "value", "named"), [
    ("gate.min_share", "0", "ConsensusGate.min_share=0"), ("gate.min_share", "1.5", "ConsensusGate.min_share=1.5"),
    ("gate.gated", "drop", "ConsensusGate.gated='drop'"),
])
def test_a_consensus_share_outside_0_1_stops_fit_at_start(tmp_path, tiny_model, capsys, key, value, named):
    with pytest.raises(SystemExit):
        main([*overlay_run(tmp_path, tiny_model, "ttrl_gated"), f"--model.reward.init_args.{key}", value])
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(("key", "value"), [("sigma", ".nan"), ("delta", ".inf"), ("center", ".nan")])
def test_restrain_weights_that_are_not_finite_stop_fit_at_start(tmp_path, tiny_model, capsys, key, value):
    with pytest.raises(SystemExit):
        main([*overlay_run(tmp_path, tiny_model, "restrain"), f"--model.reward.init_args.{key}", value])
    assert f"RestrainReward.{key}=" in capsys.readouterr().err


def test_a_teacher_with_an_off_policy_line_is_refused_at_start(tmp_path, tiny_model, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([*overlay_run(tmp_path, tiny_model, "co_rewarding"), "--data.max_staleness", "1",
              "--data.engine.init_args.report_logprobs", "true",
              "--model.loss.mismatch_correction", "evolrl.algorithms.TokenTruncate"])
    assert stopped.value.code == 2
    assert "data.max_staleness=1 is not allowed: 0 with CoRewardingReward" in capsys.readouterr().err


def run(command: list[str]) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER}, "PYTHONPATH": str(ROOT / "tests")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_kill_9_and_resume_gives_the_weights_and_the_teacher_of_an_uninterrupted_run(tmp_path, tiny_model):
    """Exact, compared with ``torch.equal`` between runs in processes started the same way on this machine."""
    every = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"every_n_train_steps": 1, "save_last": True, "save_top_k": 0}}
    signal = {"class_path": "helpers.SignalAt", "init_args": {"step": 2, "signum": 9}}

    def write(name: str, callbacks: list) -> list[str]:
        args = overlay_run(tmp_path / name, tiny_model, "co_rewarding", steps=4, extra={"enable_checkpointing": True})
        config = yaml.safe_load(Path(args[2]).read_text())
        config["trainer"]["callbacks"] += callbacks
        config["trainer"] |= {"limit_val_batches": 0, "num_sanity_val_steps": 0}
        Path(args[2]).write_text(yaml.safe_dump(config))
        return [sys.executable, "-m", "evolrl", *args, "--ckpt_path", "last"]

    assert run(write("whole", [every])).returncode == 0
    killed = run(write("cut", [every, signal]))
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    resumed = run(write("cut", [every]))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, final = (torch.load(tmp_path / d / "checkpoints" / "last.ckpt", weights_only=True) for d in ("whole", "cut"))
    assert final["global_step"] == expected["global_step"] == 4
    assert all(torch.equal(final["state_dict"][k], v) for k, v in expected["state_dict"].items())
    teacher, uninterrupted = final["evolrl"]["teacher"], expected["evolrl"]["teacher"]
    assert teacher.keys() == uninterrupted.keys() and all(torch.equal(teacher[k], v) for k, v in uninterrupted.items())
    assert not all(torch.equal(teacher[k], final["state_dict"][f"policy.{k}"]) for k in teacher)  # it trails


def test_gpu_budget_counts_the_teacher_a_weights_copy_without_lora_and_the_adapters_with():
    from tools.commands.gpu_budget import QWEN3, QWEN3_COMMON, Update, from_config, states

    QWEN3_1_7B = from_config(QWEN3_COMMON | QWEN3["qwen3-1.7b"])

    def teacher_row(**kwargs) -> tuple:
        return next(r for r in states(QWEN3_1_7B, Update(1, teacher=True, **kwargs)) if r[0].startswith("EMA teacher"))

    assert teacher_row()[2] == QWEN3_1_7B.params * 4
    assert teacher_row(lora_rank=16)[2] == QWEN3_1_7B.lora_params(16) * 4
    assert not any(r[0].startswith("EMA teacher") for r in states(QWEN3_1_7B, Update(1)))


def test_under_lora_the_teacher_is_an_average_of_the_adapters_alone(tmp_path, tiny_model):
    every = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"every_n_train_steps": 1, "save_last": True, "save_top_k": 0}}
    args = overlay_run(tmp_path, tiny_model, "co_rewarding", steps=2,
                       extra={"enable_checkpointing": True, "callbacks": [every]})
    main([*args, "--model.lora.rank", "4"])
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    teacher = checkpoint["evolrl"]["teacher"]
    assert teacher and all(".lora_" in name for name in teacher)
    assert set(teacher) == {k.removeprefix("policy.") for k in checkpoint["state_dict"] if ".lora_" in k}


def test_a_killed_prompt_weight_pass_continues_where_its_file_ends(tmp_path, tiny_model):
    """The pass with the tiny model: a file with a line cut short keeps its whole lines, and only the call whose
    prompts it lacks is sampled again, with that call's seed: the shares are the uninterrupted pass's (both passes in
    this process, with the same seeded sampling, so they compare exactly)."""
    from evolrl.data import AdditionPrompts, RolloutDataModule
    from evolrl.rewards.restrain.prompt_weights import measure_shares, weights_path
    from evolrl.models import load_policy
    from evolrl.rollout import HFEngine, Sampling

    data = RolloutDataModule(AdditionPrompts(count=4), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=2, trained_samples=2, sampling=Sampling(max_new_tokens=4))
    data.setup("fit")
    data.rollouts.push(load_policy(tiny_model))
    rules = MajorityVoteReward().answers
    whole = measure_shares(data, 3, rules, tmp_path / "whole")
    assert sorted(whole) == sorted(p.id for p, _ in data.train_items)
    (written,) = (tmp_path / "whole").glob(f"{NAME}-*.jsonl")
    lines = written.read_text().splitlines()  # the key, then a line per prompt
    key = json.loads(lines[0])["measured_with"]
    cut = weights_path(tmp_path / "cut", key)
    cut.parent.mkdir()
    cut.write_text("\n".join(lines[:3]) + "\n" + lines[3][:9])
    calls = []
    generate = data.rollouts.engine.generate
    data.rollouts.engine.generate = lambda prompts, *a, **k: calls.append(len(prompts)) or generate(prompts, *a, **k)
    resumed = measure_shares(data, 3, rules, cut.parent)
    assert calls == [2]  # the second call, of two prompts, whose first line was cut short
    assert len(cut.read_text().splitlines()) == 5 and read_shares(cut, key) == whole == resumed


def test_an_overlong_penalty_with_restrain_s_own_advantages_is_refused_at_start(tmp_path, tiny_model, capsys):
    with pytest.raises(SystemExit):
        main([*overlay_run(tmp_path, tiny_model, "restrain"), "--model.overlong", "evolrl.algorithms.OverlongPenalty"])
    assert ("model.overlong='OverlongPenalty' is not allowed: null or evolrl.algorithms.OverlongMask with "
            "RestrainReward" in capsys.readouterr().err)
