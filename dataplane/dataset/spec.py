"""The ``data`` object of a ``dataset`` task: which content (digest), how to read it, which columns mean what.

One schema (pydantic), checked wherever the task is built (the site, the learner, every agent); an error names
the field (``data.prompt_column: ...``). See docs/datasets.md.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..snapshot import SHA256_HEX

Format = Literal["parquet", "jsonl", "arrow"]
Op = Literal["==", "!=", "<", "<=", ">", ">=", "in", "not in"]
COLUMN = r"^[^\x00-\x1f]{1,200}$"

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
}


class RowFilter(BaseModel):
    """Keep a row when ``row[column] <op> value`` (``in``/``not in``: ``value`` is a list)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    column: str = Field(pattern=COLUMN)
    op: Op = "=="
    value: str | int | float | bool | None | list[str | int | float | bool | None]

    def keeps(self, row: dict[str, Any]) -> bool:
        try:
            return bool(_OPS[self.op](row.get(self.column), self.value))
        except TypeError:  # None < 3, "a" < 1: a row the comparison does not apply to is left out
            return False


class DataSpec(BaseModel):
    """Where a ``dataset`` task's rows come from and which columns mean what."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    digest: str = Field(pattern=SHA256_HEX, description="sha256 of the data set's archive (dataplane/dataset/"
                        "content.py): the content the job trains on, whatever path it lies at.")
    format: Format = Field(description="parquet, jsonl (JSON lines) or arrow (Dataset.save_to_disk or .arrow files).")
    source: Literal["upload", "learner"] = Field(default="upload", description="upload: stored at the site "
                                                 "(POST /api/datasets/); learner: the learner reads it from its "
                                                 "own disk (echo2-learner --dataset PATH). Either way the learner "
                                                 "serves it to the workers.")
    split: str = Field(default="train", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="files named <split>... "
                       "(train-00000.parquet, test.jsonl); with none named so, every file is the train split.")
    prompt_column: str = Field(default="prompt", pattern=COLUMN, description="the column of prompt texts.")
    answer_column: str | None = Field(default=None, pattern=COLUMN, description="the reference answer's column, "
                                      "passed to reward functions under its name; named, it must exist (None: "
                                      "'answer' where the data set has one).")
    columns: list[str] | None = Field(default=None, max_length=64, description="the columns passed to reward "
                                      "functions as keyword arguments (None: every column but the prompt's, as "
                                      "TRL passes them).")
    filter: list[RowFilter] = Field(default_factory=list, max_length=16, description="keep only rows that pass "
                                    "every one of these.")
    shuffle: bool = Field(default=True, description="draw prompts in an order shuffled with the job's seed "
                          "(else in file order), a new order each pass.")

    @field_validator("columns")
    @classmethod
    def _columns(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not isinstance(name, str) or not 1 <= len(name) <= 200:
                raise ValueError("each column is a name of 1..200 characters")
        return value

    @field_validator("filter", mode="before")
    @classmethod
    def _one_filter(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    def passed_columns(self, available: list[str]) -> list[str]:
        """The columns a reward function gets (of the data set's ``available``): every one but the prompt's, or the
        answer's, then ``columns``, each once."""
        if self.columns is None:
            return [c for c in available if c != self.prompt_column]
        answer = self.answer_column or "answer"
        names = [answer] if answer in available else []
        return names + [c for c in self.columns if c not in names and c != self.prompt_column]


def parse_data(raw: Any) -> DataSpec:
    """A :class:`DataSpec`, or ValueError naming the field: ``data.format: Input should be 'parquet', ...``."""
    if not isinstance(raw, dict):
        raise ValueError("data: expected an object with the data set's digest and format, "
                         "e.g. {\"digest\": \"<sha256>\", \"format\": \"parquet\"}")
    try:
        return DataSpec.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"] == "string_pattern_mismatch" and first["loc"][0] == "digest":
            msg = "must be the data set's sha256 in lowercase hex (64 characters)"
        raise ValueError(f"data.{where}: {msg}") from None
