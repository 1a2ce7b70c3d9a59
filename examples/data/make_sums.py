"""Write examples/data/sums.parquet: one-digit sums "a+b=" with a single-digit answer, the data set of
examples/jobs/dataset-parquet.toml (docs/datasets.md). Committed as made (its digest is the job's); run this to see
how, or to make another: .venv/bin/python examples/data/make_sums.py [OUT]."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def main(out: Path) -> None:
    pairs = [(a, b) for a in range(10) for b in range(10) if a + b < 10]
    table = pa.table({"question": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs],
                      "max_term": [max(a, b) for a, b in pairs]})
    pq.write_table(table, out)
    print(f"{out}: {len(pairs)} rows, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sums.parquet"))
