"""Where a response's final answer starts, tokens before it, and the guess floor (tools.study.probe_responses)."""

import json

import lightning as L
import pytest

from evolrl.callbacks import EvalResponses
from evolrl.data import EvalSet, RolloutDataModule, WordProblems
from evolrl.models import load_tokenizer
from evolrl.rewards import AnswerRules
from evolrl.rollout import HFEngine, Sampling
from evolrl.training import EvolRLModule
from evolrl.compare.paired import read_rows
from tools.study.probe_responses import (
    answer_start,
    response_measures,
    tokens_before_answer,
    ways_to_majority,
)


def answer_of(text: str) -> str | None:
    """The answer the default ``AnswerRules`` read in ``text``, or ``None``."""
    span = AnswerRules().read(text)
    return None if span is None else span.answer


@pytest.mark.parametrize(("text", "prefix"), [
    ("Sam has 7 + 5 = 12, then 12 - 3 = 9. So Sam has 9 apples.", "Sam has 7 + 5 = 12, then 12 - 3 = 9. So Sam has "),
    ("7 + 5 = 12 and 12 - 3 = 9, \\boxed{9}. That was 3 steps.", "7 + 5 = 12 and 12 - 3 = 9, "),
    ("First \\boxed{4}, then \\boxed {9}", "First \\boxed{4}, then "),
    ("Sum 55 and 555", "Sum 55 and "),
    ("<think>try 3 + 4 = 7</think> The answer is 8.", "<think>try 3 + 4 = 7</think> The answer is "),
    ("1,000 + 200 = 1,200", "1,000 + 200 = "),
])
def test_the_answer_starts_where_the_rules_read_it(text, prefix):
    start = answer_start(text)
    assert text[:start] == prefix
    assert text[start:].startswith(answer_of(text)) or text[start:].startswith("\\boxed")


def test_no_answer_no_position():
    assert answer_start("no number here") is None
    assert answer_start("only 5 apples", number_fallback=False) is None


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(tiny_model)


def test_tokens_before_the_answer_count_the_prefix(tokenizer):
    text = "We add the numbers: 1 + 2 = 3, so the result is \\boxed{3}."
    prefix = "We add the numbers: 1 + 2 = 3, so the result is "
    assert tokens_before_answer(text, tokenizer) == len(tokenizer(prefix, add_special_tokens=False)["input_ids"]) > 5
    assert tokens_before_answer("3", tokenizer) == 0
    assert tokens_before_answer("none", tokenizer) is None


def test_measures_of_written_rows(tokenizer):
    rows = [{"truth": "9", "responses": [{"text": "so 9", "tokens": [1, 2, 3]}, {"text": "no", "tokens": [1]}]},
            {"truth": "9", "responses": [{"text": "1 + 2 = 3", "tokens": [1, 2, 3, 4, 5]},
                                         {"text": "7", "tokens": [1]}]},
            {"truth": "4", "responses": [{"text": "x", "tokens": None}, {"text": "x", "tokens": None}]}]
    m = response_measures(rows, tokenizer)
    assert m["guess"] == pytest.approx(2 / 3)  # "9" is the truth of 2 of the 3 problems
    assert m["answered"] == pytest.approx(3 / 6)
    counts = sorted(tokens_before_answer(t, tokenizer) for t in ("so 9", "1 + 2 = 3", "7"))
    assert m["tokens before answer"] == counts[1] and counts[0] == 0 < counts[1]
    assert m["response tokens"] == 2  # median of 3, 1, 5, 1 (the rows without tokens are left out)


def test_eval_responses_writes_every_response_of_a_validate_run(tiny_model, tmp_path):
    """A real validation with the tiny model: the file holds each problem's truth and every sampled response."""
    module = EvolRLModule(tiny_model)
    problems = WordProblems(count=3, seed=2)
    data = RolloutDataModule(WordProblems(count=8), model=tiny_model, engine=HFEngine(),
                             sampling=Sampling(max_new_tokens=6),
                             eval_sets=[EvalSet(problems, "word")], eval_samples=2, eval_prompts_per_batch=2)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[EvalResponses(output_dir=str(tmp_path))])
    trainer.validate(module, data, verbose=False)
    rows = read_rows(tmp_path / "val_responses_step0.jsonl")
    expected = [(p.id, p.question, p.answer) for p in problems.load()]
    assert [(r["id"], r["question"], r["truth"]) for r in rows] == expected
    tokenizer = load_tokenizer(tiny_model)
    for row in rows:
        assert row["dataset"] == "word" and len(row["responses"]) == 2
        for r in row["responses"]:
            assert 1 <= len(r["tokens"]) <= 6
            assert tokenizer.decode(r["tokens"], skip_special_tokens=True).strip() == r["text"].strip()
            assert r["answer"] == answer_of(r["text"]) and r["correct"] == (r["answer"] == row["truth"])
    assert json.loads(json.dumps(rows)) == rows


def test_ways_to_the_majority_answer_count_the_texts_before_its_first_statement():
    texts = ["3 + 8 = 11. 11 + 4 = 15. <answer>15</answer>",
             "3 + 8 = 11. 11 + 4 = 15. <answer>15</answer>",  # the same way again
             "3 + 8 + 4 = 15. <answer>15</answer>",
             "3 + 8 = 11. 11 + 4 = 15 So 15. <answer>15</answer>",  # a restatement after the first: the first way
             "3 + 8 = 12. <answer>12</answer>"]
    assert ways_to_majority(texts) == 2
    assert ways_to_majority(texts[:1] + texts[4:]) is None  # no answer given twice


def test_marked_counts_answers_in_a_box_or_marker(tokenizer):
    rows = [{"truth": "15", "responses": [{"text": "11 + 4 = 15. <answer>15</answer>", "tokens": [1]},
                                          {"text": "so \\boxed{15}", "tokens": [1]},
                                          {"text": "11 + 4 = 15. <answer>15", "tokens": [1]},  # not closed
                                          {"text": "15", "tokens": [1]}]}]
    m = response_measures(rows, tokenizer)
    assert m["marked"] == pytest.approx(2 / 4) and m["answered"] == 1.0
    assert m["ways to majority"] == 3  # "11 + 4 =" twice (marker or not), "so", nothing


def test_every_worked_example_of_the_probe_adds_up():
    """Each step "a + b = c." of every chained-sum example is right, and its marker holds the question's sum."""
    import re

    from tools.study.probe import REASONING

    for name, task in REASONING["chain"].items():
        for example in task["data"]["prompt"]["examples"]:
            numbers = [int(n) for n in re.findall(r"\d+", example["question"])]
            steps = re.findall(r"(\d+) \+ (\d+) = (\d+)\.", example["response"])
            assert steps and all(int(a) + int(b) == int(c) for a, b, c in steps), (name, example)
            assert answer_of(example["response"]) == str(sum(numbers)), (name, example)
