"""Recent heartbeats per worker, kept in Redis so every site process and Celery worker sees them.

The scheduler turns them into the sliding-window throughput ``mu_i(t)`` and availability ``a_i(t)`` of
paper section 4.3 (``provisioning.HeartbeatWindow``).
"""

from __future__ import annotations

import json

from django.conf import settings

from . import stream

KEEP = 512  # heartbeats kept per worker: minutes of history at the default interval


def heartbeats_key(worker_id: int) -> str:
    return f"echo2:worker:{worker_id}:heartbeats"


def record_heartbeat(worker_id: int, *, at: float, throughput: float | None) -> None:
    pipe = stream.client().pipeline()
    pipe.lpush(heartbeats_key(worker_id), json.dumps([at, throughput]))
    pipe.ltrim(heartbeats_key(worker_id), 0, KEEP - 1)
    pipe.execute()


def recent_heartbeats(worker_ids: list[int]) -> dict[int, list[tuple[float, float | None]]]:
    """Oldest first, per worker."""
    pipe = stream.client().pipeline()
    for wid in worker_ids:
        pipe.lrange(heartbeats_key(wid), 0, KEEP - 1)
    return {wid: [tuple(json.loads(x)) for x in reversed(rows)] for wid, rows in zip(worker_ids, pipe.execute(),
                                                                                       strict=True)}


def heartbeat_interval() -> float:
    return float(settings.ECHO2["HEARTBEAT_INTERVAL_S"])
