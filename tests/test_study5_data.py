"""Study V's data (docs/study.md): held-out problems disjoint from the training problems and the worked examples by
their numbers, not only by their text. The same check on Study IV's configs finds its leak (59 of 96 held-out
problems a training problem reordered, all 4 examples held-out problems), so it can fail."""

from __future__ import annotations

from itertools import combinations_with_replacement
from pathlib import Path

import pytest
import yaml

from evolrl.data import AdditionPrompts, Excluding, numbers_of
from evolrl.settings import SettingError
from tools.study import disjoint

BASE = ["configs/demo.yaml", "configs/study.yaml"]
STUDY5 = BASE + ["configs/study5.yaml"]
SIX = STUDY5 + ["configs/study5_six.yaml"]
STUDY4 = BASE + ["configs/study4.yaml"]
REORDERED = "held-out problems with a training problem's numbers"
EXAMPLE_HELD = "worked examples with a held-out problem's numbers"
EXAMPLE_TRAIN = "worked examples with a training problem's numbers"


def test_the_numbers_of_a_question_in_any_order():
    assert numbers_of("What is 3 + 5 + 4?") == numbers_of("What is 4 + 3 + 5?") == (3, 4, 5)
    assert numbers_of("What is 3 + 3 + 4?") != numbers_of("What is 3 + 4 + 4?")
    assert numbers_of("What is 12 + 7?") == (7, 12)


def test_one_order_of_each_multiset_each_as_likely():
    every = AdditionPrompts(count=84, terms=3, min_operand=1, max_operand=7, seed=3, distinct_numbers=True).load()
    assert sorted(numbers_of(p.question) for p in every) == list(combinations_with_replacement(range(1, 8), 3))
    # a multiset of one order (4 + 4 + 4) is as likely as one of six: over 48 of 84, about 4 of the 7 alike
    draws = [AdditionPrompts(count=48, terms=3, min_operand=1, max_operand=7, seed=seed, distinct_numbers=True)
             for seed in range(40)]
    alike = [sum(len(set(numbers_of(p.question))) == 1 for p in draw.load()) for draw in draws]
    assert 3.5 < sum(alike) / len(alike) < 4.5  # 7 x 48 / 84 = 4.0; the first 48 drawn by order: 1.55
    with pytest.raises(SettingError, match="AdditionPrompts.count=85.*at most 84 with distinct_numbers: true"):
        AdditionPrompts(count=85, terms=3, min_operand=1, max_operand=7, distinct_numbers=True)


def test_excluding_by_numbers_keeps_reorderings_and_the_examples_out():
    held_out = AdditionPrompts(count=20, terms=3, min_operand=1, max_operand=5, seed=1, distinct_numbers=True)
    drawn = AdditionPrompts(count=300, terms=3, min_operand=1, max_operand=5)
    by_text = Excluding(drawn, held_out).load()
    held = {numbers_of(p.question) for p in held_out.load()}
    assert any(numbers_of(p.question) in held for p in by_text)  # the text alone lets reorderings through
    example = "What is 1 + 2 + 2?"
    by_numbers = Excluding(drawn, held_out, match="numbers", questions=[example]).load()
    assert not {numbers_of(p.question) for p in by_numbers} & (held | {numbers_of(example)})
    assert by_numbers == [p for p in by_text if numbers_of(p.question) not in held | {(1, 2, 2)}]  # ids, order kept
    with pytest.raises(SettingError, match="Excluding.match='order'"):
        Excluding(drawn, held_out, match="order")


@pytest.mark.parametrize("configs, held_out, multisets, found", [
    (STUDY5, 48, 48, {REORDERED: 0, EXAMPLE_HELD: 0, EXAMPLE_TRAIN: 0}),
    (SIX, 32, 32, {REORDERED: 0, EXAMPLE_HELD: 0, EXAMPLE_TRAIN: 0}),
    (STUDY4, 96, 34, {REORDERED: 59, EXAMPLE_HELD: 4, EXAMPLE_TRAIN: 3}),  # Study IV's leak (docs/study.md)
], ids=["study5", "study5_six", "study4"])
def test_held_out_problems_are_disjoint_from_training_and_examples_by_numbers(configs, held_out, multisets, found):
    """The configs' own held-out set, training set and worked examples, as ``fit`` composes them."""
    counts = disjoint.overlap(*disjoint.study_sets(configs))
    assert counts["held-out problems"] == held_out
    assert counts["held-out problems, distinct by numbers"] == multisets
    assert {name: counts[name] for name in found} == found
    assert counts["worked examples"] == 4
    if configs is STUDY4:
        assert len(disjoint.leaks(counts)) == 4
        return
    assert disjoint.leaks(counts) == []
    assert counts["training prompts"] >= 40 * 4  # 40 steps of 4 prompts, none drawn twice over


def test_study_five_runs_the_probed_candidates():
    """configs/study5.yaml (and its [1, 6] variant) hold out what the probe's candidates measure, with their
    examples: the qualification measures the runs' own held-out problems."""
    from tools.study.probe import DISJOINT_3, REASONING

    data = disjoint.resolve(STUDY5)["data"]
    assert data["prompt"]["examples"] == DISJOINT_3
    assert data["train"]["init_args"]["questions"] == [e["question"] for e in DISJOINT_3]
    for top, count, source in ((7, 48, data["eval_sets"][0]["init_args"]["source"]),
                               (6, 32, disjoint.resolve(SIX)["data"]["eval_sets"][0]["init_args"]["source"])):
        name = f"3 terms, 1-{top}, one order per multiset, four worked examples in neither set"
        picked = REASONING["chain"][name]
        assert picked["data"]["prompt"]["examples"] == DISJOINT_3
        assert {"count": count, "seed": 1, **picked["source"]["init_args"]}.items() <= source["init_args"].items()


def test_the_study_five_arms_differ_in_their_reward_alone():
    """configs/study5_compare.yaml's arms, resolved as ``fit`` composes them: beyond the reward (and the logger's
    name), the same run; the two EVOL-RL arms differ in the small-spread floor alone."""
    spec = yaml.safe_load((Path(__file__).parent.parent / "configs/study5_compare.yaml").read_text())
    assert spec["configs"] == STUDY5 and spec["seeds"] == [0, 1, 2, 3] and spec["rule"]["baseline"] == "ttrl"
    runs = {arm: disjoint.resolve(spec["configs"] + items) for arm, items in spec["arms"].items()}
    rewards = {arm: run["model"].pop("reward") for arm, run in runs.items()}
    for run in runs.values():
        run["trainer"].pop("logger")
    assert runs["ttrl"] == runs["evol"] == runs["evol_floor"]
    trainer = runs["evol"]["trainer"]  # the budget's fallback: 40 steps, evaluated at steps 0 and 40
    assert trainer["limit_train_batches"] == trainer["val_check_interval"] == 40 and trainer["precision"] == "32-true"
    ttrl, evol, floor = rewards["ttrl"], rewards["evol"], rewards["evol_floor"]
    assert ttrl["class_path"] == "evolrl.rewards.MajorityVoteReward"
    assert evol["class_path"] == "evolrl.rewards.EvolReward"
    assert evol["init_args"]["novelty"] == ttrl["init_args"]["watch_novelty"]  # novelty read alike, watched by TTRL
    assert evol["init_args"]["novelty"]["init_args"]["min_spread"] is None  # the paper's min-max bands
    assert floor["init_args"]["novelty"]["init_args"].pop("min_spread") == 0.1
    evol["init_args"]["novelty"]["init_args"].pop("min_spread")
    assert floor == evol
