"""The ``dataset`` task: a data set named by digest, read from parquet, JSON lines or arrow with the job's column
mapping, filter and seeded shuffle, scored by reward functions in TRL's shape; bad specs name the field."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from dataplane.dataset import content
from dataplane.dataset.content import DatasetError
from dataplane.tasks import TaskSpecError, build_task

datasets = pytest.importorskip("datasets")

ROWS = {"question": [f"{a}+{b}=" for a in range(4) for b in range(3)],
        "answer": [str(a + b) for a in range(4) for b in range(3)],
        "level": [a for a in range(4) for _ in range(3)]}


def write(tmp_path: Path, fmt: str) -> Path:
    table = datasets.Dataset.from_dict(ROWS)
    if fmt == "parquet":
        table.to_parquet(tmp_path / "train.parquet")
        return tmp_path / "train.parquet"
    if fmt == "jsonl":
        table.to_json(tmp_path / "sums.jsonl")
        return tmp_path / "sums.jsonl"
    table.save_to_disk(tmp_path / "saved")
    return tmp_path / "saved"


def task_of(path: Path, fmt: str, **data) -> object:
    digest = content.digest(path)
    content.register(digest, path)
    return build_task({"name": "dataset", "reward": "exact_match",
                       "data": {"digest": digest, "format": fmt, "prompt_column": "question", **data}})


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "arrow"])
def test_each_format_gives_the_prompt_column_and_scores_against_the_answer_column(tmp_path, fmt) -> None:
    task = task_of(write(tmp_path, fmt), fmt, shuffle=False, columns=["level"])
    task.prepare(allow_user_code=False)

    prompts = [p.text for p in task.sample_prompts(random.Random(0), 14)]

    assert prompts == ROWS["question"] + ROWS["question"][:2]  # file order, then round again
    assert task.reward("2+1=", "3") == 1.0
    assert task.reward("2+1=", "4") == 0.0
    assert task.reward("9+9=", "18") == 0.0  # not in the data set
    assert task.spec()["data"]["columns"] == ["level"]


def test_filter_keeps_matching_rows_and_shuffle_follows_the_seed(tmp_path) -> None:
    path = write(tmp_path, "parquet")
    task = task_of(path, "parquet", filter={"column": "level", "op": ">=", "value": 2})

    first = [p.text for p in task.sample_prompts(random.Random(7), 6)]
    again = [p.text for p in task_of(path, "parquet", filter=[{"column": "level", "op": ">=", "value": 2}])
             .sample_prompts(random.Random(7), 6)]
    other = [p.text for p in task_of(path, "parquet", filter={"column": "level", "op": ">=", "value": 2})
             .sample_prompts(random.Random(8), 6)]

    assert sorted(first) == sorted(q for q in ROWS["question"] if int(q[0]) >= 2)  # one whole pass, each once
    assert first == again and first != other


def test_the_same_files_give_the_same_digest_wherever_they_lie(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x.jsonl").write_text('{"prompt": "p", "answer": 1}\n')
    (b / "x.jsonl").write_text('{"prompt": "p", "answer": 1}\n')

    assert content.digest(a) == content.digest(b) == content.digest(a / "x.jsonl") == content.sha256(content.pack(b))
    assert content.check_archive(content.pack(a)) == ["x.jsonl"]
    (b / "x.jsonl").write_text('{"prompt": "p", "answer": 2}\n')
    assert content.digest(a) != content.digest(b)


@pytest.mark.parametrize(("data", "field"), [
    ({"format": "parquet"}, "data.digest: Field required"),
    ({"digest": "abc", "format": "parquet"}, "data.digest: must be the data set's sha256"),
    ({"digest": "0" * 64, "format": "csv"}, "data.format: Input should be 'parquet', 'jsonl' or 'arrow'"),
    ({"digest": "0" * 64, "format": "jsonl", "shuffle": "often"}, "data.shuffle:"),
    ({"digest": "0" * 64, "format": "jsonl", "filter": {"column": "x", "op": "~"}}, "data.filter.0.op:"),
    ({"digest": "0" * 64, "format": "jsonl", "path": "/etc/passwd"}, "data.path: Extra inputs are not permitted"),
    ("file.parquet", "data: expected an object"),
])
def test_a_bad_data_spec_names_the_field(data, field) -> None:
    with pytest.raises(TaskSpecError) as err:
        build_task({"name": "dataset", "data": data, "reward": "exact_match"})
    assert str(err.value).startswith(field)


def test_a_missing_reward_or_column_names_the_field(tmp_path) -> None:
    with pytest.raises(TaskSpecError, match=r"^reward: required"):
        build_task({"name": "dataset", "data": {"digest": "0" * 64, "format": "jsonl"}})
    task = task_of(write(tmp_path, "jsonl"), "jsonl", answer_column="solution")
    with pytest.raises(DatasetError, match=r"^data.answer_column: no column 'solution' in the data set"):
        task.prepare(allow_user_code=False)
    split = task_of(write(tmp_path, "parquet"), "parquet", split="test")
    with pytest.raises(DatasetError, match=r"^data.split: no parquet file is named for split 'test'"):
        split.sample_prompts(random.Random(0), 1)


def test_a_machine_without_the_content_says_so(tmp_path) -> None:
    task = build_task({"name": "dataset", "reward": "exact_match", "data": {"digest": "1" * 64, "format": "jsonl"}})

    assert task.content_digests() == ["1" * 64]
    with pytest.raises(DatasetError, match=r"^data.digest: this machine holds no copy of data set 111111111111"):
        task.sample_prompts(random.Random(0), 1)


def test_a_machine_without_hugging_face_datasets_refuses_the_job(monkeypatch) -> None:
    from dataplane.rewards import CannotServe

    task = build_task({"name": "dataset", "reward": "exact_match", "data": {"digest": "1" * 64, "format": "jsonl"}})
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError

    with pytest.raises(CannotServe, match=r"^data: reading data sets needs .* pip install 'echo2\[datasets\]'"):
        task.prepare(allow_user_code=False)
