"""The paper's data sets by name: MATH-500, AIME 2024 and 2025, AMC, GPQA-Diamond to evaluate; MATH to train.

Neither the EVOL-RL nor the TTRL code loads them from the Hub (both ship JSON files); each name here is the
maintained Hub dataset whose rows match theirs, as lighteval and open-r1 load it. Each becomes rows of
``{prompt, answer, id}``, the format :class:`~evolrl.data.PromptFile` reads, so that
``python -m tools.commands.prepare_data`` can write the same rows for a machine without network:

* answers are strings; AMC's are floats on the Hub (``142.0``), written as integers when whole;
* MATH's training rows hold only a worked ``solution``: the answer is its last ``\\boxed{}``;
* GPQA-Diamond's options (the correct answer and three others) are shuffled with a generator seeded by the row's
  position and ``seed``, listed as ``A) ...`` to ``D) ...`` after the question, and the answer is the letter
  (grade it with :class:`~evolrl.metrics.grading.ChoiceGrader`). The dataset is gated: accept its terms on the Hub
  and log in (``huggingface-cli login``), or use a prepared file.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from evolrl.data.sources import DataError, PromptFile, PromptSource, _check_text, rows_to_prompts
from evolrl.rewards.answers import last_boxed
from evolrl.settings import check_choice, check_int, require
from evolrl.types import Prompt

Row = Mapping[str, Any]


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _gpqa(row: Row, index: int, seed: int) -> tuple[str, str]:
    options = [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Incorrect Answer 3"]]
    order = list(range(4))
    random.Random(f"{seed}:{index}").shuffle(order)
    letters = "ABCD"
    listed = "\n".join(f"{letters[i]}) {str(options[k]).strip()}" for i, k in enumerate(order))
    return f"{str(row['Question']).strip()}\n\n{listed}", letters[order.index(0)]


@dataclass(frozen=True)
class Spec:
    """Where a named set lives on the Hub and how its rows become ``{prompt, answer, id}``."""

    dataset: str
    split: str
    rows: int
    """Rows the set has (the prepare command checks it)."""
    convert: Callable[[Row, int, int], tuple[str, str]]
    """``(row, position, seed) -> (prompt, answer)``."""
    subset: str | None = None
    id_field: str | None = None
    gated: bool = False


def _plain(question: str, answer: str) -> Callable[[Row, int, int], tuple[str, str]]:
    return lambda row, index, seed: (str(row[question]).strip(), _text(row[answer]))


def _boxed(row: Row, index: int, seed: int) -> tuple[str, str]:
    answer = last_boxed(str(row["solution"]))
    if answer is None:
        raise DataError(f"MATH training row {index}: its solution has no \\boxed{{}} answer")
    return str(row["problem"]).strip(), answer.strip()


SETS: dict[str, Spec] = {
    "math500": Spec("HuggingFaceH4/MATH-500", "test", 500, _plain("problem", "answer"), id_field="unique_id"),
    "aime24": Spec("HuggingFaceH4/aime_2024", "train", 30, _plain("problem", "answer"), id_field="id"),
    "aime25": Spec("yentinglin/aime_2025", "train", 30, _plain("problem", "answer"), id_field="id"),
    "amc": Spec("AI-MO/aimo-validation-amc", "train", 83, _plain("problem", "answer"), id_field="id"),
    "gpqa_diamond": Spec("Idavidrein/gpqa", "train", 198, _gpqa, subset="gpqa_diamond", gated=True),
    "math_train": Spec("DigitalLearningGmbH/MATH-lighteval", "train", 7500, _boxed),
}
"""The named sets (module docstring)."""


class Benchmark(PromptSource):
    """One of the paper's data sets by name (``math500``, ``aime24``, ``aime25``, ``amc``, ``gpqa_diamond``,
    ``math_train``), from its Hub dataset or from the file ``prepare_data`` wrote.

    Args:
        name: The set.
        path: Its prepared file (``python -m tools.commands.prepare_data``); null: load it from the Hub.
        dataset: Another Hub name or a local dataset directory with the same columns; null: the set's own.
        seed: GPQA-Diamond's option order.
        limit: Keep only the first rows.
    """

    def __init__(self, name: str, path: str | None = None, dataset: str | None = None, seed: int = 0,
                 limit: int | None = None) -> None:
        check_choice("Benchmark.name", name, tuple(SETS))
        _check_text("Benchmark.path", path, "a file prepare_data wrote", optional=True)
        _check_text("Benchmark.dataset", dataset, "a Hub dataset name or a local dataset directory", optional=True)
        check_int("Benchmark.seed", seed, 0)
        require(limit is None or (isinstance(limit, int) and limit >= 1), "Benchmark.limit", limit,
                allowed="null or an integer >= 1")
        self.name, self.path, self.seed, self.limit = name, path, seed, limit
        self.spec = SETS[name]
        self.dataset = dataset or self.spec.dataset

    def rows(self) -> list[dict[str, str]]:
        """The set as ``{prompt, answer, id}`` rows, from its dataset."""
        table = self._table()
        rows = []
        for index, row in enumerate(table):
            prompt, answer = self.spec.convert(row, index, self.seed)
            key = row.get(self.spec.id_field) if self.spec.id_field else None
            rows.append({"prompt": prompt, "answer": answer, "id": str(key) if key is not None else str(index)})
        return rows[: self.limit] if self.limit else rows

    def load(self) -> list[Prompt]:
        if self.path is not None:
            prompts = PromptFile(self.path).load()
            return prompts[: self.limit] if self.limit else prompts
        return rows_to_prompts(self.rows(), f"{self.name} ({self.dataset})")

    def _table(self):
        try:
            import datasets
        except ImportError as err:
            raise DataError(f"loading {self.name} from the Hub needs `pip install datasets`") from err
        try:
            return datasets.load_dataset(self.dataset, self.spec.subset, split=self.spec.split)
        except Exception as err:
            gated = (f" It is gated: accept its terms at https://huggingface.co/datasets/{self.dataset} and run "
                     "`huggingface-cli login`." if self.spec.gated else "")
            raise DataError(
                f"could not load {self.name} from dataset {self.dataset!r} ({type(err).__name__}: {err}).{gated} "
                "Without network: on a machine with it run `python -m tools.commands.prepare_data --out data/`, copy "
                f"data/ here and set the source's path: data/{'train' if self.name == 'math_train' else 'eval'}/"
                f"{self.name}.json") from err
