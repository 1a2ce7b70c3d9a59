"""How fast a snapshot exports as a Hugging Face directory (dataplane/export.py), beside what a user would do by
hand: ``save_pretrained`` of the loaded model.

Run: ``.venv/bin/python bench/bench_export.py [--hidden 512] [--layers 8] [--repeats 3]``

A Llama model of the given size (random weights, CPU) is laid out as a learner's snapshot store: the base
(version 0) and one version, in the learner's 4 MiB chunks. The table gives the median seconds and MB/s of
``echo2-learner export``'s path beside its peer: as trained, a copy of the version's chunks into one file, each
chunk's sha256 checked (the same bytes read, checked and written); cast to bf16, ``save_pretrained`` of the model
in bf16 (a cast and a write). Limit: within 2x of the peer. Then ``save_pretrained`` in fp32 for reference, and
the share of the base's chunks an export reads (the base's weights are skipped).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane import export  # noqa: E402
from dataplane.broadcast.store import version_dir  # noqa: E402
from learner.export import export_version  # noqa: E402
from learner.snapshots import SnapshotStore  # noqa: E402
from learner.tiny import build_tiny_model  # noqa: E402

LIMIT = 2.0


def timed(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    root = Path(tempfile.mkdtemp(prefix="echo2-bench-export-"))
    try:
        base = build_tiny_model(root / "base", alphabet="0123456789+-*=", hidden=args.hidden, layers=args.layers,
                                heads=max(1, args.hidden // 64))
        model = AutoModelForCausalLM.from_pretrained(base)
        store = SnapshotStore(root / "snapshots" / "job1", job_id=1, dtype="fp32")  # the export casts to bf16 itself
        store.write_base(base)
        manifest = store.write(model, 1)
        size = manifest.total_bytes
        counter = iter(range(1 << 30))

        def run_export(dtype: str) -> None:
            export_version(root / "snapshots", 1, root / f"out{next(counter)}", version=1, dtype=dtype)

        def run_save(dtype: torch.dtype) -> None:
            model.to(dtype).save_pretrained(root / f"save{next(counter)}")
            model.to(torch.float32)

        def run_copy() -> None:  # what an export must at least do: read each chunk, check its sha256, write it
            target = root / f"copy{next(counter)}"
            target.mkdir()
            with (target / "model.safetensors").open("wb") as out:
                for info in manifest.chunks:
                    data = (version_dir(store.root, 1) / "chunks" / str(info.index)).read_bytes()
                    hashlib.sha256(data).hexdigest()
                    out.write(data)

        base_manifest, fetch_base = export.local_version(store.root, 0)
        snapshot, fetch = export.local_version(store.root, 1)
        read: set[int] = set()
        export.plan(base_manifest, lambda i: read.add(i) or fetch_base(i), snapshot, fetch)

        floor = timed(run_copy, args.repeats)
        rows = [("export, as trained", timed(lambda: run_export("as-trained"), args.repeats),
                 "verified copy of its chunks", floor, size),
                ("export, bf16", timed(lambda: run_export("bf16"), args.repeats),
                 "save_pretrained in bf16", timed(lambda: run_save(torch.bfloat16), args.repeats), size // 2)]
        by_hand = timed(lambda: run_save(torch.float32), args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    table = Table(title=f"export of a {size / 1e6:.0f} MB snapshot (hidden {args.hidden}, {args.layers} layers; "
                  f"median of {args.repeats})")
    for column in ("path", "s", "MB/s", "peer", "peer s", "ratio", "limit", "ok"):
        table.add_column(column)
    failed = False
    for name, seconds, peer_name, peer, written in rows:
        ratio = seconds / peer
        failed |= ratio > LIMIT
        table.add_row(name, f"{seconds:.3f}", f"{written / 1e6 / seconds:.0f}", peer_name, f"{peer:.3f}",
                      f"{ratio:.2f}", f"<= {LIMIT}", "yes" if ratio <= LIMIT else "NO")
    table.add_row("save_pretrained, fp32 (for reference)", f"{by_hand:.3f}", f"{size / 1e6 / by_hand:.0f}", "", "",
                  "", "", "")
    console = Console()
    console.print(table)
    console.print(f"base chunks read by an export: {len(read)} of {len(base_manifest.chunks)} (config and tokenizer; "
                  "the base's weights are skipped)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
