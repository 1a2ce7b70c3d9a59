"""What a snapshot relay is configured with and what it counts (:class:`RelayTimeouts`, :class:`RelayStats`), and how
its coroutines and its hub's wait for state their event loop owns (:class:`Waiters`). Split from
:mod:`dataplane.broadcast.relay`, which re-exports these names."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

KEEPALIVE_S = 0.5  # a parent owing chunks it does not have yet says so this often; children's stall must exceed it
SWITCH_INTERVAL_S = 0.0005
"""How often the interpreter hands the GIL between threads in a process that relays (docs/broadcast.md "Pipelining on
long links"). A relay's event loop shares its process with CPU-bound Python threads (the learner's training, the
agent's generation); each time the loop wakes from waiting on a socket it waits for the GIL, up to the default
5 ms, and a transfer wakes it hundreds of times a second: on the 2-core WAN bench the chain ran at half its link
rate. Never raised: a process that set a shorter interval keeps it."""


def hand_over_gil_often() -> None:
    """Make this process's threads hand over the GIL every :data:`SWITCH_INTERVAL_S` (or more often, if set so)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


@dataclass(frozen=True)
class RelayTimeouts:
    connect: float = 5.0
    """Seconds to open a connection to the parent."""
    stall: float = 3.0
    """Seconds without a byte from the parent (or taken by the child) before the peer counts as stalled. A
    parent waiting for its own parent sends an ``idle`` frame every ``KEEPALIVE_S``, so silence means frozen
    (SIGSTOP, a hung host): the child then takes what is missing from the fallback at once and reports the
    parent, rather than retrying it."""
    parent_retries: int = 3
    """Failed connections to one parent before the missing chunks come from the fallback (if any)."""
    bad_chunk_retries: int = 2
    """Bad copies of one chunk from the parent before it comes from the fallback (if any)."""
    give_up: float = 300.0
    """Seconds without progress, no parent and no fallback, before :meth:`SnapshotRelay.receive` raises."""
    assign_wait: float = 5.0
    """Seconds a child that is not (yet) assigned to this relay is held before it is refused. The site tells
    parent and child about a (re)assignment at about the same time, so the child often knocks first."""
    fallback_in_flight: int = 4
    """HTTP requests (one chunk each) a relay keeps in flight to the fallback; their bytes are taken from its
    downlink bucket before each goes out."""


@dataclass
class RelayStats:
    """What the agent reports to the site (it feeds Success/Stability of the chain score)."""

    from_parent: int = 0
    from_fallback: int = 0
    bad_chunks: int = 0
    parent_failures: int = 0
    parent_switches: int = 0
    fallbacks_interrupted: int = 0
    """HTTP fallbacks given up for a parent the site routed us to meanwhile (a chain repair)."""
    resumed_with: int = 0
    """Chunks already held when the latest parent accepted us (non-zero after a resume)."""
    resumed_bytes: int = 0
    """Bytes of unverified chunks already held when a parent accepted us, over every parent (a switch mid-chunk
    resumes after them, not from the chunk's start)."""
    children_served: int = 0
    child_failures: int = 0
    refused: int = 0
    """Hellos refused: no, a wrong, an expired or another's credential, an unassigned child, or busy."""
    manifests_sent: int = 0
    """``accept`` frames that carried the manifest (children that asked for it)."""
    manifests_refused: int = 0
    """Manifests from a parent refused: they did not hash to the reference the site announced."""


class Waiters:
    """Coroutines waiting for a condition on state this event loop owns; :meth:`notify` makes them look again."""

    def __init__(self) -> None:
        self._futures: set[asyncio.Future] = set()

    def notify(self) -> None:
        for waiter in self._futures:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``ready()``, re-checked whenever :meth:`notify` runs."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not ready():
            left = deadline - loop.time()
            if left <= 0:
                return False
            waiter = loop.create_future()
            self._futures.add(waiter)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter, left)
            finally:
                self._futures.discard(waiter)
        return True
