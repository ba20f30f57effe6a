"""Where prompts come from. Each source is a small class, selected in a config by ``class_path``.

* :class:`PromptFile`: a local JSON array, JSONL or parquet file;
* :class:`HubDataset`: a Hugging Face dataset by name (needs the ``datasets`` package);
* :class:`~evolrl.data.generated.AdditionPrompts`: additions the project generates itself (generated.py).

Rows become :class:`~evolrl.types.Prompt` s. A row's question is the ``prompt`` field, which may be
a string or a chat (a list of ``{role, content}``; the last user turn is the question). The ground
truth, when present (``answer`` or ``reward_model.ground_truth``), travels with the prompt for
metrics only. Bad rows raise :class:`DataError` naming the file, row and field; nothing is dropped
silently.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evolrl.rewards.verifier_reward import ANSWER_HINT
from evolrl.settings import check_int, require
from evolrl.types import Prompt, unanswered

QUESTION_FIELDS = ("prompt", "problem", "question")
ANSWER_FIELDS = ("answer", "reward_model.ground_truth", "ground_truth")


class DataError(ValueError):
    """A data source or one of its rows cannot be used."""


class PromptSource(ABC):
    """Produces the list of prompts to train or evaluate on."""

    @abstractmethod
    def load(self) -> list[Prompt]:
        """All prompts, in a stable order."""


def require_answers(prompts: Sequence[Prompt], who: str) -> None:
    """DataError naming the prompts without a ground-truth answer, for ``who``, a reward that reads them: checked over
    every training prompt at start, where a check per batch meets a bad row only when the shuffle does."""
    missing = unanswered(prompts)
    if missing:
        raise DataError(f"{who} needs a ground-truth answer for every training prompt: {missing}. {ANSWER_HINT}")


def _check_text(key: str, value: Any, what: str, optional: bool = False) -> None:
    """``value`` is a non-empty string (or ``None`` when ``optional``)."""
    ok = (optional and value is None) or (isinstance(value, str) and bool(value.strip()))
    require(ok, key, value, allowed=f"{what} (a non-empty string)" + (", or null" if optional else ""))


def _check_fields(owner: str, question_field: Any, answer_field: Any, id_field: Any, limit: Any) -> None:
    """The row-reading settings :class:`PromptFile` and :class:`HubDataset` share."""
    _check_text(f"{owner}.question_field", question_field, "a field name, dotted for nested fields", optional=True)
    _check_text(f"{owner}.answer_field", answer_field, "a field name, dotted for nested fields", optional=True)
    _check_text(f"{owner}.id_field", id_field, "a field name, dotted for nested fields")
    if limit is not None:
        check_int(f"{owner}.limit", limit, 1)


def _field(row: Mapping[str, Any], dotted: str) -> Any:
    value: Any = row
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _question(value: Any) -> Any:
    """A chat's last user message, or the value itself."""
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, str)):
        turns = [t for t in list(value) if isinstance(t, Mapping) and t.get("role") == "user"]
        return turns[-1].get("content") if turns else None
    return value


def rows_to_prompts(
    rows: Iterable[Mapping[str, Any]],
    where: str,
    question_field: str | None = None,
    answer_field: str | None = None,
    id_field: str = "id",
) -> list[Prompt]:
    """Validate rows and build prompts; ``where`` names the source in error messages."""
    prompts, seen = [], {}
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DataError(f"{where}, row {index}: expected an object with a prompt field, got {type(row).__name__}")
        names = (question_field,) if question_field else QUESTION_FIELDS
        field = next((f for f in names if _field(row, f) is not None), None)
        if field is None:
            raise DataError(
                f"{where}, row {index}: no prompt field (looked for {', '.join(names)}); "
                "set question_field to the field that holds the question"
            )
        question = _question(_field(row, field))
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}, row {index}: field {field!r} holds no question text (got {question!r})")
        answers = (answer_field,) if answer_field else ANSWER_FIELDS
        answer = next((_field(row, f) for f in answers if _field(row, f) is not None), None)
        raw_id = _field(row, id_field)
        prompt_id = str(raw_id) if raw_id is not None else str(index)
        if prompt_id in seen:
            raise DataError(
                f"{where}, row {index}: id {prompt_id!r} already used by row {seen[prompt_id]}; ids must be unique"
            )
        seen[prompt_id] = index
        prompts.append(Prompt(prompt_id, question, answer=None if answer is None else str(answer), source=where,
                              row=index))
    if not prompts:
        raise DataError(f"{where}: no rows")
    return prompts


