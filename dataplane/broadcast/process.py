"""One snapshot relay as a process, for the relay tests and ``bench/bench_broadcast.py``.

``python -m dataplane.broadcast.process --help``: events go to stdout as JSON lines, commands
(``parent``, ``children``, ``exit``) come on stdin. Credentials (docs/trust.md) as the site would hand them
out: ``--job-secret`` (or ``ECHO2_JOB_SECRET``) for a relay that verifies its children's credentials itself
(the learner's origin), ``--credential`` for the token this relay shows its parent, and the sha256 of each
assigned child's token with ``--child ID=SHA256`` (or the ``children`` command's ``sha256``). The agent
(``worker_agent.relaying``) and the learner (``learner.serving``) run relays in their own event loops; this
wrapper only exposes one to a harness.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ..snapshot import SnapshotError, parse_manifest
from .framing import DEFAULT_PART_BYTES, TransferError
from .hub import RelayHub
from .ratelimit import bucket
from .relay import Event, RelayTimeouts, SnapshotRelay
from .store import read_version


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dataplane.broadcast.process",
        description="Run one snapshot relay. Events: JSON lines on stdout. Commands: JSON lines on stdin, "
                    '{"cmd": "parent", "host": H, "port": P, "credential": TOKEN} | '
                    '{"cmd": "children", "worker_ids": [..], "sha256": {"ID": SHA256}} | '
                    '{"cmd": "exit"}; stdin EOF also exits.',
        epilog="example: ECHO2_JOB_SECRET=... python -m dataplane.broadcast.process --from-dir /snap/v3 "
               "--max-children 4 --uplink-bps 8e6")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-dir", type=Path, help="origin: serve a published version directory (v<N>/ of a store)")
    src.add_argument("--manifest", type=Path, help="relay/tail: the manifest JSON of the version to receive")
    p.add_argument("--worker-id", type=int, default=0)
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to serve children on ('none': tail only)")
    p.add_argument("--parent", help="HOST:PORT to pull from")
    p.add_argument("--max-children", type=int, default=1)
    p.add_argument("--child", type=_child, action="append",
                   help="assigned child: ID, or ID=SHA256 of the credential the site issued it (repeatable)")
    p.add_argument("--job-secret", default=os.environ.get("ECHO2_JOB_SECRET"),
                   help="the job's transfer secret: verify children's credentials with it (default $ECHO2_JOB_SECRET)")
    p.add_argument("--credential", help="this relay's transfer credential, shown to its parent and the fallback")
    p.add_argument("--uplink-bps", type=float, help="cap on bytes/s sent to children")
    p.add_argument("--downlink-bps", type=float, help="cap on bytes/s received")
    p.add_argument("--fallback-url", help="learner HTTP base for missing/bad chunks, e.g. http://h:p/v3/")
    p.add_argument("--stall-timeout", type=float, default=3.0,
                   help="seconds of silence from a peer before it counts as stalled (parents send keepalives)")
    p.add_argument("--give-up", type=float, default=300.0)
    p.add_argument("--assign-wait", type=float, default=5.0,
                   help="hold an unassigned child (or one asking for a version not served yet) this long")
    p.add_argument("--out", type=Path, help="write the installed payload here")
    p.add_argument("--progress", action="store_true", help="emit an event per chunk")
    p.add_argument("--part-bytes", type=int, default=DEFAULT_PART_BYTES,
                   help="most payload per chunk frame sent to a child (a chunk's size or more: whole chunks, "
                        f"store-and-forward per chunk); default {DEFAULT_PART_BYTES}")
    return p.parse_args(argv)


def _child(text: str) -> tuple[int, str | None]:
    worker, _, sha = text.partition("=")
    return int(worker), sha or None


RelayFactory = Callable[..., SnapshotRelay]
"""Builds the relay from a manifest and keyword arguments: :class:`SnapshotRelay` itself, or a subclass."""


def _emitter(args: argparse.Namespace) -> Callable[[Event], None]:
    def emit(event: Event) -> None:
        if event["event"] != "chunk" or args.progress:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    return emit


def _build_relay(args: argparse.Namespace, emit: Callable[[Event], None], make_relay: RelayFactory) -> SnapshotRelay:
    if args.from_dir:
        manifest, chunks = read_version(args.from_dir)
    else:
        manifest, chunks = parse_manifest(json.loads(args.manifest.read_text())), None
    relay = make_relay(manifest, chunks=chunks, worker_id=args.worker_id, max_children=args.max_children,
                       uplink=bucket(args.uplink_bps), downlink=bucket(args.downlink_bps),
                       fallback_url=args.fallback_url, on_event=emit, secret=args.job_secret,
                       credential=args.credential, part_bytes=args.part_bytes,
                       timeouts=RelayTimeouts(stall=args.stall_timeout, give_up=args.give_up,
                                              assign_wait=args.assign_wait))
    if args.child:
        relay.assign_children(dict(args.child))
    return relay


async def _install(relay: SnapshotRelay, args: argparse.Namespace, emit: Callable[[Event], None]) -> None:
    """Receive the whole snapshot; report ``installed`` (with the relay's stats) or ``error``. ``t`` is when the
    relay held every chunk verified and the whole payload checked against the manifest, as the agent's install
    starts (``worker_agent.relaying``: the chunks, never one joined copy); the payload's sha256 in the event, for
    the harness to compare, and the ``--out`` file are made after it."""
    started = time.monotonic()
    try:
        chunks = await relay.receive_chunks()
    except (TransferError, SnapshotError) as err:
        emit({"event": "error", "worker_id": args.worker_id, "reason": str(err)})
        return
    held, seconds = time.time(), time.monotonic() - started
    # In a thread (hashlib lets go of the GIL): the loop still forwards the last parts to our child meanwhile.
    digest = await asyncio.to_thread(_digest_and_write, chunks, args.out)
    emit({"event": "installed", "worker_id": args.worker_id, "t": held, "seconds": seconds, "sha256": digest,
          "stats": asdict(relay.stats)})


def _digest_and_write(chunks: list[bytes], out: Path | None) -> str:
    whole = hashlib.sha256()
    for data in chunks:
        whole.update(data)
    if out is not None:
        with out.open("wb") as f:
            f.writelines(chunks)
    return whole.hexdigest()


async def _obey(relay: SnapshotRelay, worker_id: int, emit: Callable[[Event], None]) -> None:
    """Apply the commands read from stdin until ``exit`` or EOF."""
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        try:
            cmd = json.loads(line)
        except json.JSONDecodeError:
            emit({"event": "error", "worker_id": worker_id, "reason": f"bad command {line!r}"})
            continue
        if cmd.get("cmd") == "parent":
            relay.set_parent(cmd.get("host"), cmd.get("port"), credential=cmd.get("credential"))
        elif cmd.get("cmd") == "children":
            ids, prints = cmd.get("worker_ids"), cmd.get("sha256") or {}
            relay.assign_children(None if ids is None else {i: prints.get(str(i)) for i in ids})
        elif cmd.get("cmd") == "exit":
            return


async def _main(args: argparse.Namespace, make_relay: RelayFactory) -> int:
    emit = _emitter(args)
    relay = _build_relay(args, emit, make_relay)
    hub = RelayHub(assign_wait=args.assign_wait)
    hub.register(relay)
    port = None if args.listen == "none" else await hub.start(*_split_addr(args.listen))
    emit({"event": "listening", "worker_id": args.worker_id, "port": port})
    if args.parent:
        relay.set_parent(*_split_addr(args.parent))
    receiving = asyncio.create_task(_install(relay, args, emit)) if not relay.complete else None
    try:
        await _obey(relay, args.worker_id, emit)
    finally:
        if receiving is not None:
            receiving.cancel()
        await hub.close()
    return 0


def _split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None, *, make_relay: RelayFactory = SnapshotRelay) -> int:
    """Run until ``exit`` or stdin EOF; ``make_relay`` lets a harness run a subclass (tests/dataplane/broadcast)."""
    return asyncio.run(_main(_parse_args(argv), make_relay))


if __name__ == "__main__":
    sys.exit(main())
