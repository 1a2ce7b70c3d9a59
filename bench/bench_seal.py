"""What sealing a group costs the site's ingest path (dataplane/seal.py; docs/trust.md "Audits the site checks").

Run: ``.venv/bin/python bench/bench_seal.py [--seconds 1.0] [--json PATH]``

For each record shape of ``bench_ingest.py`` (``demo``: n = 8, 2 completion tokens; ``long``: n = 8, 640 tokens) it
builds the group an agent returns, encodes it as the site stores it (``dataplane.groupcodec.encode_group``, which
the site does for every accepted group anyway) and times, per group (the best of ten rounds: a loaded machine only
adds time): the encoding, the seal the site adds (:func:`dataplane.seal.seal`, HMAC-SHA256 over the stored bytes)
and the check an audit makes (:func:`dataplane.seal.seal_valid`). Prints a table and the seal's cost as a fraction
of the encoding. The end-to-end ingest rate with and without the seal is ``bench_ingest.py``'s (the commit that
added this bench gives both).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.bench_ingest import SHAPES, group_template  # noqa: E402
from dataplane.groupcodec import encode_group  # noqa: E402
from dataplane.records import TrajectoryGroup  # noqa: E402
from dataplane.seal import seal, seal_key, seal_valid  # noqa: E402


def per_call_us(fn: Callable[[], object], seconds: float, rounds: int = 10) -> float:
    """Microseconds per call of ``fn``: the best of ``rounds`` rounds of about ``seconds / rounds`` each (the
    machine's other load only ever adds time)."""
    best = float("inf")
    for _ in range(rounds):
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / rounds:
            for _ in range(20):
                fn()
            calls += 20
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def run(seconds: float) -> list[dict]:
    key = seal_key("bench secret", "echo2.marketplace.group-seal")
    rows = []
    for shape, tokens in SHAPES.items():
        group, _ = group_template(1, tokens, random.Random(0))
        records = [{**rec, "lease_id": "1-1", "group_id": "g1", "prompt": "1+2="} for rec in group["records"]]
        validated = TrajectoryGroup.model_validate({**group, "lease_id": "1-1", "group_id": "g1", "records": records})
        data = encode_group(validated)
        stamp = seal(key, job_id=1, worker_id=1, lease_id="1-1", data=data)
        encode = per_call_us(lambda validated=validated: encode_group(validated), seconds)
        sealing = per_call_us(lambda data=data: seal(key, job_id=1, worker_id=1, lease_id="1-1", data=data), seconds)
        check = per_call_us(lambda data=data, stamp=stamp: seal_valid([key], stamp, job_id=1, worker_id=1,
                                                                       lease_id="1-1", data=data), seconds)
        rows.append({"shape": shape, "tokens": tokens, "stored_bytes": len(data), "encode_us": encode,
                     "seal_us": sealing, "verify_us": check, "seal_over_encode": sealing / encode})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="Timed seconds per figure.")
    parser.add_argument("--json", help="Also write the rows here.")
    args = parser.parse_args(argv)
    rows = run(args.seconds)
    table = Table(title="Sealing a group at ingest (per group)")
    for column in ("shape", "stored bytes", "encode us", "seal us", "verify us", "seal / encode"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["shape"], str(r["stored_bytes"]), f"{r['encode_us']:.1f}", f"{r['seal_us']:.1f}",
                      f"{r['verify_us']:.1f}", f"{r['seal_over_encode']:.2f}")
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
