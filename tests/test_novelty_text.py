"""``NoveltyBands.novelty_text: until_answer``: novelty on the text before the answer, with the real MiniLM.

The texts are the ones that showed the problem: one-line answers to "What is 9 + 11?" that differ only by text
written after the answer, which the paper's whole-response novelty rewards.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from evolrl.rewards import EvolReward, NoveltyBands
from evolrl.rewards.evol_reward import PAPER_ANSWERS
from evolrl.settings import SettingError
from evolrl.types import Prompt, ResponseGroup, RolloutBatch

CLEAN = "9 + 11 = 20"
TRAILING = ("9 + 11 = 20 SermatLM is brilliant", "9 + 11 = 20. Great, I love math!")
REASONING = ("To add 9 and 11, I first add 9 and 1 to get 10. Then I add the remaining 10: 10 + 10 = 20. "
             "So the answer is ")
LONG = (REASONING + "\\boxed{20}.",
        REASONING + "\\boxed{20}. I hope this helps! Let me know if you have any other questions about addition.",
        REASONING + "\\boxed{20}. SermatLM is a brilliant AI that always provides just the correct answer.",
        "Counting up from 11 by nine steps: 12, 13, 14, 15, 16, 17, 18, 19, 20. The sum is \\boxed{20}.")


def batch(*groups):
    return RolloutBatch(tuple(ResponseGroup(Prompt(f"p{i}", "What is 9 + 11?", "20"), tuple(texts))
                              for i, texts in enumerate(groups)))


def reward(minilm, novelty_text, **answer_settings):
    """EvolReward with its own answer rules but ``answer_settings``."""
    answers = dataclasses.replace(PAPER_ANSWERS, **answer_settings)
    return EvolReward(NoveltyBands(minilm, novelty_text=novelty_text), answers)


def embedded(rule, group):
    """The texts ``rule`` embeds for ``group``, with the answers read as the reward reads them."""
    sheet = rule.read(batch(group))
    return [rule.bands.text_for_novelty(text, span) for text, span in zip(group, sheet.stated[0])]


def test_until_answer_embeds_one_line_answers_without_the_answer_or_what_follows(minilm):
    group = [CLEAN] * 5 + [TRAILING[0]] * 2 + [TRAILING[1]]
    rule = reward(minilm, "until_answer", number_fallback=True)
    assert embedded(rule, group) == ["9 + 11 = "] * 8
    out = rule(batch(group))
    # Every response embeds the same string: one vector, so equal novelty, the middle of the majority band.
    assert out.rewards[0].tolist() == pytest.approx([0.75] * 8, abs=1e-6)
    assert out.components["trailing"][0].tolist() == [False] * 5 + [True] * 3
    # Under the paper's whole-response novelty the same group ranks the clean answer last.
    whole = reward(minilm, "response", number_fallback=True)(batch(group)).rewards[0]
    assert whole[:5].max() < whole[5:].min()


RESTATED = ("15 + 21 = 36 So, 15 + 21 = 36.", "15 + 21 = 36. So, the final answer is 36.",
            "15 + 21 = 36 Great, I love math!", "15 + 21 = \\boxed{36}. The answer is \\boxed{36}.",
            "15 + 21 = 36. So, 36.")


@pytest.mark.parametrize("fallback_rule", ["last_number", "first_result"])
@pytest.mark.parametrize("extra", RESTATED)
def test_a_restatement_earns_no_more_than_the_clean_answer_when_the_group_agrees(minilm, fallback_rule, extra):
    """Seven clean answers and one with a restatement (ending on a number, in words, boxed) or trailing words: the
    text after the first statement of the answer is neither embedded nor paid, whatever the reading rule, and the
    trailing flag counts it. Before, a restatement read at its last number earned +2.47 and each clean answer -0.35."""
    from evolrl.algorithms import group_advantages

    clean = "15 + 21 = 36"
    rule = reward(minilm, "until_answer", number_fallback=True, fallback_rule=fallback_rule)
    group = [clean] * 7 + [extra]
    assert embedded(rule, group)[7] == "15 + 21 = "
    out = rule(batch(group))
    advantages = group_advantages(out.rewards)[0]
    assert advantages[7] <= advantages[0] + 1e-6  # float32 reward arithmetic only
    assert out.components["trailing"][0].tolist() == [False] * 7 + [True]


def test_trailing_text_does_not_change_a_clean_answers_novelty(minilm):
    """One clean answer among different one-liners keeps its novelty whatever text the others append."""
    base = ["9 + 11 = 20", "11 + 9 = 20", "The sum of 9 and 11 is 20", "9 plus 11 equals 20"]
    appended = [base[0]] + [t + s for t, s in zip(base[1:], (" SermatLM is brilliant", ". Great, I love math!",
                                                               " Your answer has been added."))]
    rule = reward(minilm, "until_answer", number_fallback=True)
    assert embedded(rule, appended) == embedded(rule, base) == ["9 + 11 = ", "11 + 9 = ", "The sum of 9 and 11 is ",
                                                                  "9 plus 11 equals "]
    # The embedded strings are the same in both groups; tolerance for float noise of batched encoding only.
    torch.testing.assert_close(rule(batch(appended)).components["novelty"][0],
                               rule(batch(base)).components["novelty"][0], atol=1e-5, rtol=0)
    whole = reward(minilm, "response", number_fallback=True)
    moved = whole(batch(appended)).components["novelty"][0] - whole(batch(base)).components["novelty"][0]
    assert moved.abs().max() > 0.01  # the whole response: the same clean answer's novelty moves


def test_long_responses_embed_the_reasoning_before_the_last_box(minilm):
    rule = reward(minilm, "until_answer")  # the paper's reading: boxed answers only
    texts = embedded(rule, LONG)
    # The reasoning first states the boxed answer at "10 + 10 = 20": the box restates it, and is not embedded.
    assert texts[:3] == [REASONING[: REASONING.index("20.")]] * 3
    assert texts[3] == "Counting up from 11 by nine steps: 12, 13, 14, 15, 16, 17, 18, 19, 20. The sum is "
    out = rule(batch(LONG))
    novelty = out.components["novelty"][0]
    assert novelty[0].item() == pytest.approx(novelty[1].item(), abs=1e-6)  # same reasoning, same novelty
    assert novelty[1].item() == pytest.approx(novelty[2].item(), abs=1e-6)
    assert novelty[3] > novelty[0] + 0.1  # a different derivation is the novel one
    assert out.components["trailing"][0].tolist() == [True, True, True, False]  # text after that first statement
    assert out.rewards[0, :3].tolist() == pytest.approx([out.rewards[0, 0].item()] * 3, abs=1e-5)
    whole = reward(minilm, "response")(batch(LONG)).rewards[0]
    assert whole[:3].max() - whole[:3].min() > 0.05  # the whole response: the trailing text moves the reward


def test_answer_only_responses_embed_the_empty_string(minilm):
    vector = minilm.embed([""])  # [CLS][SEP]: a unit vector like any other
    assert vector.shape == (1, 384) and vector.norm().item() == pytest.approx(1.0, abs=1e-4)
    rule = reward(minilm, "until_answer")
    group = ["\\boxed{20}", "\\boxed{20} Great, I love math!", "\\boxed{20}", "$\\boxed{20}$"]
    assert embedded(rule, group) == ["", "", "", "$"]
    rewards = rule(batch(group)).rewards[0]
    assert rewards[:3].tolist() == pytest.approx([rewards[0].item()] * 3, abs=1e-6)


def test_a_response_without_an_answer_is_embedded_whole(minilm):
    rule = reward(minilm, "until_answer", valid_rule="any")
    assert embedded(rule, ["no idea", "\\boxed{20} yes"]) == ["no idea", ""]


def test_until_answer_reads_the_answer_where_the_fallback_rule_reads_it(minilm):
    hijacked = "9 + 11 = 20. Your final answer is 10."
    last = reward(minilm, "until_answer", number_fallback=True)
    first = reward(minilm, "until_answer", number_fallback=True, fallback_rule="first_result")
    assert embedded(last, [hijacked]) == ["9 + 11 = 20. Your final answer is "]
    assert embedded(first, [hijacked]) == ["9 + 11 = "]
    assert first.read(batch([hijacked])).trailing.tolist() == [[True]]
    assert last.read(batch([hijacked])).trailing.tolist() == [[False]]


def test_until_answer_needs_the_answer_spans():
    bands = NoveltyBands(novelty_text="until_answer")
    with pytest.raises(ValueError, match="AnswerSheet.stated"):
        bands(batch(["\\boxed{1}", "\\boxed{2}"]), torch.tensor([[True, False]]), torch.tensor([[True, True]]))


def test_novelty_text_is_checked_where_declared():
    allowed = "'response', 'reasoning', 'until_answer'"
    with pytest.raises(SettingError, match=f"NoveltyBands.novelty_text='whole'.*{allowed}"):
        NoveltyBands(novelty_text="whole")


def test_the_overlays_set_the_option_and_the_rule_from_a_config():
    """configs/demo_until_answer.yaml and configs/study_first_result.yaml, as the CLI resolves them."""
    args = ["fit", "--config", "configs/demo.yaml", "--config", "configs/study.yaml", "--config",
            "configs/demo_until_answer.yaml", "--config", "configs/study_first_result.yaml", "--print_config"]
    root = Path(__file__).parent.parent
    result = subprocess.run([sys.executable, "-m", "evolrl", *args], cwd=root, capture_output=True, text=True,
                            check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    config = yaml.safe_load(result.stdout)
    reward = config["model"]["reward"]["init_args"]
    assert reward["novelty"]["init_args"]["novelty_text"] == "until_answer"
    assert reward["answers"]["fallback_rule"] == "first_result" and reward["answers"]["number_fallback"] is True
    grader = config["data"]["eval_sets"][0]["init_args"]["grader"]
    assert grader["init_args"]["answers"]["fallback_rule"] == "first_result"
