"""The site's connection to the trajectory streams' Redis: the replay buffer of each job (``dataplane.replay``) and
the live state kept beside it (heartbeats, telemetry, fan-out records: scripts write both in one call).

One client per process, from ``settings.STREAMS_REDIS_URL`` (``ECHO2_STREAMS_REDIS_URL``; empty: ``REDIS_URL``), with
the site's full rights: learners get users of their own there (``learner_door``). The channel layer, the Celery
broker and the cache stay on ``REDIS_URL``. Every call on it times out.
"""

from __future__ import annotations

from functools import lru_cache

import redis
from django.conf import settings

from dataplane.replay import ReplayBuffer, connect


def url() -> str:
    """The streams' Redis as the site reaches it (with the site's own credentials)."""
    return settings.STREAMS_REDIS_URL or settings.REDIS_URL


@lru_cache(maxsize=1)
def client() -> redis.Redis:
    return connect(url(), decode_responses=True, socket_timeout=10)


def replay(job_id: int) -> ReplayBuffer:
    """Job ``job_id``'s streams: leases, returned groups, counters. A site request rides out a short Redis
    outage (``ECHO2_REDIS_RETRY_S``, default 5 s) and then answers with an error the agent retries."""
    return ReplayBuffer(client(), job_id, retry_for_s=float(settings.ECHO2["REDIS_RETRY_S"]))
