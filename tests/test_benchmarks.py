"""The paper's data sets by name (``evolrl.data.Benchmark``) and ``tools.commands.prepare_data``.

No Hub is reachable here: each set is read from a local dataset directory with the Hub dataset's columns (a
README declaring its configuration, as on the Hub), and the offline error is the real one ``datasets`` raises with
``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from evolrl.data import Benchmark, DataError, EvalSet
from evolrl.metrics.grading import ChoiceGrader
from tools.commands.prepare_data import prepare

GPQA = [{"Question": f"Which is right, {i}?", "Correct Answer": f"right {i}", "Incorrect Answer 1": "wrong a",
         "Incorrect Answer 2": "wrong b", "Incorrect Answer 3": "wrong c"} for i in range(4)]
AMC = [{"id": 0, "problem": "What is 71 x 2?", "answer": 142.0, "url": "u"},
       {"id": 1, "problem": "Half of 5?", "answer": 2.5, "url": "u"}]
MATH = [{"problem": "What is 1 + 1?", "solution": "Add: $\\boxed{2}$.", "level": "Level 1", "type": "Algebra"},
        {"problem": "Simplify 2/4.", "solution": "It is $\\frac{1}{2}$, so $\\boxed{\\frac{1}{2}}$.",
         "level": "Level 1", "type": "Algebra"}]


def local(tmp_path: Path, name: str, rows: list[dict], split: str, config: str = "default") -> str:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (directory / "README.md").write_text(f"---\nconfigs:\n- config_name: {config}\n  data_files:\n"
                                         f"  - split: {split}\n    path: rows.jsonl\n---\n")
    return str(directory)


def test_gpqa_options_are_shuffled_by_seed_and_lettered(tmp_path):
    rows = Benchmark("gpqa_diamond", dataset=local(tmp_path, "gpqa", GPQA, "train", "gpqa_diamond")).rows()
    again = Benchmark("gpqa_diamond", dataset=str(tmp_path / "gpqa")).rows()
    other = Benchmark("gpqa_diamond", dataset=str(tmp_path / "gpqa"), seed=1).rows()
    assert rows == again and rows != other
    for i, row in enumerate(rows):
        lines = row["prompt"].splitlines()
        assert lines[0] == f"Which is right, {i}?" and [line[:3] for line in lines[2:]] == ["A) ", "B) ", "C) ", "D) "]
        assert lines[2 + "ABCD".index(row["answer"])] == f"{row['answer']}) right {i}"
    assert len({row["answer"] for row in rows}) > 1  # the correct option moves
    grader = ChoiceGrader()
    assert grader(f"The answer is \\boxed{{{rows[0]['answer']}}}", rows[0]["answer"])[1]


def test_amc_answers_are_integers_when_whole_and_math_answers_come_from_the_last_box(tmp_path):
    amc = Benchmark("amc", dataset=local(tmp_path, "amc", AMC, "train")).load()
    assert [(p.id, p.question, p.answer) for p in amc] == [("0", "What is 71 x 2?", "142"), ("1", "Half of 5?", "2.5")]
    math = Benchmark("math_train", dataset=local(tmp_path, "math", MATH, "train")).load()
    assert [p.answer for p in math] == ["2", "\\frac{1}{2}"] and math[0].id == "0"


def test_offline_the_error_names_the_dataset_and_how_to_make_the_file(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match=r"could not load gpqa_diamond from dataset 'Idavidrein/gpqa'.*It is gated: "
                                        r"accept its terms.*prepare_data --out data/.*path: data/eval/gpqa_diamond"):
        Benchmark("gpqa_diamond").load()


def test_prepare_data_writes_the_files_the_eval_config_reads_with_counts_and_checksums(tmp_path, capsys):
    datasets = {"amc": local(tmp_path, "amc", AMC, "train"),
                "gpqa_diamond": local(tmp_path, "gpqa", GPQA, "train", "gpqa_diamond")}
    manifest = prepare(tmp_path / "out", ["amc", "gpqa_diamond"], datasets)
    assert "gpqa_diamond has 4 rows, the published set 198" in capsys.readouterr().err
    for name, entry in manifest.items():
        data = (tmp_path / "out" / name).read_bytes()
        assert entry["rows"] == len(json.loads(data)) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    # the prepared file, read by path, is the set loaded by name
    by_path = EvalSet(Benchmark("gpqa_diamond", path=str(tmp_path / "out" / "eval" / "gpqa_diamond.json")),
                      name="gpqa_diamond").source.load()
    by_name = Benchmark("gpqa_diamond", dataset=datasets["gpqa_diamond"]).load()
    assert [(p.id, p.question, p.answer) for p in by_path] == [(p.id, p.question, p.answer) for p in by_name]
    assert json.loads((tmp_path / "out" / "MANIFEST.json").read_text()) == manifest


def test_an_unknown_set_name_is_refused_naming_the_sets():
    from evolrl.settings import SettingError

    with pytest.raises(SettingError, match="Benchmark.name='math'.*'math500'"):
        Benchmark("math")


def test_the_paper_eval_config_names_all_five_sets_and_grades_gpqa_by_letter(tmp_path, tiny_model, monkeypatch):
    from helpers import build_config

    from evolrl.cli import main

    monkeypatch.setattr("sys.argv", ["evolrl"])
    root = Path(__file__).parent.parent
    cli = main(["--config", str(build_config(tmp_path, tiny_model)), "--config",
                str(root / "configs" / "paper" / "eval.yaml")], run=False)
    sets = {s.name: s for s in cli.datamodule.eval_sets}
    assert list(sets) == ["math500", "aime24", "aime25", "amc", "gpqa_diamond"]
    assert all(isinstance(s.source, Benchmark) and s.source.name == name for name, s in sets.items())
    assert isinstance(sets["gpqa_diamond"].grader, ChoiceGrader)
