"""Data set bombs: files small on disk that decode to far more are refused while they are read, within bounds."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from dataplane.dataset import bounds, content
from dataplane.dataset.content import DatasetError
from dataplane.tasks import build_task

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("datasets")


def _parquet_bomb(path: Path, rows: int, width: int) -> Path:
    """``rows`` rows of one dictionary-encoded ``width``-character string: tiny on disk."""
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * width]))
    pq.write_table(pa.table({"prompt": column, "answer": column}), path, compression="zstd")
    return path


def _load(path: Path, fmt: str):
    digest = content.digest(path)
    content.register(digest, path)
    task = build_task({"name": "dataset", "reward": "exact_match", "data": {"digest": digest, "format": fmt}})
    task.prepare(allow_user_code=False)
    return task


def test_a_108_kb_parquet_of_a_million_1000_character_rows_is_refused_within_bounds(tmp_path) -> None:
    bomb = _parquet_bomb(tmp_path / "train.parquet", 1_000_000, 1000)
    assert bomb.stat().st_size < 256_000  # two columns that decode to 2 GB of strings
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    with pytest.raises(DatasetError, match="decodes to more than 268435456 bytes"):
        _load(bomb, "parquet")

    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200, f"peak memory grew {grown_mib:.0f} MiB refusing it"


def test_rows_past_the_bound_are_refused_from_the_footer(tmp_path) -> None:
    small = _parquet_bomb(tmp_path / "train.parquet", 5000, 4)
    with pytest.raises(DatasetError, match="more than 4000 rows"):
        bounds.check([small], "parquet", bounds.Limits(rows=4000))


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl"])
def test_a_cell_past_the_bound_is_refused_naming_its_column(tmp_path, fmt) -> None:
    table = pa.table({"prompt": ["short", "y" * 5000], "answer": ["1", "2"]})
    path = tmp_path / f"train.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "arrow":
        with pa.ipc.new_stream(str(path), table.schema) as out:
            out.write_table(table)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    limits = bounds.Limits(cell_bytes=1000)

    with pytest.raises(DatasetError, match="column 'prompt' holds a cell of 5000 bytes" if fmt != "jsonl"
                       else "a line of"):
        bounds.check([path], fmt, limits)
    bounds.check([path], fmt, bounds.Limits(cell_bytes=10_000))  # within bounds: read


def test_an_honest_data_set_still_loads(tmp_path) -> None:
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}), path)
    assert [p.text for p in _load(path, "parquet").sample_prompts(__import__("random").Random(0), 2)]
