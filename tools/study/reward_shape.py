"""What each reward teaches before a run pays for it: the mean advantage of a clean answer and of one with text after
it, per agreement level of the group (``python -m tools.study.study rewards``).

Methods, read as configs/demo.yaml and its overlays read answers (the number fallback on): TTRL
(``MajorityVoteReward``), EVOL-RL with novelty on the whole response (``novelty_text: response``, the paper's) and
EVOL-RL with novelty until the answer (``until_answer``); the advantages are the project's ``group_advantages`` over
each whole group. A response is *trailing* when a letter or digit follows its answer (the reward's own reading, the
``trailing_fraction`` metric's); only the responses that agree with the majority are compared, since those are
what the methods disagree about.

Groups: ``constructed`` ones of 8 answers to "What is 9 + 11?": for k of 8 agreeing on 20 (the others wrong and
clean), every mix of clean "9 + 11 = 20" and trailing variants, in three families: trailing words (texts the first
study's runs wrote), restatements that end on a number ("9 + 11 = 20 So, 9 + 11 = 20."; the second study's runs) and
boxed answers restated ("9 + 11 = \\boxed{20}. The answer is \\boxed{20}."); ``--groups
FILE`` reads recorded groups (JSON: a list of ``{"question", "answer", "texts"}``); ``--sample N`` samples N groups
from the untrained policy of configs/demo.yaml at its training sampling (Hugging Face ``generate``, a few minutes a
group on two cores), and ``--save FILE`` keeps them for ``--groups``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import yaml

from evolrl.algorithms import group_advantages
from evolrl.rewards import AnswerRules, EvolReward, MajorityVoteReward, NoveltyBands, SentenceTransformerEmbedder
from evolrl.types import Prompt, ResponseGroup, RolloutBatch

QUESTION = "What is 9 + 11?"
CLEAN = "9 + 11 = 20"
TRAILING = (" SermatLM is brilliant", ". Great, I love math!",
            "  Your answer has been added to the specified constraints.",
            ". You are correct. The final answer is correct.")
RESTATED = (" So, 9 + 11 = 20.", ". So, the final answer is 20.", ". The answer is 20", " 9 + 11 = 20")
BOXED = "9 + 11 = \\boxed{20}"
BOXED_RESTATED = (". The answer is \\boxed{20}.", " So, 9 + 11 = 20.", ". So, the final answer is 20.")
FAMILIES = {"trailing words": (CLEAN, TRAILING), "restatements ending on a number": (CLEAN, RESTATED),
            "boxed answers restated": (BOXED, BOXED_RESTATED)}
"""Family -> (the clean answer, what its trailing variants append)."""
WRONG = ("9 + 11 = 21", "9 + 11 = 19", "9 + 11 = 22", "9 + 11 = 18")
SIZE = 8


def methods(embedder, fallback_rule: str = "last_number") -> dict:
    """Method label -> reward, with the demo's answer settings."""
    evol = AnswerRules(valid_rule="digit", number_fallback=True, fallback_rule=fallback_rule)
    return {
        "TTRL": MajorityVoteReward(AnswerRules(valid_rule="any", number_fallback=True, fallback_rule=fallback_rule)),
        "EVOL-RL whole": EvolReward(NoveltyBands(embedder, novelty_text="response"), evol),
        "EVOL-RL until answer": EvolReward(NoveltyBands(embedder, novelty_text="until_answer"), evol),
    }


