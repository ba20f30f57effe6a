import itertools
import math
import random

import pytest
import torch

from helpers import majority_vote

from evolrl.metrics import label_free_diagnostics, maj_at_k, pass_at_k
from evolrl.rewards import MajorityVoteReward, group_answers
from evolrl.types import Prompt, ResponseGroup, RewardOutput, RolloutBatch


def test_pass_at_k_known_values():
    assert pass_at_k(32, 1, 16) == 0.5
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 8) == 1.0  # fewer than k wrong samples


def test_pass_at_k_matches_enumeration():
    for n, c, k in [(6, 2, 3), (7, 1, 4), (5, 3, 2), (8, 4, 8)]:
        hits = [any(i < c for i in subset) for subset in itertools.combinations(range(n), k)]
        assert pass_at_k(n, c, k) == pytest.approx(sum(hits) / len(hits), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def maj_by_enumeration(answers, correct, k):
    """Every ordered draw of k of the n answers, voted with majority_vote (first seen wins ties)."""
    classes = group_answers(answers)
    wins = []
    for draw in itertools.permutations(range(len(answers)), k):
        label, flags = majority_vote([answers[i] for i in draw])
        if label is None:
            wins.append(False)
            continue
        chosen = draw[flags.index(True)]
        wins.append(correct[classes.index(classes[chosen])])
    return sum(wins) / len(wins)


def test_maj_at_k_matches_enumeration():
    rng = random.Random(0)
    pool = ["1", "2", "3", r"\frac{2}{2}", None]
    for _ in range(40):
        n = rng.randint(1, 7)
        k = rng.randint(1, n)
        answers = [rng.choice(pool) for _ in range(n)]
        correct = [a in ("1", r"\frac{2}{2}") for a in answers]
        assert maj_at_k(answers, correct, k) == pytest.approx(maj_by_enumeration(answers, correct, k), abs=1e-12)


def test_maj_at_k_special_cases():
    answers = ["7"] * 20 + ["8"] * 12
    correct = [a == "7" for a in answers]
    assert maj_at_k(answers, correct, 1) == pytest.approx(20 / 32)
    assert maj_at_k(answers, correct, 32) == 1.0
    # k = 2 of {7 x1, 8 x1}: a tie always; each wins half the time
    assert maj_at_k(["7", "8"], [True, False], 2) == 0.5
    assert maj_at_k([None, None], [False, False], 1) == 0.0
    assert maj_at_k([str(i) for i in range(64)], [i == 3 for i in range(64)], 16) == pytest.approx(1 / 64)
    with pytest.raises(ValueError):
        maj_at_k(["1"], [True], 2)


def test_label_free_diagnostics_by_hand():
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    out = RewardOutput(
        rewards=rewards,
        answers=(("7", "7", "8", None), ("3", "3", "3", "3")),
        labels=("7", "3"),
        components={
            "valid": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool(),
            "majority": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]).bool(),
            "answer_class": torch.tensor([[0, 0, 1, -1], [0, 0, 0, 0]]),
            "novelty": torch.tensor([[0.2, 0.4, float("nan"), float("nan")], [0.0, 0.0, 0.0, 0.6]]),
            "novelty_spread": torch.tensor([[0.2, 0.2, float("nan"), float("nan")], [0.6, 0.6, 0.6, 0.6]]),
        },
    )
    stats = label_free_diagnostics(out, truths=["8", None], truncated=torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]]))
    assert stats["reward_mean"] == pytest.approx(0.75)
    assert stats["reward_std"] == pytest.approx(0.4330127, abs=1e-6)
    assert stats["zero_variance_groups"] == 0.5
    assert stats["valid_rate"] == 7 / 8
    assert stats["majority_ratio"] == 6 / 8
    assert stats["distinct_answers"] == 1.5
    assert stats["novelty_mean"] == pytest.approx(1.2 / 6)
    assert stats["novelty_spread_mean"] == pytest.approx(2.8 / 6)  # per response, over those in a group of two or more
    assert stats["truncation_rate"] == 1 / 8
    assert stats["label_accuracy"] == 0.0  # prompt 0 voted 7, truth 8; prompt 1 has no truth
    # prompt 0: majority flags [1,1,0,0] vs correct [0,0,1,0] -> agree on the last one only
    assert stats["reward_accuracy"] == 0.25
    assert "label_accuracy" not in label_free_diagnostics(out)
    assert "trailing_fraction" not in stats  # a reward without the component: nothing logged


