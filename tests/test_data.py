"""Prompt sources and the DataModule's handling of prompts, on the real data files (bad ones: test_bad_input.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolrl.data import AdditionPrompts, DataError, Excluding, HubDataset, PromptFile, PromptFormat, RolloutDataModule
from evolrl.rollout import HFEngine, Sampling
from evolrl.settings import SettingError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not beside this checkout")


@needs_shared
@pytest.mark.parametrize(("name", "rows"), [("math500.json", 500), ("aime24.json", 30), ("gpqa_diamond.json", 198)])
def test_json_eval_sets(name, rows):
    prompts = PromptFile(str(SHARED / name)).load()
    assert len(prompts) == rows
    assert all(p.question.strip() and p.answer is not None for p in prompts)
    assert len({p.id for p in prompts}) == rows


@needs_shared
def test_verl_parquet_takes_the_user_turn_and_ground_truth():
    prompts = PromptFile(str(SHARED / "math_train.parquet"), id_field="extra_info.index", limit=50).load()
    assert len(prompts) == 50
    first = prompts[0]
    assert first.question.startswith("Let \\[f(x)")  # the user turn, not the system message
    assert first.answer == "0"
    assert first.id == "MATH-TTT-0"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_jsonl_and_field_options(tmp_path):
    path = write(tmp_path, "p.jsonl", '{"q": {"text": "What is 1+1?"}, "sol": 2}\n\n{"q": {"text": "2+2?"}, "sol": 4}\n')
    prompts = PromptFile(path, question_field="q.text", answer_field="sol").load()
    assert [(p.id, p.question, p.answer) for p in prompts] == [("0", "What is 1+1?", "2"), ("1", "2+2?", "4")]


def test_rows_without_answers_are_label_free(tmp_path):
    prompts = PromptFile(write(tmp_path, "p.json", json.dumps([{"problem": "Find x."}]))).load()
    assert prompts[0].answer is None


def test_hub_dataset_loader_reads_a_local_dataset_folder(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"problem": "What is 2+3?", "answer": "5", "id": "a"}\n')
    prompts = HubDataset(str(folder), split="train").load()
    assert [(p.id, p.question, p.answer) for p in prompts] == [("a", "What is 2+3?", "5")]


def test_addition_prompts_are_deterministic():
    a, b = AdditionPrompts(count=5, seed=3).load(), AdditionPrompts(count=5, seed=3).load()
    assert a == b
    for p in a:
        x, y = (int(t) for t in p.question.removeprefix("What is ").removesuffix("?").split(" + "))
        assert p.answer == str(x + y)


def test_addition_prompts_with_more_terms_sum_them_and_keep_the_two_term_stream():
    three = AdditionPrompts(count=20, max_operand=19, seed=2, terms=3).load()
    for p in three:
        numbers = [int(t) for t in p.question.removeprefix("What is ").removesuffix("?").split(" + ")]
        assert len(numbers) == 3 and all(0 <= n <= 19 for n in numbers) and p.answer == str(sum(numbers))
    # The default (two terms) draws as before: the demo's and the regression test's prompts are unchanged.
    assert AdditionPrompts(count=2, seed=0).load()[0].question.startswith("What is 6 + 6?")


def test_addition_prompts_from_a_smallest_operand():
    prompts = AdditionPrompts(count=30, min_operand=10, max_operand=29, seed=4, terms=3).load()
    numbers = [int(t) for p in prompts for t in p.question.removeprefix("What is ").removesuffix("?").split(" + ")]
    assert min(numbers) >= 10 and max(numbers) <= 29 and len(numbers) == 90
    with pytest.raises(SettingError, match="AdditionPrompts.max_operand=9"):
        AdditionPrompts(min_operand=10, max_operand=9)


def test_distinct_additions_and_a_training_set_without_the_held_out_ones():
    held_out = AdditionPrompts(count=96, terms=3, min_operand=1, max_operand=9, seed=1, distinct=True)
    questions = [p.question for p in held_out.load()]
    assert len(set(questions)) == 96 and [p.id for p in held_out.load()] == [f"add-{i}" for i in range(96)]
    drawn = AdditionPrompts(count=400, terms=3, min_operand=1, max_operand=9)
    train = Excluding(drawn, held_out).load()
    assert not {p.question for p in train} & set(questions)  # none of the held-out problems
    assert train == [p for p in drawn.load() if p.question not in set(questions)]  # the rest, ids and order kept
    assert len(train) < 400  # 400 draws from 729 problems: some fall among the 96
    # distinct: false draws as before (every existing config's prompts are unchanged)
    assert AdditionPrompts(count=3, seed=0, distinct=True).load()[0] == AdditionPrompts(count=3, seed=0).load()[0]
    with pytest.raises(SettingError, match="AdditionPrompts.count=126.*at most 125 with distinct: true"):
        AdditionPrompts(count=126, terms=3, min_operand=1, max_operand=5, distinct=True)
    with pytest.raises(DataError, match="nothing is left to train on"):
        Excluding(AdditionPrompts(count=2, seed=1), AdditionPrompts(count=2, seed=1)).load()


def test_worked_examples_come_before_the_question_as_chat_turns(tiny_model):
    from evolrl.data import Example, render_prompt
    from evolrl.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    shots = [Example("What is 3 + 8 + 4?", "3 + 8 = 11. 11 + 4 = 15. <answer>15</answer>"),
             Example("What is 7 + 2 + 9?", "7 + 2 = 9. 9 + 9 = 18. <answer>18</answer>")]
    text = tokenizer.decode(render_prompt(tokenizer, "What is 1 + 2 + 3?", None, shots))
    places = [text.index(t) for t in ("What is 3 + 8 + 4?", "<answer>15</answer>", "What is 7 + 2 + 9?",
                                      "<answer>18</answer>", "What is 1 + 2 + 3?")]
    assert places == sorted(places)
    assert text.count("assistant") == 3  # two answered turns, then the generation prompt
    assert render_prompt(tokenizer, "What is 1 + 2 + 3?", None, ()) == render_prompt(tokenizer, "What is 1 + 2 + 3?",
                                                                                      None)
    data = RolloutDataModule(AdditionPrompts(count=4), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=2, trained_samples=2, prompt=PromptFormat(system=None, examples=shots))
    data.setup("fit")
    prompt, ids = data.train_items[0]
    assert list(ids) == render_prompt(tokenizer, prompt.question, None, shots)


@pytest.mark.parametrize("field", ["question", "response"])
def test_an_empty_worked_example_is_refused(field):
    from evolrl.data import Example

    values = {"question": "What is 1 + 1?", "response": "<answer>2</answer>"} | {field: " "}
    with pytest.raises(SettingError, match=f"Example.{field}"):
        Example(**values)


def test_too_few_prompts_for_a_step_is_a_clear_error(tiny_model):
    data = RolloutDataModule(AdditionPrompts(count=3), model=tiny_model, engine=HFEngine(), prompts_per_step=4,
                             vote_samples=2, trained_samples=2)
    with pytest.raises(DataError, match="3 usable prompts but prompts_per_step=4"):
        data.setup("fit")


def test_the_engine_is_told_the_largest_call(tiny_model):
    """The data module tells the engine its largest generate call (the vLLM engine sizes its KV cache by it):
    the most sequences at once and the longest prompt it will send plus the most new tokens."""
    from evolrl.data import EvalSet

    engine = HFEngine()
    data = RolloutDataModule(AdditionPrompts(count=8), model=tiny_model, engine=engine, prompts_per_step=2,
                             vote_samples=4, trained_samples=2, sampling=Sampling(max_new_tokens=10),
                             prompt=PromptFormat(max_tokens=300),
                             eval_sets=[EvalSet(AdditionPrompts(count=4), "add")], eval_samples=8,
                             eval_prompts_per_batch=3, eval_sampling=Sampling(max_new_tokens=20))
    data.setup("fit")
    longest = max(len(ids) for items in (data.train_items, *data.eval_items) for _, ids in items)
    assert longest < 300  # the prompts actually kept, not the limit, size the call
    assert (engine.max_sequences, engine.max_tokens) == (3 * 8, longest + 20)


def test_kv_cache_is_sized_for_that_call(tiny_model):
    import torch
    from transformers import AutoConfig

    from evolrl.rollout.vllm_engine import kv_cache_bytes

    config = AutoConfig.from_pretrained(tiny_model)  # 2 layers, 2 KV heads of 32
    per_token = 2 * 2 * 2 * 32 * 2  # K and V, layers, heads, head dim, bf16 bytes
    # Whole blocks of 128 tokens per sequence (one for 70 tokens, two for 200), plus one block.
    assert kv_cache_bytes(config, 24, tokens=70, dtype=torch.bfloat16) == (24 * 1 + 1) * 128 * per_token
    assert kv_cache_bytes(config, 24, tokens=200, dtype=torch.bfloat16) == (24 * 2 + 1) * 128 * per_token