class PromptFile(PromptSource):
    """A local ``.json`` (array of objects), ``.jsonl`` or ``.parquet`` file.

    Args:
        path: The file.
        question_field: Field holding the question (dotted for nested); default: first of
            ``prompt``, ``problem``, ``question``.
        answer_field: Field holding the ground truth; default: ``answer`` or ``reward_model.ground_truth``.
        id_field: Field holding a unique id; rows without it are numbered.
        limit: Keep only the first ``limit`` rows (>= 1; ``None``: all).
    """

    def __init__(
        self,
        path: str,
        question_field: str | None = None,
        answer_field: str | None = None,
        id_field: str = "id",
        limit: int | None = None,
    ) -> None:
        require(isinstance(path, os.PathLike) or (isinstance(path, str) and bool(path.strip())), "PromptFile.path",
                path, allowed="a .json, .jsonl or .parquet file (a non-empty string)")
        _check_fields("PromptFile", question_field, answer_field=answer_field, id_field=id_field, limit=limit)
        self.path = path
        self.question_field = question_field
        self.answer_field = answer_field
        self.id_field = id_field
        self.limit = limit

    def _rows(self) -> list[Any]:
        path = Path(self.path).expanduser()
        if not path.is_file():
            raise DataError(f"data file {self.path!r} does not exist")
        suffix = path.suffix.lower()
        try:
            if suffix == ".json":
                rows = json.loads(self._text(path))
                if not isinstance(rows, list):
                    raise DataError(f"{self.path}: expected a JSON array of objects, got {type(rows).__name__}")
                return rows
            if suffix == ".jsonl":
                rows = []
                for number, line in enumerate(self._text(path).splitlines(), start=1):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as err:
                            raise DataError(f"{self.path}, line {number}: not valid JSON ({err.msg})") from err
                return rows
            if suffix == ".parquet":
                import pyarrow.parquet as pq

                return pq.read_table(path).to_pylist()
        except json.JSONDecodeError as err:
            raise DataError(f"{self.path}: not valid JSON ({err.msg} at line {err.lineno})") from err
        except OSError as err:
            raise DataError(f"{self.path}: cannot read ({err})") from err
        raise DataError(f"{self.path}: unsupported file type {suffix!r}; use .json, .jsonl or .parquet")

    def _text(self, path: Path) -> str:
        """The file decoded as UTF-8 (JSON's encoding, RFC 8259), whatever the locale says."""
        data = path.read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data.count(b"\n", 0, err.start) + 1
            raise DataError(f"{self.path}, line {line} (byte {err.start}): not UTF-8 text ({err.reason}: "
                            f"{data[err.start:err.end]!r}); JSON and JSONL files are read as UTF-8, so re-save "
                            "the file in that encoding") from err

    def load(self) -> list[Prompt]:
        rows = self._rows()[: self.limit]
        return rows_to_prompts(rows, self.path, question_field=self.question_field, answer_field=self.answer_field,
                               id_field=self.id_field)


class HubDataset(PromptSource):
    """A Hugging Face dataset by name (e.g. ``HuggingFaceH4/MATH-500``).

    Args:
        name: Dataset name on the Hub (or a local dataset script/directory).
        split: Split to load.
        subset: Dataset configuration name, if any.
        question_field, answer_field, id_field, limit: As for :class:`PromptFile`.
    """

    def __init__(
        self,
        name: str,
        split: str = "train",
        subset: str | None = None,
        question_field: str | None = None,
        answer_field: str | None = None,
        id_field: str = "id",
        limit: int | None = None,
    ) -> None:
        _check_text("HubDataset.name", name, "a dataset name on the Hub, or a local dataset directory")
        _check_text("HubDataset.split", split, "a split name, e.g. 'train'")
        _check_text("HubDataset.subset", subset, "a dataset configuration name", optional=True)
        _check_fields("HubDataset", question_field, answer_field=answer_field, id_field=id_field, limit=limit)
        self.name = name
        self.split = split
        self.subset = subset
        self.question_field = question_field
        self.answer_field = answer_field
        self.id_field = id_field
        self.limit = limit

    def load(self) -> list[Prompt]:
        try:
            import datasets
        except ImportError as err:
            raise DataError(f"loading {self.name!r} from the Hub needs `pip install datasets`") from err
        try:
            table = datasets.load_dataset(self.name, self.subset, split=self.split)
        except Exception as err:
            raise DataError(f"could not load dataset {self.name!r} (split {self.split!r}): {err}. Offline, a dataset "
                            "loads only from the local cache (run once with network access), or save it as "
                            "JSON/JSONL/parquet and use evolrl.data.PromptFile") from err
        rows = table.select(range(min(self.limit, len(table)))) if self.limit else table
        where = f"{self.name}[{self.split}]"
        return rows_to_prompts(rows, where, question_field=self.question_field, answer_field=self.answer_field,
                               id_field=self.id_field)
