"""The Channels layer over Redis, riding out a Redis restart.

``channels_redis``' layer raises a connection error out of ``receive`` while Redis is away, and Channels
turns that into a crashed consumer: every agent socket closed with 1011 at once, every agent reconnecting,
re-joining and re-announcing itself (the fault bench measured 8 s of lost rollouts for a 1 s restart). This
layer waits instead: ``receive`` retries with exponential backoff and jitter for as long as its consumer
lives (Channels cancels it when the socket closes), and once Redis answers again it joins the groups its
channels were in afresh, since a Redis without persistence lost them. Group joins retry for a bounded time
(the socket is refused after that); leaving a group is best effort (memberships expire on their own).

Pushes (``group_send``) are not retried here: the site's pushes are best effort by design
(``services.base._push``), and agents catch up on their next hello or request.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict

from channels_redis.core import RedisChannelLayer

from dataplane.replay import TRANSIENT

log = logging.getLogger("echo2.channels")

JOIN_RETRY_S = 10.0
BACKOFF_CAP_S = 2.0


def _backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (0-based): doubling from 50 ms up to the cap, with full jitter."""
    return random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, 0.05 * 2 ** attempt)


class ResilientRedisChannelLayer(RedisChannelLayer):
    """``RedisChannelLayer`` whose consumers survive Redis going away and coming back."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.memberships: dict[str, set[str]] = defaultdict(set)  # channel -> groups it joined through us

    async def receive(self, channel: str) -> dict:
        attempt = 0
        while True:
            try:
                if attempt:
                    await self._rejoin(channel)
                message = await super().receive(channel)
            except TRANSIENT as err:
                if attempt == 0:
                    log.warning("channel layer: Redis unreachable (%s); %s waits for it", err, channel)
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            if attempt:
                log.info("channel layer: Redis is back for %s", channel)
            return message

    async def group_add(self, group: str, channel: str) -> None:
        attempt, waited = 0, 0.0
        while True:
            try:
                await super().group_add(group, channel)
                break
            except TRANSIENT:
                if waited >= JOIN_RETRY_S:
                    raise
                delay = _backoff(attempt)
                await asyncio.sleep(delay)
                attempt, waited = attempt + 1, waited + delay
        self.memberships[channel].add(group)

    async def group_discard(self, group: str, channel: str) -> None:
        self.memberships[channel].discard(group)
        if not self.memberships[channel]:
            del self.memberships[channel]
        try:
            await super().group_discard(group, channel)
        except TRANSIENT as err:  # the membership expires by itself (group_expiry); nothing is lost
            log.info("channel layer: could not leave %s for %s (%s)", group, channel, err)

    async def _rejoin(self, channel: str) -> None:
        """Join ``channel``'s groups again (raises while Redis is still away: the caller retries)."""
        for group in list(self.memberships.get(channel, ())):
            await super().group_add(group, channel)
