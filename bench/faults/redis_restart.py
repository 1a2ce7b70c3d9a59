"""``redis-restart``: Redis dies and comes back on the same port and AOF a second later."""

from __future__ import annotations

import signal

from .base import REDIS_BACKOFF_S, Action, Fault, register_fault


@register_fault
class RedisRestart(Fault):
    name = "redis-restart"
    about = "SIGKILL of Redis, restarted on the same port 1 s later (AOF)"
    target = "redis"
    detect = f"the outage + backoff {REDIS_BACKOFF_S:g} s"
    does = "SIGKILL of Redis, the same command (same port, same AOF) 1 s later"
    detected_by = f"the outage (kill to PING) + the {REDIS_BACKOFF_S:g} s backoff cap of `dataplane/replay.py`"

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, "SIGKILL redis", lambda: run.signal(victim, signal.SIGKILL)),
                (1, "restart redis", lambda: run.came_back(run.restart_redis))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        return down + REDIS_BACKOFF_S
