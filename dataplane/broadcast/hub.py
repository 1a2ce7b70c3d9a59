"""The one listening port of an agent or the learner (docs/broadcast.md).

A :class:`RelayHub` reads each child's ``hello`` and hands the stream to the
:class:`~dataplane.broadcast.relay.SnapshotRelay` registered for its (job, version); a peer asking for
anything else is refused with the reason (counted in :attr:`RelayHub.refused` and logged with the peer). The
relay then checks the child's credential (docs/trust.md). A refusal tells a peer nothing it did not say: not
which jobs and versions the hub serves (a hello is read before any credential is checked, so a stranger's
hello must learn nothing), and a hello carries no payload (one declaring any is refused unread).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from . import framing
from .framing import TransferError
from .relay import SnapshotRelay
from .relaystate import Waiters, hand_over_gil_often

log = logging.getLogger("echo2.relay")


class RelayHub:
    """One listening port serving every registered (job, version) relay of this agent or learner."""

    def __init__(self, *, handshake_timeout: float = 10.0, assign_wait: float = 5.0) -> None:
        self.relays: dict[tuple[int, int], SnapshotRelay] = {}
        self.handshake_timeout = handshake_timeout
        self.assign_wait = assign_wait  # a child asking for a version not served yet waits this long for it
        self.refused = 0
        """Peers refused before reaching a relay: a first frame that is not a hello, or a version not served."""
        self._server: asyncio.AbstractServer | None = None
        self._waiters = Waiters()

    def register(self, relay: SnapshotRelay) -> None:
        self.relays[(relay.job_id, relay.version)] = relay
        self._waiters.notify()

    def unregister(self, job_id: int, version: int) -> None:
        self.relays.pop((job_id, version), None)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the port (advertise it to the site, which tells the children)."""
        hand_over_gil_often()  # our loop must not queue behind the process's training or generation threads
        self._server = await asyncio.start_server(self._handle, host, port)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = framing.peer_name(writer)
        try:
            frame = await framing.read_frame(reader, peer=peer, timeout=self.handshake_timeout, max_payload=0)
        except TransferError:
            writer.close()
            return
        if frame.type != "hello":
            await self._refuse(writer, peer, f"expected hello, got {frame.type}")
            return
        key = (frame.header["job_id"], frame.header["version"])
        # The site tells this agent to serve the version and the child to pull it at about the same time.
        await self._waiters.wait_until(lambda: key in self.relays, self.assign_wait)
        relay = self.relays.get(key)
        if relay is None:
            # Nothing before a credential: the reason names only what the hello asked for, never what we serve.
            offered = ", ".join(f"job {j} version {v}" for j, v in sorted(self.relays)) or "nothing"
            log.info("relay hub: %s asked for job %s version %s; serving %s", peer, key[0], key[1], offered)
            await self._refuse(writer, peer, f"not assigned job {key[0]} version {key[1]} (or not yet)")
            return
        await relay.serve_child(reader, writer, frame)

    async def _refuse(self, writer: asyncio.StreamWriter, peer: str, reason: str) -> None:
        self.refused += 1
        log.warning("relay hub refused %s: %s", peer, reason)
        await framing.refuse_and_close(writer, reason, peer=peer, timeout=self.handshake_timeout)