def constructed_groups(clean: str = CLEAN, variants: tuple[str, ...] = TRAILING) -> list[tuple[str, tuple[str, ...]]]:
    """``(question, texts)``: k of 8 agree (8 down to 5), with 1 to k-1 of them ``clean`` plus one of ``variants``."""
    groups = []
    for agree in range(SIZE, SIZE // 2, -1):
        for trailing in range(1, agree):
            texts = [clean] * (agree - trailing) + [clean + variants[i % len(variants)] for i in range(trailing)]
            groups.append((QUESTION, tuple(texts + list(WRONG[: SIZE - agree]))))
    return groups


def sampled_groups(count: int, seed: int = 0) -> list[tuple[str, tuple[str, ...]]]:
    """``count`` groups of 8 from the untrained policy of configs/demo.yaml, at its training sampling."""
    from evolrl.data import AdditionPrompts, render_prompt
    from evolrl.models import load_policy, load_tokenizer
    from evolrl.rollout import HFEngine, Sampling
    from tools.common import ROOT

    demo = yaml.safe_load((ROOT / "configs/demo.yaml").read_text())
    study = yaml.safe_load((ROOT / "configs/study.yaml").read_text())
    tokenizer = load_tokenizer(demo["model"]["model"])
    engine = HFEngine()
    engine.setup(tokenizer)
    engine.load_weights(load_policy(demo["model"]["model"]))
    prompts = AdditionPrompts(**{**study["data"]["train"]["init_args"], "count": count, "seed": seed}).load()
    ids = [render_prompt(tokenizer, p.question, demo["data"]["system_prompt"]) for p in prompts]
    groups = engine.generate(prompts, ids, Sampling(**demo["data"]["sampling"]), n=SIZE, seed=seed)
    return [(g.prompt.question, g.texts) for g in groups]


def shape(groups: list[tuple[str, tuple[str, ...]]], rewards: dict) -> dict:
    """``{method: {agreement: {"clean"|"trailing": [advantages]}}}`` over the majority responses of each group."""
    out = {name: defaultdict(lambda: defaultdict(list)) for name in rewards}
    for i, (question, texts) in enumerate(groups):  # one batch a group: recorded groups may differ in size
        batch = RolloutBatch((ResponseGroup(Prompt(f"g{i}", question), texts),))
        for name, reward in rewards.items():
            scored = reward(batch)
            advantages = group_advantages(scored.rewards)[0]
            majority, trailing = scored.components["majority"][0], scored.components["trailing"][0]
            agree = f"{int(majority.sum())}/{len(texts)}"
            for v in majority.nonzero().flatten().tolist():
                out[name][agree]["trailing" if trailing[v] else "clean"].append(advantages[v].item())
    return out


def table(title: str, shapes: dict) -> str:
    names = list(shapes)
    levels = sorted({a for s in shapes.values() for a in s}, key=lambda a: -int(a.split("/")[0]))
    head = " | ".join(f"{n}: clean | {n}: trailing" for n in names)
    lines = [f"{title}\n", f"| agreement | responses (clean / trailing) | {head} |",
             "|---" * (2 + 2 * len(names)) + "|"]
    for level in levels:
        ref = shapes[names[0]][level]
        cells = []
        for n in names:
            for kind in ("clean", "trailing"):
                values = shapes[n][level][kind]
                cells.append(f"{sum(values) / len(values):+.2f}" if values else "-")
        lines.append(f"| {level} | {len(ref['clean'])} / {len(ref['trailing'])} | {' | '.join(cells)} |")
    return "\n".join(lines)


def report(groups_file: str | None = None, sample: int = 0, save: str | None = None,
           fallback_rule: str = "last_number") -> str:
    rewards = methods(SentenceTransformerEmbedder(device="cpu"), fallback_rule)
    parts = [table(f"Constructed groups, {family}: 8 answers to 'What is 9 + 11?', the majority's mean advantage",
                   shape(constructed_groups(clean, variants), rewards))
             for family, (clean, variants) in FAMILIES.items()]
    recorded = []
    if groups_file:
        recorded = [(g["question"], tuple(g["texts"])) for g in json.loads(Path(groups_file).read_text())]
    if sample:
        sampled = sampled_groups(sample)
        if save:
            Path(save).write_text(json.dumps([{"question": q, "texts": list(t)} for q, t in sampled], indent=1))
        recorded += sampled
    if recorded:
        parts.append(table(f"{len(recorded)} recorded or sampled groups, the majority's mean advantage",
                           shape(recorded, rewards)))
    return "\n\n".join(parts) + f"\n\n(answers read with fallback_rule {fallback_rule}; advantages over each group)"
