"""The learner's relay hub (the chain seeds' source, docs/broadcast.md) as a process of its own:
``python -m dataplane.broadcast.origin --root DIR --job N``, started and watched by
:class:`dataplane.broadcast.origin_process.OriginProcess`.

Why a process: the hub's event loop wakes for every 64 KiB piece it sends; in the learner's process each wake-up
first waits for the GIL that training holds, and every chain goes through this hop (docs/wan.md "Where the time
goes at N = 8"). The child reads each version from the store's directory itself (``read_version``), so nothing big
crosses the pipe, and holds the ``B0`` uplink bucket shared by the seeds.

Commands, JSON lines on stdin, each with an ``id`` its acknowledgement names (``{"event": "ok", "id": ...}``, or
``{"event": "error", "id": ..., "reason": ...}``): ``secret`` (``secret``: the job's transfer secret, only ever on
stdin: argv and the environment are readable by others), ``serve`` (``version``; ``published``: the versions the
store still holds, the others are dropped), ``fan_out`` (``version``, ``n_chains``), ``status`` (the served
versions' :class:`~dataplane.broadcast.relay.RelayStats`, the hub's refusals, the pid), ``exit``. Stdin's end
(the learner gone, even killed with SIGKILL) exits too. Events on stdout: ``listening`` (``port``, ``pid``), the
acknowledgements, ``error`` (a command not understood). Log lines (refused credentials among them) go to stderr,
which is the learner's.

:class:`OriginHub` is the hub itself, on whatever event loop runs it: this process's, or a thread of the learner's
(``relay_mode = "thread"``, :class:`learner.serving.LearnerRelay`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Collection
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..snapshot import SnapshotError
from .hub import RelayHub
from .ratelimit import bucket
from .relay import SnapshotRelay
from .store import read_version, version_dir

log = logging.getLogger("echo2.learner.relay")

DEFAULT_MAX_CHILDREN = 64
"""Seeds a version admits before the site's plan says how many chains it has (:meth:`OriginHub.set_fan_out`)."""


class OriginHub:
    """The learner's origin relays, one per served version, on one :class:`RelayHub` port under one ``B0`` bucket.
    Every method runs on the loop that runs the hub."""

    def __init__(self, root: Path, job_id: int, *, uplink_bps: float | None, secret: str | None = None) -> None:
        self.root, self.job_id, self.secret = Path(root), job_id, secret
        self.uplink_bps, self.max_children = uplink_bps, DEFAULT_MAX_CHILDREN
        self.hub = RelayHub()
        self.uplink = bucket(uplink_bps)  # shared by every seed of every version

    async def start(self, host: str, port: int) -> int:
        return await self.hub.start(host, port)

    async def serve(self, version: int, published: Collection[int]) -> None:
        """Register ``version`` (read from the store's directory) and drop the versions no longer ``published``."""
        manifest, chunks = await asyncio.to_thread(read_version, version_dir(self.root, version))
        relay = SnapshotRelay(manifest, chunks=chunks, worker_id=0, max_children=self.max_children,
                              uplink=self.uplink, secret=self.secret)
        self.hub.register(relay)
        for job_id, old in list(self.hub.relays):
            if old not in published:
                self.hub.unregister(job_id, old)

    def set_secret(self, secret: str | None) -> None:
        """The job's transfer secret: seeds' credentials verify with it, on the versions served already too."""
        self.secret = secret
        for relay in self.hub.relays.values():
            relay.secret = secret

    def set_fan_out(self, version: int, n_chains: int) -> None:
        """The site's plan has ``n_chains`` seeds; one extra slot takes a repaired orphan of a dead seed."""
        self.max_children = max(1, n_chains) + 1
        relay = self.hub.relays.get((self.job_id, version))
        if relay is not None:
            relay.max_children = self.max_children

    def status(self) -> dict[str, Any]:
        """Each served version's relay statistics (served, refused, failed children), the hub's refusals, our pid."""
        return {"versions": {str(v): asdict(r.stats) for (_, v), r in sorted(self.hub.relays.items())},
                "refused": self.hub.refused, "pid": os.getpid()}

    async def close(self) -> None:
        await self.hub.close()


# ---- the child process ---------------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dataplane.broadcast.origin",
        description="The learner's relay hub (started by the learner; see the module's doc for the commands "
                    "on stdin and the events on stdout). The job's secret comes on stdin, never here.")
    p.add_argument("--root", type=Path, required=True, help="the job's snapshot store (v<N>/ directories)")
    p.add_argument("--job", type=int, required=True, help="the job's id")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    p.add_argument("--uplink-bps", type=float, help="the learner's uplink B0 in bytes/s, shared by the seeds")
    return p.parse_args(argv)


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _apply(origin: OriginHub, cmd: dict[str, Any]) -> dict[str, Any]:
    """Carry out one command; the acknowledgement's fields."""
    kind = cmd.get("cmd")
    if kind == "secret":
        origin.set_secret(cmd.get("secret"))
        return {}
    if kind == "serve":
        await origin.serve(int(cmd["version"]), {int(v) for v in cmd["published"]})
        return {"version": int(cmd["version"])}
    if kind == "fan_out":
        origin.set_fan_out(int(cmd["version"]), int(cmd["n_chains"]))
        return {"max_children": origin.max_children}
    if kind == "status":
        return origin.status()
    raise ValueError(f"unknown command {kind!r} (secret, serve, fan_out, status, exit)")


async def _obey(origin: OriginHub, emit: Callable[[dict[str, Any]], None]) -> None:
    """Apply the commands read from stdin, in order, until ``exit`` or EOF."""
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while line := await stdin.readline():
        try:
            cmd = json.loads(line)
            if not isinstance(cmd, dict):
                raise ValueError("a command is a JSON object")
        except ValueError as err:
            emit({"event": "error", "id": None, "reason": f"bad command {line[:200]!r}: {err}"})
            continue
        if cmd.get("cmd") == "exit":
            return
        try:
            reply = {"event": "ok", "id": cmd.get("id"), **await _apply(origin, cmd)}
        except (KeyError, TypeError, ValueError, OSError, SnapshotError) as err:
            reply = {"event": "error", "id": cmd.get("id"), "reason": f"{cmd.get('cmd')}: {type(err).__name__}: {err}"}
        emit(reply)


def _quiet_cancellation(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Sessions still sending when we exit are cancelled; Python 3.11's ``start_server`` then logs each one's
    cancellation as an "Exception in callback" with a traceback (its done-callback asks a cancelled task for its
    exception; 3.12 checks first). Not an error: the learner asked us to exit."""
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


async def _main(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().set_exception_handler(_quiet_cancellation)
    origin = OriginHub(args.root, args.job, uplink_bps=args.uplink_bps)
    try:
        port = await origin.start(args.host, args.port)
    except OSError as err:
        _emit({"event": "error", "id": None, "reason": f"cannot listen on {args.host}:{args.port}: {err}"})
        return 1
    _emit({"event": "listening", "port": port, "pid": os.getpid()})
    try:
        await _obey(origin, _emit)
    finally:
        await origin.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run until ``exit`` or stdin's end. Ctrl-C at the learner's terminal is the learner's to handle: it stops us."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, datefmt="%H:%M:%S",
                        format=f"%(asctime)s learner relay[{os.getpid()}]: %(message)s")
    return asyncio.run(_main(_parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
