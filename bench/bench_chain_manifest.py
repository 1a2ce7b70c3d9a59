"""The manifest down the chain against every relay fetching it from the learner (docs/broadcast.md "The manifest by
reference"): one chain of ``--hops`` real ``SnapshotRelay`` s on loopback behind an origin relay (the learner's hub),
each hop's uplink and downlink at ``--rate-mbit``, a version of ``--chunks`` chunks, the learner's real
``SnapshotServer`` over the same store.

- **http** (the agents until this change): each relay first fetches ``manifest.json`` from the learner's server
  (``fetch_manifest``, verified against the reference), all at once, and only then registers its relay and dials
  its parent.
- **chain** (now): each relay starts with the reference alone, registered at once; the head takes the manifest
  from the origin's ``accept``, every other hop from its parent's.

Per row: the time until the tail holds the manifest, until every hop holds every chunk (T_bcast, and over M/Bw),
and the manifest requests the learner's HTTP server answered. All relays, the origin and the server share this
process and event loop (the server's threads too) on the shared machine: no link delay, so a hop costs its CPU.

    .venv/bin/python bench/bench_chain_manifest.py                      # 4 and 16 hops, 256 chunks, 50 Mbit/s
    .venv/bin/python bench/bench_chain_manifest.py --hops 32 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dataplane.broadcast.hub import RelayHub  # noqa: E402
from dataplane.broadcast.ratelimit import bucket  # noqa: E402
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay  # noqa: E402
from dataplane.broadcast.store import write_version  # noqa: E402
from dataplane.credentials import issue, new_secret  # noqa: E402
from dataplane.snapshot import build_manifest, fetch_manifest, manifest_reference, split  # noqa: E402
from learner.serving import SnapshotServer  # noqa: E402
from learner.snapshots import SnapshotStore  # noqa: E402

JOB, VERSION = 1, 1


async def one_run(mode: str, *, hops: int, chunks: int, chunk_bytes: int, rate_bps: float | None,
                  root: Path, server: SnapshotServer, secret: str) -> dict:
    payload = os.urandom(chunks * chunk_bytes)
    manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=chunk_bytes)
    write_version(root, manifest, payload)
    reference, url = manifest_reference(manifest), server.url_for(VERSION)
    server.served.clear()

    def cred(worker: int) -> str:
        return issue(secret, job_id=JOB, worker_id=worker, lowest=VERSION, highest=VERSION,
                     expires=int(time.time()) + 3600)

    hubs: list[RelayHub] = []

    async def listen(relay: SnapshotRelay) -> int:
        hub = RelayHub()
        hub.register(relay)
        hubs.append(hub)
        return await hub.start()

    origin_port = await listen(SnapshotRelay(manifest, chunks=dict(enumerate(split(payload, chunk_bytes))),
                                             worker_id=0, secret=secret, uplink=bucket(rate_bps)))
    manifest_at: dict[int, float] = {}
    began = time.perf_counter()

    async def hop(worker: int, parent_port: asyncio.Future) -> tuple[SnapshotRelay, asyncio.Future]:
        """Start hop ``worker``: its relay (the manifest fetched first over HTTP, or by reference) on its own port."""
        port: asyncio.Future = asyncio.get_running_loop().create_future()

        def event(e: dict) -> None:
            if e["event"] == "manifest":
                manifest_at[worker] = time.perf_counter() - began

        if mode == "http":
            got = await asyncio.to_thread(fetch_manifest, url, reference, credential=cred(worker), timeout=30)
            manifest_at[worker] = time.perf_counter() - began
            relay = SnapshotRelay(got, worker_id=worker, credential=cred(worker), fallback_url=url,
                                  uplink=bucket(rate_bps), downlink=bucket(rate_bps), timeouts=RelayTimeouts())
        else:
            relay = SnapshotRelay(None, reference=reference, job_id=JOB, version=VERSION, worker_id=worker,
                                  credential=cred(worker), fallback_url=url, on_event=event,
                                  uplink=bucket(rate_bps), downlink=bucket(rate_bps), timeouts=RelayTimeouts())
        relay.secret = secret  # admits its child by credential (an agent's relay checks the site's fingerprint)
        port.set_result(await listen(relay))
        relay.set_parent("127.0.0.1", await parent_port)
        return relay, port

    first: asyncio.Future = asyncio.get_running_loop().create_future()
    first.set_result(origin_port)
    parent, starts = first, []
    for worker in range(1, hops + 1):  # every hop told at once, as the site tells a chain
        task = asyncio.create_task(hop(worker, parent))
        starts.append(task)
        parent = asyncio.ensure_future(_port_of(task))
    relays = [relay for relay, _ in await asyncio.gather(*starts)]
    await asyncio.wait_for(asyncio.gather(*(r.receive_chunks() for r in relays)), 300)
    took = time.perf_counter() - began
    for hub in hubs:
        await hub.close()
    assert all(r.stats.from_fallback == 0 for r in relays), [r.stats for r in relays]
    return {"tail_manifest_s": manifest_at[hops], "t_bcast_s": took, "fetches": server.served["manifest"],
            "m_over_bw_s": len(payload) / rate_bps if rate_bps else 0.0, "manifest_bytes": reference.size}


async def _port_of(task: asyncio.Task) -> int:
    """The port of the hop ``task`` starts, once it listens (its child dials it)."""
    while True:
        if task.done():
            return await task.result()[1]
        await asyncio.sleep(0.001)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, nargs="*", default=[4, 16], help="relays in the chain")
    parser.add_argument("--chunks", type=int, default=256, help="chunks in the version (256: a ~26 KB manifest)")
    parser.add_argument("--chunk-kib", type=int, default=16, help="chunk size")
    parser.add_argument("--rate-mbit", type=float, default=50.0, help="each hop's link (0: uncapped)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; medians shown, worst after the slash")
    args = parser.parse_args()
    rate = args.rate_mbit * 1e6 / 8 if args.rate_mbit else None
    secret = new_secret()
    table = Table(title=f"One chain on loopback, {args.chunks} chunks of {args.chunk_kib} KiB, {args.rate_mbit:g} "
                        "Mbit/s a hop: the manifest fetched by every relay from the learner (http) or down the chain")
    for col in ("hops", "manifest", "tail has the manifest s", "T_bcast s", "T_bcast / (M/Bw)",
                "learner HTTP manifests"):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory(prefix="bench-chain-manifest-") as tmp:
        server = SnapshotServer(SnapshotStore(Path(tmp), job_id=JOB, chunk_bytes=args.chunk_kib << 10),
                                secret=secret).start()
        try:
            for hops in args.hops:
                for mode in ("http", "chain"):
                    runs = [asyncio.run(one_run(mode, hops=hops, chunks=args.chunks, chunk_bytes=args.chunk_kib << 10,
                                                rate_bps=rate, root=Path(tmp), server=server, secret=secret))
                            for _ in range(args.repeat)]

                    def cell(key: str, runs=runs) -> str:
                        values = [r[key] for r in runs]
                        return f"{statistics.median(values):.3f} / {max(values):.3f}"

                    ratio = [r["t_bcast_s"] / r["m_over_bw_s"] for r in runs] if rate else [0.0]
                    table.add_row(str(hops), mode, cell("tail_manifest_s"), cell("t_bcast_s"),
                                  f"{statistics.median(ratio):.2f}" if rate else "-",
                                  f"{statistics.median(r['fetches'] for r in runs):g}")
        finally:
            server.stop()
    Console(width=max(Console().width, 140)).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