def test_label_free_diagnostics_of_a_step_without_a_scored_response_warn_nothing():
    """Every reward NaN (none scored): the reward statistics are NaN, and torch's std() of nothing warns no one."""
    import warnings

    out = RewardOutput(rewards=torch.full((1, 2), float("nan")), answers=(("1", "2"),), labels=("1",), components={})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = label_free_diagnostics(out)
    assert math.isnan(stats["reward_mean"]) and math.isnan(stats["reward_std"])


def test_trailing_fraction_counts_responses_with_text_after_their_answer():
    """From a reward's own reading: the study's outputs, read with the last-number fallback."""
    texts = ("9 + 11 = 20", "9 + 11 = 20 SermatLM is brilliant", "9 + 11 = 20. Great, I love math!",
             "9 + 11 = 20.", "The answer is \\boxed{20}.", "no answer at all")
    out = MajorityVoteReward()(RolloutBatch((ResponseGroup(Prompt("p", "What is 9 + 11?"), texts),)))
    assert out.components["trailing"][0].tolist() == [False, True, True, False, False, False]
    assert label_free_diagnostics(out)["trailing_fraction"] == pytest.approx(2 / 6)  # a float32 mean


# ---- pass@k / maj@k as torchmetrics metrics -------------------------------------------------------------------

ANSWERS = {  # problem id -> (answers, correct): 4 samples each
    "p0": (["1", "1", "2", "3"], [True, True, False, False]),
    "p1": (["7", "8", "8", "9"], [False, True, True, False]),
    "p2": (["5", "5", "5", "5"], [False, False, False, False]),
    "p3": (["0", "1", "0", None], [True, False, True, False]),
    "p4": (["x", "y", "z", "w"], [False, False, False, True]),
}


def by_hand(ids, pass_ks=(1, 2), maj_ks=(2, 3)):
    """The mean over problems of the exact per-problem functions."""
    rows = [ANSWERS[i] for i in ids]
    out = {f"pass@{k}": sum(pass_at_k(4, sum(c), k) for _, c in rows) / len(rows) for k in pass_ks}
    out |= {f"maj@{k}": sum(maj_at_k(a, c, k) for a, c in rows) / len(rows) for k in maj_ks}
    return out


def batch(ids):
    return [ANSWERS[i][0] for i in ids], [ANSWERS[i][1] for i in ids]


def test_eval_metrics_are_the_mean_of_the_exact_per_problem_values():
    from evolrl.metrics import EvalMetrics, MajAtKMetric, PassAtKMetric

    metric = EvalMetrics(pass_ks=(1, 2), maj_ks=(2, 3))
    metric.update(*batch(["p0", "p1"]), ids=["p0", "p1"])
    metric.update(*batch(["p2", "p3", "p4"]), ids=["p2", "p3", "p4"])
    values = metric.compute()
    assert values.keys() == {"pass@1", "pass@2", "maj@2", "maj@3", "problems", "samples"}
    assert values["problems"] == 5 and values["samples"] == 4
    for name, expected in by_hand(list(ANSWERS)).items():
        assert values[name].item() == pytest.approx(expected, abs=1e-15), name
    # the one-k metrics give the same numbers, as scalars
    for cls, k, name in ((PassAtKMetric, 2, "pass@2"), (MajAtKMetric, 3, "maj@3")):
        single = cls(k)
        single.update(*batch(list(ANSWERS)), ids=list(ANSWERS))
        assert single.compute().ndim == 0 and single.compute().item() == pytest.approx(values[name].item())
    metric.reset()
    metric.update(*batch(["p2"]), ids=["p2"])
    assert metric.compute()["pass@2"] == 0.0 and metric.compute()["problems"] == 1


