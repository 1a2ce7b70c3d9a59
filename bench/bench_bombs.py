"""Archive and data bombs refused: what each costs the machine that refuses it (peak memory, disk, time).

Each bomb is refused in a fresh Python process of its own (so its peak resident memory, ``ru_maxrss``, is the
refusal's and not a neighbour's), beside the same process doing nothing but importing what it needs:

- a 2 KB tar whose old-GNU sparse member declares 50 GiB, given to ``basemodel.unpack`` (agent cache, learner);
- the same as a pax (``GNU.sparse.map``) member;
- a 1 TiB member header in a 3 KB archive;
- a parquet file of 1 M rows of one dictionary-encoded 1,000-character string (210 KB on disk, 2 GB decoded),
  loaded as a ``dataset`` task's rows.

    .venv/bin/python bench/bench_bombs.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import io, json, resource, sys, tarfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
kind, work = sys.argv[1], Path(sys.argv[2])
from dataplane import basemodel
from dataplane.dataset import content
from dataplane.tasks import build_task
import pyarrow as pa, pyarrow.parquet as pq

def gnu_sparse(declared):
    info = tarfile.TarInfo("model.safetensors"); info.size = 1
    buf = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    buf[156:157] = tarfile.GNUTYPE_SPARSE
    buf[386:398] = tarfile.itn(declared - 1, 12, tarfile.GNU_FORMAT)
    buf[398:410] = tarfile.itn(1, 12, tarfile.GNU_FORMAT)
    buf[483:495] = tarfile.itn(declared, 12, tarfile.GNU_FORMAT)
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % sum(buf[:512])
    return bytes(buf) + b"x" + bytes(511) + bytes(1024)

def pax_sparse(declared):
    info = tarfile.TarInfo("model.safetensors"); info.size = 1
    info.pax_headers = {"GNU.sparse.size": str(declared), "GNU.sparse.map": f"{declared - 1},1"}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"x"))
    return out.getvalue()

def huge_header():
    info = tarfile.TarInfo("model.safetensors"); info.size = 1 << 40
    return info.tobuf(format=tarfile.PAX_FORMAT) + bytes(2048)

size, error = 0, ""
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if kind == "idle":
    pass
elif kind == "parquet":
    column = pa.DictionaryArray.from_arrays(pa.array([0] * 1_000_000, pa.int32()), pa.array(["x" * 1000]))
    pq.write_table(pa.table({"prompt": column, "answer": column}), work / "train.parquet", compression="zstd")
    size = (work / "train.parquet").stat().st_size
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    digest = content.digest(work / "train.parquet")
    content.register(digest, work / "train.parquet")
    try:
        build_task({"name": "dataset", "reward": "exact_match",
                    "data": {"digest": digest, "format": "parquet"}}).prepare(allow_user_code=False)
    except content.DatasetError as err:
        error = str(err)
else:
    payload = {"gnu-sparse": lambda: gnu_sparse(50 << 30), "pax-sparse": lambda: pax_sparse(50 << 30),
               "huge-header": huge_header}[kind]()
    size = len(payload)
    try:
        basemodel.unpack(payload, work / "out")
    except basemodel.ArchiveError as err:
        error = str(err)
seconds = time.perf_counter() - start
written = sum(p.stat().st_size for p in (work / "out").iterdir()) if (work / "out").is_dir() else 0
print(json.dumps({"kind": kind, "bytes": size, "error": error, "seconds": seconds, "disk": written,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "grown_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))
"""


def main() -> None:
    rows = []
    for kind in ("idle", "gnu-sparse", "pax-sparse", "huge-header", "parquet"):
        with tempfile.TemporaryDirectory(prefix="echo2-bomb-") as tmp:
            out = subprocess.run([sys.executable, "-c", CHILD, kind, tmp, str(ROOT)], capture_output=True, text=True,
                                 timeout=600, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'bomb':<12} | {'bytes in':>8} | {'refused':>7} | {'disk written':>12} | {'peak RSS MiB':>12} | "
          f"{'grown MiB':>9} | {'seconds':>7} | reason")
    for r in rows:
        print(f"{r['kind']:<12} | {r['bytes']:>8} | {'-' if r['kind'] == 'idle' else 'yes' if r['error'] else 'NO':>7} "
              f"| {r['disk']:>12} | {r['peak_mib']:>12.0f} | {r['grown_mib']:>9.1f} | {r['seconds']:>7.2f} | "
              f"{r['error'][:70]}")
    print("limits: archive members within the payload's own size (the manifest's total_bytes); data sets at most "
          "1 M rows, 1 MiB a cell, 256 MiB decoded (dataplane/dataset/bounds.py)")


if __name__ == "__main__":
    main()
