"""What the owner's reward functions did wrong on the workers, per job (docs/rewards.md): each accepted group carries
its count (``TrajectoryGroup.reward_errors``), added to the job's replay-buffer counters (``reward_errors``,
``reward_non_finite``) with the latest error's text beside them, so every site process adds to one figure and the job
page shows "reward function errors: N (last: ...)". Best effort: a count lost to a Redis outage is a figure, never
a group."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dataplane.redis_async import bounded
from dataplane.replay import RedisError, counters_key

from . import stream

if TYPE_CHECKING:
    from dataplane.records import RewardErrors

log = logging.getLogger(__name__)

LAST_TTL_S = 30 * 86_400  # the latest error's text outlives a month-long job's last report, then goes


def last_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:reward_error_last"


def record(job_id: int, errors: RewardErrors) -> None:
    """Add an accepted group's ``errors`` to job ``job_id``'s counts (one round trip)."""
    try:
        _counted(stream.client().pipeline(transaction=False), job_id, errors).execute()
    except RedisError as err:
        log.warning("job %s: reward function errors not counted (Redis: %s)", job_id, err)


async def record_async(job_id: int, errors: RewardErrors) -> None:
    """:func:`record` on the event loop's Redis client."""
    try:
        client = stream.async_client()
        await bounded(client, _counted(client.pipeline(transaction=False), job_id, errors).execute())
    except RedisError as err:
        log.warning("job %s: reward function errors not counted (Redis: %s)", job_id, err)


def _counted(pipe, job_id: int, errors: RewardErrors):
    counters = counters_key(job_id)
    pipe.hincrby(counters, "reward_errors", errors.errors)
    pipe.hincrby(counters, "reward_non_finite", errors.non_finite)
    if errors.last_error:
        pipe.set(last_key(job_id), errors.last_error, ex=LAST_TTL_S)
    return pipe


def summary(job_id: int) -> dict:
    """``{"errors", "non_finite", "last"}`` of job ``job_id`` (zeros and "" when none, or Redis is away)."""
    try:
        pipe = stream.client().pipeline(transaction=False)
        pipe.hmget(counters_key(job_id), ["reward_errors", "reward_non_finite"])
        pipe.get(last_key(job_id))
        (errors, non_finite), last = pipe.execute()
    except RedisError as err:
        log.warning("job %s: reward function errors unavailable (Redis: %s)", job_id, err)
        return {"errors": 0, "non_finite": 0, "last": ""}
    return {"errors": int(errors or 0), "non_finite": int(non_finite or 0), "last": last or ""}


def line(figures: dict) -> str:
    """The job page's line: ``0``, or ``12 (3 non-finite; last: fn: ValueError: ...)``."""
    total = figures["errors"] + figures["non_finite"]
    if not total:
        return "0"
    details = [f"{figures['non_finite']} non-finite"] if figures["non_finite"] else []
    details += [f"last: {figures['last']}"] if figures["last"] else []
    return f"{total} ({'; '.join(details)})" if details else str(total)
