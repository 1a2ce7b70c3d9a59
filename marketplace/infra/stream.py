"""The site's connection to Redis: the replay buffer of each job (``dataplane.replay``) and live state.

One client per process, from ``settings.REDIS_URL``; every call on it times out.
"""

from __future__ import annotations

from functools import lru_cache

import redis
from django.conf import settings

from dataplane.replay import ReplayBuffer, connect


@lru_cache(maxsize=1)
def client() -> redis.Redis:
    return connect(settings.REDIS_URL, decode_responses=True, socket_timeout=10)


def replay(job_id: int) -> ReplayBuffer:
    """Job ``job_id``'s streams: leases, returned groups, counters. A site request rides out a short Redis
    outage (``ECHO2_REDIS_RETRY_S``, default 5 s) and then answers with an error the agent retries."""
    return ReplayBuffer(client(), job_id, retry_for_s=float(settings.ECHO2["REDIS_RETRY_S"]))
