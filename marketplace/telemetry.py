"""Live state kept in Redis so every site process and Celery worker sees it: recent heartbeats per worker
and the forwarding-chain plan of each published snapshot.

The scheduler turns heartbeats into the sliding-window throughput ``mu_i(t)`` and availability ``a_i(t)``
of paper section 4.3 (``controller.HeartbeatWindow``); the chain plans drive relay repair and the job
page's picture of who feeds whom.
"""

from __future__ import annotations

import json

from django.conf import settings

from . import chains, stream

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


def _chain_plan_key(job_id: int, version: int) -> str:
    return f"echo2:bcast:{job_id}:{version}"


def save_chain_plan(job_id: int, version: int, plan: chains.ChainPlan) -> None:
    raw = json.dumps({"chains": [list(c) for c in plan.chains], "rollout_only": list(plan.rollout_only)})
    stream.client().set(_chain_plan_key(job_id, version), raw, ex=3600)


def load_chain_plan(job_id: int, version: int) -> chains.ChainPlan | None:
    raw = stream.client().get(_chain_plan_key(job_id, version))
    if raw is None:
        return None
    data = json.loads(raw)
    return chains.ChainPlan(chains=tuple(tuple(c) for c in data["chains"]), rollout_only=tuple(data["rollout_only"]))
