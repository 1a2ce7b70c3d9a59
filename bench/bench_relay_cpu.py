"""What relaying costs in CPU: milliseconds of CPU per MB per hop for a chain of real ``SnapshotRelay`` s on loopback
(origin -> hop 1 -> ... -> hop H, every hop verifying and forwarding parts as they arrive (``--part-kib``, default the
relays' own), as an agent's relay does), beside its floor: hashing the same bytes once per hop
(``hashlib.sha256``), which every hop must do.

All relays run in this one process and event loop, so the CPU time is the whole chain's (sending, receiving,
framing, hashing, buckets) and the wall time is bounded by that CPU. With ``--rate-mbit`` each hop's uplink and
downlink buckets run at that rate, as an agent's do at its registered bandwidth: the per-MB cost then includes the
buckets' waits and wake-ups. Why it matters: docs/wan.md "Where the time goes" (a relay shares its agent's
process with generation).

    .venv/bin/python bench/bench_relay_cpu.py                     # 3 hops, 64 MB, uncapped and at 50 Mbit/s
    .venv/bin/python bench/bench_relay_cpu.py --hops 7 --mb 32 --rate-mbit 0 100
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dataplane.broadcast.framing import DEFAULT_PART_BYTES  # noqa: E402
from dataplane.broadcast.hub import RelayHub  # noqa: E402
from dataplane.broadcast.ratelimit import bucket  # noqa: E402
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay  # noqa: E402
from dataplane.credentials import fingerprint, issue, new_secret  # noqa: E402
from dataplane.snapshot import build_manifest, split  # noqa: E402

JOB, VERSION, CHUNK = 1, 1, 4 << 20


async def chain(payload: bytes, *, hops: int, rate_bps: float | None, part: int) -> tuple[float, float]:
    """(wall s, CPU s) for ``payload`` to reach every hop of one chain."""
    secret = new_secret()
    manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=CHUNK)

    def cred(worker: int) -> str:
        return issue(secret, job_id=JOB, worker_id=worker, lowest=VERSION, highest=VERSION,
                     expires=int(time.time()) + 3600)

    hubs: list[RelayHub] = []

    async def serve(relay: SnapshotRelay) -> int:
        hub = RelayHub(assign_wait=5.0)
        hub.register(relay)
        hubs.append(hub)
        return await hub.start()

    port = await serve(SnapshotRelay(manifest, chunks=dict(enumerate(split(payload, CHUNK))), worker_id=0,
                                     secret=secret, uplink=bucket(rate_bps), part_bytes=part))
    relays = []
    for worker in range(1, hops + 1):
        relay = SnapshotRelay(manifest, worker_id=worker, credential=cred(worker), uplink=bucket(rate_bps),
                              downlink=bucket(rate_bps), timeouts=RelayTimeouts(give_up=120), part_bytes=part)
        relay.set_parent("127.0.0.1", port)
        if worker < hops:
            relay.assign_children({worker + 1: fingerprint(cred(worker + 1))})
            port = await serve(relay)
        relays.append(relay)
    wall, cpu = time.monotonic(), time.process_time()
    got = await asyncio.wait_for(asyncio.gather(*(r.receive() for r in relays)), 600)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    for hub in hubs:
        await hub.close()
    if any(g != payload for g in got):
        raise RuntimeError("a hop received a payload that is not the one sent")
    return wall, cpu


def sha256_ms_per_mb(payload: bytes) -> float:
    started = time.process_time()
    hashlib.sha256(payload).digest()
    return (time.process_time() - started) * 1000 / (len(payload) / 1e6)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hops", type=int, default=3, help="Relays in the chain after the origin (default 3).")
    parser.add_argument("--mb", type=int, default=64, help="Payload in MB, whole 4 MiB chunks (default 64).")
    parser.add_argument("--rate-mbit", type=float, nargs="+", default=[0, 50],
                        help="Each hop's bucket rate, Mbit/s; 0 is uncapped (default: 0 50).")
    parser.add_argument("--rounds", type=int, default=3, help="Runs per rate; the table shows the median.")
    parser.add_argument("--part-kib", type=int, default=DEFAULT_PART_BYTES // 1024,
                        help=f"Payload per chunk frame, KiB (default {DEFAULT_PART_BYTES // 1024}, the relays').")
    args = parser.parse_args(argv)
    if args.hops < 1 or args.mb < 4 or args.rounds < 1 or args.part_kib < 1:
        parser.error("--hops >= 1, --mb >= 4, --rounds >= 1 and --part-kib >= 1")
    payload = os.urandom(args.mb // 4 * CHUNK)
    mb = len(payload) / 1e6
    table = Table(title=f"relay CPU: {args.hops} hops on loopback, {mb:.0f} MB, {args.part_kib} KiB parts "
                        f"(median of {args.rounds}; {os.cpu_count()} CPUs)")
    for column in ("rate per hop", "wall s", "CPU s", "CPU ms per MB per hop", "floor: sha256 ms per MB",
                   "x floor", "cores at that rate"):
        table.add_column(column, justify="right")
    floor = min(sha256_ms_per_mb(payload) for _ in range(3))
    for rate in args.rate_mbit:
        rate_bps = rate * 1e6 / 8 if rate > 0 else None
        part = args.part_kib * 1024
        runs = sorted((asyncio.run(chain(payload, hops=args.hops, rate_bps=rate_bps, part=part))
                       for _ in range(args.rounds)), key=lambda r: r[1])
        wall, cpu = runs[len(runs) // 2]
        per_mb = cpu * 1000 / (mb * args.hops)
        cores = f"{per_mb / 1000 * rate_bps / 1e6:.3f}" if rate_bps else "-"  # CPU s per s of one hop at full rate
        table.add_row(f"{rate:g} Mbit/s" if rate else "uncapped", f"{wall:.2f}", f"{cpu:.2f}", f"{per_mb:.2f}",
                      f"{floor:.2f}", f"{per_mb / floor:.1f}", cores)
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
