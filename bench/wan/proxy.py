"""Our user-space delay/loss link (the kernel here has tbf but no sch_netem): a TCP proxy in front of each service.
Where tc netem emulates the links (bench/wan/netns.py, ``--link-emulation``), the proxy still runs, configured
without links (no delay, jitter or loss), for its tap (bench/wan/tap.py): the reply round trips, websocket opens and
per-hop transfers that the bench's tables and the fault script's recovery read.

Run in a node's namespace as ``python -m bench.wan.proxy CONFIG.json``. For every ``listen`` entry it accepts on
the node's address and forwards to the service on the namespace's loopback. A connection from a peer crosses the
peer's link and ours, so each direction is held back by half of each link's round trip (``rtt_ms`` / 2 + the
peer's), plus jitter (uniform in +-jitter_ms per link, never reordering bytes).

Loss: bytes cannot be dropped inside a TCP stream, and the kernel's TCP below us already recovers what tbf drops.
A lost segment on a real link costs the stream a retransmission: we model each chunk read as lost with the
combined probability of both links, and a lost chunk (and everything behind it) waits one retransmission timeout
more: max(200 ms, path RTT), Linux's minimum RTO. Rates are not ours: tbf shapes them on the veths.

Each direction keeps at most WINDOW bytes in flight inside the proxy, then stops reading, so a sender feels
back-pressure as it would from a receive window of that size over the delayed path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import tap as tap_mod
from .tap import Tap

CHUNK = 64 * 1024
WINDOW = 4 * 1024 * 1024  # Linux's default tcp_wmem maximum: what one connection keeps in flight
MIN_RTO_S = 0.2


@dataclass(frozen=True)
class Path:
    """One direction's delay model between this node and a peer (both links together)."""

    delay_s: float  # one way
    jitter_s: float
    loss: float

    @classmethod
    def between(cls, ours: dict, theirs: dict) -> Path:
        loss = 1 - (1 - ours.get("loss", 0.0)) * (1 - theirs.get("loss", 0.0))
        return cls((ours.get("rtt_ms", 0.0) + theirs.get("rtt_ms", 0.0)) / 2000,
                   (ours.get("jitter_ms", 0.0) + theirs.get("jitter_ms", 0.0)) / 1000, loss)

    def due(self, now: float, last: float, rng: random.Random) -> float:
        """When a chunk read at ``now`` reaches the other side: after the path's delay, jitter and (if lost) one
        retransmission timeout; never before the chunk ahead of it (TCP delivers in order)."""
        delay = self.delay_s + (rng.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0)
        if self.loss and rng.random() < self.loss:
            delay += max(MIN_RTO_S, 2 * self.delay_s)
        return max(now + max(delay, 0.0), last)


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | asyncio.Future, path: Path,
               rng: random.Random, seen: Callable[[bytes], object] | None = None,
               delivered: Callable[[object], None] | None = None) -> None:
    """Copy one direction, each chunk released at its due time, at most WINDOW bytes held. ``seen`` (a tap) is
    called with each chunk read; what it returns is handed to ``delivered`` once the chunk is written on.
    ``writer`` may be a future of it (a connection still opening): chunks read meanwhile wait for it."""
    queue: asyncio.Queue[tuple[float, bytes, object]] = asyncio.Queue()
    room = asyncio.Semaphore(WINDOW // CHUNK)

    async def deliver() -> None:
        nonlocal writer
        if isinstance(writer, asyncio.Future):
            writer = await writer
        while True:
            due, data, note = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.write_eof() if writer.can_write_eof() else None
                return
            writer.write(data)
            await writer.drain()
            if note and delivered is not None:
                delivered(note)
            room.release()

    sender = asyncio.create_task(deliver())
    last = 0.0
    try:
        while True:
            await room.acquire()
            data = await reader.read(CHUNK)
            last = path.due(time.monotonic(), last, rng) if data else max(time.monotonic() + path.delay_s, last)
            queue.put_nowait((last, data, seen(data) if seen is not None and data else None))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        # The peer reset the connection (a killed process's socket with unread bytes): pass the reset on after the
        # link's delay, as a real link would, so the far side learns now rather than at its next write or keepalive
        # (a killed agent left the site's websocket open until daphne's ping, 20-30 s).
        sender.cancel()
        await asyncio.sleep(path.delay_s)
        if isinstance(writer, asyncio.Future):  # the connection on the other side is still opening, or failed
            writer = writer.result() if writer.done() and not writer.exception() else None
        if writer is not None:
            writer.transport.abort()
    finally:
        sender.cancel()


async def serve_one(client_r, client_w, target: tuple[str, int], link: dict, peers: dict, seed: int,
                    tap: Tap | None = None, watch: str = "") -> None:
    """Forward one connection. ``watch``: what the tap records of it: ``ws`` (the site's websocket: each request's
    round trip), ``bulk`` (bursts of bytes the peer acknowledged), or nothing."""
    peer_ip = (client_w.get_extra_info("peername") or ("?",))[0]
    path = Path.between(link, peers.get(peer_ip, {}))
    rng = random.Random(seed)
    up, down, sampler = (None, None), (None, None), None
    if tap is not None and watch == "ws":
        replies = tap_mod.Replies(tap, peer_ip)
        up, down = (replies.from_client, None), (replies.from_server, replies.delivered)
    elif tap is not None and watch == "bulk":
        port = client_w.get_extra_info("sockname")[1]
        sampler = asyncio.create_task(tap_mod.bursts(tap, client_w.get_extra_info("socket"), port=port, peer=peer_ip))
    # TCP's handshake on the path: the peer's connect() returned at once (its handshake was with us, across the
    # veths), but a real path's SYN, SYN-ACK and ACK take three one-way delays before the service accepts, and the
    # peer's first bytes (sent after the SYN-ACK) arrive with the ACK. So the service's side opens that late, and
    # what the peer sent meanwhile waits for it: a protocol whose server speaks first (bench/wan/naive.py) and one
    # that waits for the peer's first words (a relay's hello) each get their first byte when a real path gives it.
    opening = asyncio.ensure_future(_open_after(target, 3 * path.delay_s))
    server_w = asyncio.ensure_future(_writer_of(opening))
    upstream = asyncio.create_task(pump(client_r, server_w, path, rng, *up))
    try:
        server_r, _ = await opening
    except OSError:
        upstream.cancel()
        await asyncio.gather(server_w, return_exceptions=True)  # its failure is this one: retrieved, not logged
        client_w.close()
        return
    try:
        await asyncio.gather(upstream, pump(server_r, client_w, path, rng, *down))
    finally:
        upstream.cancel()
        if sampler is not None:
            sampler.cancel()
        for w in (client_w, server_w.result()):
            w.close()


async def _open_after(target: tuple[str, int], delay_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    await asyncio.sleep(delay_s)
    return await asyncio.open_connection(*target)


async def _writer_of(opening: asyncio.Future) -> asyncio.StreamWriter:
    return (await opening)[1]


async def main(config: dict) -> None:
    """``config``: ``listen`` [[host, port, target_host, target_port]], ``link`` (ours), ``peers`` {ip: link};
    optional ``tap`` {"path", "node", "ws": [ports], "bulk": [ports]} (bench/wan/tap.py)."""
    counter = iter(range(1 << 62))
    taps = config.get("tap")
    tap = Tap(taps["path"], taps["node"]) if taps else None
    watch = {p: kind for kind in ("ws", "bulk") for p in (taps or {}).get(kind, [])}
    servers = []
    for host, port, t_host, t_port in config["listen"]:
        async def handle(r, w, target=(t_host, t_port), port=port):
            await serve_one(r, w, target, config["link"], config["peers"], config.get("seed", 0) + next(counter),
                            tap, watch.get(port, ""))
        servers.append(await asyncio.start_server(handle, host, port, reuse_address=True))
    print("proxy ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(cfg))
