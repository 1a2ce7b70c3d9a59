"""Read a data set's files with Hugging Face ``datasets`` into plain rows (local files only, never the hub).

``datasets`` (and ``pyarrow``) come with ``pip install 'echo2[datasets]'`` and are imported only when a
``dataset`` task first reads its rows, on the learner and the agents; the site never does. The files are read
through ``load_dataset`` with an explicit list of local data files (``parquet``, ``json`` for JSON lines,
``arrow``) into a throw-away cache directory, or ``load_from_disk`` for a ``Dataset.save_to_disk`` directory; only
the columns the task uses are kept, as Python values.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from . import bounds
from .content import DatasetError, dataset_files
from .spec import DataSpec

EXTENSIONS = {"parquet": (".parquet",), "jsonl": (".jsonl", ".json"), "arrow": (".arrow",)}
BUILDERS = {"parquet": "parquet", "jsonl": "json", "arrow": "arrow"}
SAVED = "state.json"  # what Dataset.save_to_disk writes beside its arrow files
INSTALL_HINT = "pip install 'echo2[datasets]'"


def _hf():
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"dataset: reading data sets needs Hugging Face datasets: {INSTALL_HINT}") from None
    datasets.disable_progress_bars()
    return datasets


def split_files(files: list[Path], spec: DataSpec) -> list[Path]:
    """The data files of ``spec.split``: those of the format named ``<split>`` followed by ``-``, ``_``, ``.`` or the
    end; with none named so, every file of the format when the split is ``train``."""
    data = [f for f in files if f.name.lower().endswith(EXTENSIONS[spec.format])]
    if not data:
        raise DatasetError(f"data.format: no {spec.format} file in the data set (files: "
                           f"{', '.join(f.name for f in files[:10])})")
    named = [f for f in data if re.match(rf"{re.escape(spec.split)}([-_.]|$)", f.name)]
    if named:
        return named
    if spec.split == "train":
        return data
    raise DatasetError(f"data.split: no {spec.format} file is named for split {spec.split!r} "
                       f"(files: {', '.join(f.name for f in data[:10])})")


def _read(path: Path, spec: DataSpec, cache: str) -> Any:
    hf = _hf()
    if spec.format == "arrow" and path.is_dir() and (path / SAVED).is_file():
        bounds.check(sorted(path.glob("*.arrow")), "arrow")
        table = hf.load_from_disk(str(path))
        if not isinstance(table, hf.Dataset):
            raise DatasetError("data.format: a DatasetDict directory; save one split (dataset['train'].save_to_disk)")
        if table.split is not None and str(table.split) != spec.split:
            raise DatasetError(f"data.split: this arrow data set is split {str(table.split)!r}, not {spec.split!r}")
        return table
    files = split_files(dataset_files(path), spec)
    bounds.check(files, spec.format)  # rows, cells and decoded bytes, before datasets holds any of it
    return hf.load_dataset(BUILDERS[spec.format], data_files=[str(f) for f in files], split="train", cache_dir=cache)


def load_rows(path: str | Path, spec: DataSpec) -> list[dict[str, Any]]:
    """The rows of the data set at ``path`` (a file, or a directory of its files) that pass ``spec.filter``, each
    holding the prompt column and the columns passed to reward functions, in file order. An unreadable file or a
    missing column raises :class:`DatasetError` naming the field."""
    cache = tempfile.mkdtemp(prefix="echo2-dataset-")
    try:
        try:
            table = _read(Path(path), spec, cache)
        except DatasetError:
            raise
        except Exception as err:  # noqa: BLE001 - pyarrow, json and datasets raise many kinds; one line names it
            raise DatasetError(f"data.format: cannot read the data set as {spec.format}: "
                               f"{str(err).splitlines()[0][:300] if str(err) else type(err).__name__}") from None
        wanted = [spec.prompt_column, *spec.passed_columns(list(table.column_names)),
                  *(f.column for f in spec.filter)]
        for field, name in [("prompt_column", spec.prompt_column), ("answer_column", spec.answer_column),
                            *(("columns", c) for c in spec.columns or []),
                            *(("filter", f.column) for f in spec.filter)]:
            if name is not None and name not in table.column_names:
                raise DatasetError(f"data.{field}: no column {name!r} in the data set (columns: "
                                   f"{', '.join(table.column_names[:20])})")
        rows = table.select_columns(list(dict.fromkeys(wanted))).to_list()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return [row for row in rows if all(f.keeps(row) for f in spec.filter)]
