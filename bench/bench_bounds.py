"""What a liar costs a reader (docs/trust.md "Bounds"): a snapshot server sending ``--mib`` MiB for a 100-byte
chunk, with and without a ``Content-Length``, fetched by ``dataplane.snapshot.fetch_chunk`` (agents, relays' fallback,
the site's export); and a stranger opening a relay hub's port with a chunk frame declaring ``--mib`` MiB. Prints what
the liar got out, the reader's Python peak (tracemalloc) and the process's max RSS.

``.venv/bin/python bench/bench_bounds.py [--mib 400]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import struct
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.broadcast import framing  # noqa: E402
from dataplane.broadcast.hub import RelayHub  # noqa: E402
from dataplane.broadcast.relay import SnapshotRelay  # noqa: E402
from dataplane.snapshot import SnapshotError, build_manifest, fetch_chunk, split  # noqa: E402
from tests.lying_servers import LyingHTTPServer  # noqa: E402

MIB = 1 << 20


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def http_case(lie: int, declare: bool) -> tuple[float, float, str]:
    manifest = build_manifest(b"x" * 100, job_id=3, version=2)
    with LyingHTTPServer(lie, declare=declare) as server:
        tracemalloc.start()
        try:
            fetch_chunk(server.url(), manifest, 0, timeout=30, retries=0)
            outcome = "accepted"
        except SnapshotError as err:
            outcome = str(err).rsplit(": ", 1)[-1]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return server.sent / MIB, peak / MIB, outcome


async def hub_case(lie: int) -> tuple[float, float]:
    payload = b"x" * 100
    manifest = build_manifest(payload, job_id=4, version=2)
    hub = RelayHub(assign_wait=0.1)
    hub.register(SnapshotRelay(manifest, chunks=dict(enumerate(split(payload, manifest.chunk_bytes))), worker_id=0,
                               secret="s" * 64))
    port = await hub.start()
    tracemalloc.start()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    header = json.dumps({"type": "chunk", "job_id": 4, "version": 2, "index": 0, "size": lie,
                         "sha256": "0" * 64}).encode()
    writer.write(struct.pack(">4sIQ", framing.MAGIC, len(header), lie) + header)
    sent, piece = 0, bytes(MIB)
    try:
        while sent < lie:
            writer.write(piece)
            await asyncio.wait_for(writer.drain(), 5)
            sent += len(piece)
    except (ConnectionError, TimeoutError):
        pass
    writer.close()
    await asyncio.sleep(0.2)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    await hub.close()
    return sent / MIB, peak / MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=400, help="what the liar sends, MiB (the hub's case: at most 256)")
    args = parser.parse_args()
    print("| case | liar got out (MiB) | reader's peak (MiB) | max RSS so far (MiB) | outcome |")
    print("| --- | --- | --- | --- | --- |")
    for declare in (True, False):
        sent, peak, outcome = http_case(args.mib * MIB, declare)
        name = "HTTP, Content-Length" if declare else "HTTP, close-delimited"
        print(f"| {name} | {sent:.1f} | {peak:.2f} | {rss_mib():.0f} | {outcome} |")
    sent, peak = asyncio.run(hub_case(min(args.mib, 256) * MIB))
    outcome = "read whole, then refused" if sent >= min(args.mib, 256) else "cut off"
    print(f"| relay hub, chunk frame first | {sent:.1f} | {peak:.2f} | {rss_mib():.0f} | {outcome} |")


if __name__ == "__main__":
    main()