def test_a_repeated_problem_id_counts_once_and_problems_without_ids_all_count():
    from evolrl.metrics import PassAtKMetric

    metric = PassAtKMetric(1)
    metric.update(*batch(["p0", "p1"]), ids=["p0", "p1"])
    # p0 again (as Lightning's distributed sampler pads), now with other samples: the first one counts
    metric.update([["9"] * 4], [[True] * 4], ids=["p0"])
    assert metric.compute().item() == pytest.approx(by_hand(["p0", "p1"])["pass@1"])
    anonymous = PassAtKMetric(1)
    anonymous.update(*batch(["p0", "p0"]))
    anonymous.update([["9"] * 4], [[True] * 4])
    assert anonymous.compute().item() == pytest.approx((0.5 + 0.5 + 1.0) / 3)


def test_problem_ids_hash_the_same_in_every_process():
    import subprocess
    import sys

    from evolrl.metrics import problem_key

    code = "from evolrl.metrics import problem_key; print(problem_key('math500/17'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout
    assert int(other) == problem_key("math500/17") >= 0
    assert problem_key("a") != problem_key("b")


def test_a_k_larger_than_the_samples_is_an_error():
    from evolrl.metrics import EvalMetrics

    metric = EvalMetrics(pass_ks=(1, 8), maj_ks=(4,))
    with pytest.raises(ValueError, match="pass@1, pass@8, maj@4 need at least 8 samples per problem, but problem "
                                         "'p0' has 4"):
        metric.update(*batch(["p0"]), ids=["p0"])


def test_metric_values_stay_float64_on_a_bf16_module():
    from evolrl.metrics import PassAtKMetric

    module = torch.nn.Module()
    module.metric = PassAtKMetric(1)
    module.to(torch.bfloat16)
    module.metric.update([["1", "2", "3"]], [[True, False, False]])
    assert module.metric.compute().item() == pytest.approx(1 / 3, abs=1e-15)


def _two_rank_worker(rank: int, port: int, out: str) -> None:
    import json
    from pathlib import Path

    import torch.distributed as dist

    from evolrl.metrics import EvalMetrics, PassAtKMetric

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        metric = EvalMetrics(pass_ks=(1, 2), maj_ks=(2, 3))
        # 5 problems dealt to 2 ranks, p0 repeated on rank 1 to even them out (with other samples)
        if rank == 0:
            metric.update(*batch(["p0", "p1"]), ids=["p0", "p1"])
            metric.update(*batch(["p2"]), ids=["p2"])
        else:
            metric.update(*batch(["p3", "p4"]), ids=["p3", "p4"])
            metric.update([["9"] * 4], [[True] * 4], ids=["p0"])
        only_rank0 = PassAtKMetric(2)  # rank 1 never sees a problem
        if rank == 0:
            only_rank0.update(*batch(["p0", "p1"]), ids=["p0", "p1"])
        report = {name: value.item() for name, value in metric.compute().items()}
        report["only_rank0"] = only_rank0.compute().item()
        report["local_rows"] = len(torch.cat(metric.problem_ids))  # back to this rank's own states after compute
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_two_ranks_gather_their_problems_and_count_each_once(tmp_path):
    import json

    import torch.multiprocessing as mp
    from helpers import free_port

    port = free_port()
    mp.spawn(_two_rank_worker, args=(port, str(tmp_path)), nprocs=2)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r.pop("local_rows") for r in reports] == [3, 3]
    assert reports[0] == reports[1]
    assert reports[0]["problems"] == 5 and reports[0]["samples"] == 4
    for name, expected in by_hand(list(ANSWERS)).items():  # p0 with rank 0's samples
        assert reports[0][name] == pytest.approx(expected, abs=1e-12), name
    assert reports[0]["only_rank0"] == pytest.approx(by_hand(["p0", "p1"])["pass@2"])
