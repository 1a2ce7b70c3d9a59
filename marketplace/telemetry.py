"""Live state kept in Redis so every site process and Celery worker sees it: recent heartbeats per worker
and the forwarding-chain plan of each published snapshot.

The scheduler turns heartbeats into the sliding-window throughput ``mu_i(t)`` and availability ``a_i(t)``
of paper section 4.3 (``controller.HeartbeatWindow``); the chain plans drive relay repair and the job
page's picture of who feeds whom.
"""

from __future__ import annotations

import json
import secrets

from django.conf import settings

from dataplane.replay import TimedEvent, add_event

from . import chains, controller, stream

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


def accepted_key(worker_id: int, job_id: int) -> str:
    return f"echo2:worker:{worker_id}:job:{job_id}:accepted"


def accepted_event(worker_id: int, *, job_id: int, at: float, records: int) -> TimedEvent:
    """The site accepted ``records`` trajectories of ``job_id`` from the worker: the evidence its measured
    throughput is computed from (never the worker's own figures). A sorted set by time, trimmed to two
    windows, so reading the window costs what the window holds (heartbeats read it). Returned as an event for
    the replay buffer to add in the same round trip as the group it counts (``ReplayBuffer.return_group``)."""
    return TimedEvent(key=accepted_key(worker_id, job_id), member=f"{at!r}:{records}:{secrets.token_hex(4)}",
                      at=at, keep_after=at - 2 * window_s(), ttl_s=3600)


def record_accepted(worker_id: int, *, job_id: int, at: float, records: int) -> None:
    """:func:`accepted_event` added on its own (the site adds it with the group it counts)."""
    add_event(stream.client(), accepted_event(worker_id, job_id=job_id, at=at, records=records))


def recent_accepted(worker_ids: list[int], *, job_id: int, now: float) -> dict[int, list[tuple[float, int]]]:
    """``(time, records)`` of each worker's groups of ``job_id`` accepted within the window before ``now``,
    oldest first."""
    pipe = stream.client().pipeline()
    for wid in worker_ids:
        pipe.zrangebyscore(accepted_key(wid, job_id), now - window_s(), "+inf")
    out = {}
    for wid, members in zip(worker_ids, pipe.execute(), strict=True):
        events = [member.split(":") for member in members]
        out[wid] = [(float(at), int(n)) for at, n, _ in events]
    return out


def heartbeat_interval() -> float:
    return float(settings.ECHO2["HEARTBEAT_INTERVAL_S"])


WINDOW_S = 60.0  # the sliding window of mu_i(t) and a_i(t) (paper section 4.3)


def window_s() -> float:
    """The window of the throughput and availability estimates: a minute, and at least three heartbeats."""
    return max(WINDOW_S, 3 * heartbeat_interval())


def measured_throughput(events: list[tuple[float, int]], *, since: float, now: float) -> float | None:
    """The site's measurement of one worker's ``mu_i`` in a job it started at ``since``, from the groups it
    accepted (``recent_accepted``); None until two heartbeat intervals have passed and a group came."""
    return controller.accepted_rate(events, now=now, window_s=window_s(), since=since,
                                    min_span_s=2 * heartbeat_interval())


def measure_worker(worker_id: int, *, job_id: int, since: float, now: float) -> float | None:
    """``measured_throughput`` of one worker in ``job_id``, read from Redis."""
    return measured_throughput(recent_accepted([worker_id], job_id=job_id, now=now)[worker_id], since=since, now=now)


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
