"""Stop strings (``Sampling.stop``): a response ends at the token that completes the first stop string, kept in it,
and is not counted as truncated. The Hugging Face engine here; the vLLM engine in ``tests/test_vllm.py``.

A seeded engine draws the same tokens whether or not a stop string ends the response early, so the response with a
stop string must be the start of the one without it, cut exactly where the string is first written whole.
"""

from __future__ import annotations

import pytest
from helpers import stops_where_written, written_at

from evolrl.data.chat import render_prompt
from evolrl.models import load_policy, load_tokenizer
from evolrl.rollout import HFEngine, Sampling
from evolrl.rollout.engine import build_group, stop_token_ids
from evolrl.settings import SettingError
from evolrl.types import Prompt


def test_build_group_cuts_after_the_token_that_completes_the_string(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    ids = tokenizer.encode("We add: 1 + 2 = 3, so <answer>3</answer> and more text")
    group = build_group(Prompt("p", "q"), [1], responses=[ids], stops=stop_token_ids(tokenizer),
                        max_new_tokens=len(ids), tokenizer=tokenizer, stop_strings=("</answer>",))
    (kept,) = group.response_ids
    assert list(kept) == ids[: written_at(ids, "</answer>", tokenizer)]
    assert group.texts[0].startswith("We add: 1 + 2 = 3, so <answer>3</answer>") and "more" not in group.texts[0]
    assert group.truncated == (False,)  # ended by its stop string, not by the limit
    # Without a stop string written, nothing is cut; at the limit it is truncated.
    plain = build_group(Prompt("p", "q"), [1], responses=[ids], stops=stop_token_ids(tokenizer),
                        max_new_tokens=len(ids), tokenizer=tokenizer, stop_strings=("</nothing>",))
    assert plain.response_ids == (tuple(ids),) and plain.truncated == (True,)


def test_the_hf_engine_stops_at_a_stop_string_and_keeps_it(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    engine = HFEngine()
    engine.setup(tokenizer)
    engine.load_weights(load_policy(tiny_model))
    prompts = [Prompt("a", "What is 3 + 4?")]
    ids = [render_prompt(tokenizer, p.question, None) for p in prompts]
    stops_where_written(engine, prompts, ids, tokenizer)


def test_stop_strings_are_checked_where_declared():
    with pytest.raises(SettingError, match="Sampling.stop"):
        Sampling(stop=("",))
    assert Sampling(stop=["</answer>"]).stop == ("</answer>",)
