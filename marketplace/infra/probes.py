"""What the site's readiness rests on, checked where it lives: the database answers, Redis answers (the streams'
and, where apart, the channel layer's), and Celery ran its beat recently (``celery_alive`` stamps
``CELERY_ALIVE_KEY``; older than ``ECHO2_CELERY_STALE_S`` means beat or every worker is down). The probes' views
(``api/observability.py``) say what these checks found."""

from __future__ import annotations

import functools
import logging
import time

from django.conf import settings
from django.db import connection

from dataplane.replay import RedisError, connect

from . import stream

log = logging.getLogger(__name__)

CELERY_ALIVE_KEY = "echo2:celery:alive"


def celery_alive() -> None:
    """Stamp the time a Celery worker ran a beat task (``/readyz`` reads it)."""
    try:
        stream.client().set(CELERY_ALIVE_KEY, time.time(), ex=3600)
    except RedisError as err:  # readiness will say Redis is down; the task itself goes on
        log.warning("could not stamp Celery's beat (%s)", err)


def checks() -> dict[str, str]:
    """Each dependency's state: "ok..." when it serves, else why not (never where it is)."""
    out: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        out["database"] = "ok"
    except Exception as err:  # noqa: BLE001 - any driver error means not ready
        out["database"] = _down("database", err)
    try:
        stamp = stream.client().get(CELERY_ALIVE_KEY)
        out["redis"] = "ok"
        stale_s = float(settings.ECHO2["CELERY_STALE_S"])
        age = time.time() - float(stamp) if stamp else None
        out["celery"] = (f"ok (beat ran {age:.1f} s ago)" if age is not None and age <= stale_s else
                         f"down: no beat task ran in the last {stale_s:.0f} s" if age is not None else
                         "down: no beat task has run yet")
    except RedisError as err:
        out["redis"] = _down("Redis", err)
        out["celery"] = "unknown: Redis is down"
    if stream.url() != settings.REDIS_URL:  # the streams apart (ECHO2_STREAMS_REDIS_URL): the channel layer's too
        try:
            site_redis(settings.REDIS_URL).ping()
            out["site_redis"] = "ok"
        except RedisError as err:
            out["site_redis"] = _down("the site's Redis (channel layer, broker)", err)
    return out


@functools.lru_cache(maxsize=1)
def site_redis(url: str):
    return connect(url, socket_timeout=5)


def _down(what: str, err: Exception) -> str:
    """What a probe anyone may call says of a failed dependency: "down", never the driver's message (it names
    hosts, ports and users); the log keeps it for the operator."""
    log.warning("readiness: %s is down: %s: %s", what, type(err).__name__, err)
    return "down (the site's log says why)"
