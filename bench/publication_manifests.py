"""What a publication costs the learner's HTTP server in manifest fetches: ``bench_publication.py``'s last table. The
snapshot message names the manifest by reference; a worker with a chain parent takes it from the parent's relay
``accept`` (a chain's head from the learner's relay hub), and only the workers left out of the chains, or whose
parent failed or lied, GET ``v<n>/manifest.json`` from the learner's snapshot server, once per version, as many at
once as the site told at once. (Until the manifest went down the chains every worker did: the 10,000 row.)

What is real: the learner's :class:`~learner.serving.SnapshotServer` (a ``ThreadingHTTPServer`` checking each
request's transfer credential) in a process of its own over a store laid out by ``write_version``, serving a
manifest of ``--chunks`` chunks; the agents' fetch (:func:`dataplane.snapshot.fetch_manifest`: GET, bounded read,
parse, canonical sha256 against the reference), ``clients`` at a time from threads of this process, each request
its own connection as an agent's is. Not real: the learner's training beside its server (in the learner both share
a process and its GIL), the network (loopback), the agents' own machines (here the clients' CPU shares the 2 cores
with the server's). Per row: wall time for ``requests`` fetches, fetches per second, the 50th/99th percentile of
one fetch, and the server process's CPU per fetch.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

JOB, VERSION, CHUNK_BYTES = 1, 3, 1024


def serve(root: str, secret: str) -> None:
    """The learner's snapshot server over ``root`` until stdin closes (run as this module's child process)."""
    from learner.serving import SnapshotServer
    from learner.snapshots import SnapshotStore

    server = SnapshotServer(SnapshotStore(Path(root), job_id=JOB, chunk_bytes=CHUNK_BYTES), secret=secret).start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc; Linux)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(requests: list[int], *, clients: int, chunks: int) -> list[dict]:
    from dataplane.broadcast.store import write_version
    from dataplane.credentials import issue, new_secret
    from dataplane.snapshot import build_manifest, fetch_manifest, manifest_reference

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-manifests-") as tmp:
        payload = bytes(range(256)) * (chunks * CHUNK_BYTES // 256)
        manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=CHUNK_BYTES)
        write_version(Path(tmp), manifest, payload)
        secret = new_secret()
        server = subprocess.Popen([sys.executable, "-m", "bench.publication_manifests", "--serve", tmp, secret],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=Path(__file__).resolve().parent.parent)
        try:
            url = f"http://127.0.0.1:{int(server.stdout.readline())}/v{VERSION}/"
            reference = manifest_reference(manifest)
            credential = issue(secret, job_id=JOB, worker_id=1, lowest=VERSION, highest=VERSION,
                               expires=int(time.time()) + 3600)

            def one(_: int) -> float:
                began = time.perf_counter()
                got = fetch_manifest(url, reference, credential=credential, timeout=30, retries=4)
                assert got == manifest
                return time.perf_counter() - began

            one(0)  # warm: imports, the server's first thread
            for n in requests:
                cpu, began = _cpu_s(server.pid), time.perf_counter()
                with ThreadPoolExecutor(max_workers=clients) as pool:
                    took = sorted(pool.map(one, range(n)))
                wall = time.perf_counter() - began
                rows.append({"requests": n, "clients": clients, "wall_s": wall, "per_s": n / wall,
                             "p50_ms": 1e3 * statistics.median(took), "p99_ms": 1e3 * took[int(0.99 * (n - 1))],
                             "server_cpu_us": 1e6 * (_cpu_s(server.pid) - cpu) / n,
                             "manifest_bytes": len(manifest.model_dump_json().encode())})
        finally:
            server.stdin.close()
            server.wait(10)
    return rows


def table(rows: list[dict], *, chunks: int):
    from rich.table import Table

    out = Table(title=f"The learner's snapshot server answering manifest.json (manifest of {chunks} chunks, "
                      f"{rows[0]['manifest_bytes']:,} B; agents' fetch, verified; loopback)" if rows else "")
    for col in ("fetches", "at once", "wall s", "fetches / s", "p50 ms", "p99 ms", "server CPU / fetch us"):
        out.add_column(col, justify="right")
    for r in rows:
        out.add_row(f"{r['requests']:,}", str(r["clients"]), f"{r['wall_s']:.2f}", f"{r['per_s']:,.0f}",
                    f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['server_cpu_us']:.0f}")
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    serve(sys.argv[2], sys.argv[3])
