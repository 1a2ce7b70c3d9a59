"""Bounds on what reading a data set may cost, checked while decoding and before ``datasets`` loads a row.

A data set's files are small on disk but may decode to far more: a 108 KB parquet file of 1 M rows holding one
dictionary-encoded 1,000-character string decodes to 1 GB, and ``load_rows`` would then hold it as Python
objects (2 GiB were exhausted). So every file of the split is first streamed through ``pyarrow`` a few hundred
rows at a time (parquet row counts come from the footer, before any decoding), counting rows, decoded bytes and
the longest string or binary cell; the first bound passed is a :class:`DatasetError` naming it, after at most
one batch past the bound was decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .content import DatasetError

MAX_ROWS = 1_000_000
MAX_CELL_BYTES = 1 << 20
MAX_DECODED_BYTES = 256 << 20
_BATCH_ROWS = 256


@dataclass
class Limits:
    rows: int = MAX_ROWS
    cell_bytes: int = MAX_CELL_BYTES
    decoded_bytes: int = MAX_DECODED_BYTES


@dataclass
class _Tally:
    limits: Limits
    rows: int = 0
    decoded: int = 0

    def add_rows(self, rows: int, where: Path) -> None:
        self.rows += rows
        if self.rows > self.limits.rows:
            raise DatasetError(f"dataset: {where.name}: more than {self.limits.rows} rows")

    def add_batch(self, batch, where: Path) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if pa.types.is_dictionary(column.type):  # its nbytes is the dictionary's: count what rows will hold
                column = column.dictionary_decode()
            self.decoded += column.nbytes
            if self.decoded > self.limits.decoded_bytes:
                raise DatasetError(f"dataset: {where.name}: decodes to more than {self.limits.decoded_bytes} bytes")
            kind = column.type
            if pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind) \
                    or pa.types.is_large_binary(kind):
                longest = pc.max(pc.binary_length(column)).as_py() or 0
                if longest > self.limits.cell_bytes:
                    raise DatasetError(f"dataset: {where.name}: column {name!r} holds a cell of {longest} bytes, "
                                       f"at most {self.limits.cell_bytes}")


def check(files: list[Path], fmt: str, limits: Limits | None = None) -> None:
    """Stream ``files`` (of ``fmt``: ``parquet``, ``arrow`` or ``jsonl``) against ``limits``; DatasetError past one."""
    tally = _Tally(limits or Limits())
    for path in files:
        if fmt == "parquet":
            _parquet(path, tally)
        elif fmt == "arrow":
            _arrow(path, tally)
        else:
            _jsonl(path, tally)


def _parquet(path: Path, tally: _Tally) -> None:
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as source:
        tally.add_rows(source.metadata.num_rows, path)  # the footer says it: no row decoded yet
        for batch in source.iter_batches(batch_size=_BATCH_ROWS):
            tally.add_batch(batch, path)


def _arrow(path: Path, tally: _Tally) -> None:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)  # what datasets writes
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(reader)
        for batch in batches:  # a batch is decoded whole: one batch past the bound at most
            tally.add_rows(batch.num_rows, path)
            tally.add_batch(batch, path)


def _jsonl(path: Path, tally: _Tally) -> None:
    size = path.stat().st_size  # JSON is not compressed: its text bounds what it decodes to
    if size > tally.limits.decoded_bytes:
        raise DatasetError(f"dataset: {path.name}: {size} bytes, more than {tally.limits.decoded_bytes}")
    with path.open("rb") as lines:
        for line in lines:
            if len(line) > tally.limits.cell_bytes * 4:
                raise DatasetError(f"dataset: {path.name}: a line of {len(line)} bytes, "
                                   f"at most {tally.limits.cell_bytes * 4}")
            if line.strip():
                tally.add_rows(1, path)
