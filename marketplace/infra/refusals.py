"""Frames the site refused for the transport's sake (over a connection's budget), counted per worker in Redis so
every site process adds to one figure: the job page and the metrics show it, and an honest agent's count stays 0
(it paces itself by the budget the ``welcome`` announces). Best effort: a count lost to a Redis outage is a
figure, never a frame."""

from __future__ import annotations

import logging

from dataplane.replay import RedisError

from . import stream

log = logging.getLogger(__name__)

KEY = "echo2:refused"  # hash: worker id -> frames refused over budget


def count(worker_id: int, amount: int = 1) -> None:
    try:
        stream.client().hincrby(KEY, str(worker_id), amount)
    except RedisError as err:
        log.warning("worker %s: a refused frame not counted (Redis: %s)", worker_id, err)


def counts(worker_ids: list[int] | None = None) -> dict[int, int]:
    """Refused frames per worker (all workers that have any when ``worker_ids`` is None)."""
    try:
        if worker_ids is None:
            return {int(k): int(v) for k, v in stream.client().hgetall(KEY).items()}
        if not worker_ids:
            return {}
        values = stream.client().hmget(KEY, [str(w) for w in worker_ids])
    except RedisError as err:
        log.warning("refused-frame counts unavailable (Redis: %s)", err)
        return {}
    return {w: int(v) for w, v in zip(worker_ids, values, strict=True) if v is not None}
