"""Agent liveness kept in Redis, folded into the database periodically.

A heartbeat is Redis alone: one script in one round trip records when the worker was last heard (``SEEN_KEY``, a sorted
set of worker id by time), its telemetry sample (``telemetry.heartbeats_key``) and the state it reports
(``state_key``), and says whether the database must hear of it now (:class:`Beat`): the reported state or job
changed, the state is ``failed`` (the release limit is checked against the database), the site does not hold the
worker as online (it said no hello on this site since it was marked offline, or Redis lost the key), or, for a
worker in a job, the periodic report is due (``sync_s``: billing bills the span between two reports by what the
site observed, and drops a span longer than the worker timeout, so a worker in a job is reported at least every
third of it, whatever state it claims). That report is the billing fold's
(``services.presence.activations_release_silent``, every expiry beat: many workers in a few statements per job); a
worker's heartbeat makes it itself only when no fold has billed the worker for two report periods
(:func:`mark_billed`): the fold stopped, or skipped it.

``Worker.last_heartbeat`` lags by at most the fold period (``services.worker_heartbeats_fold``, Celery beat);
whatever judges silence folds first (``expire_silent_workers``), so a worker is never expired because the fold lagged.

A socket's close is written here too (``CLOSED_KEY``, a list drained by ``services.worker_closes_record``), so a
thousand closes at once cost a thousand Redis writes, not a thousand database transactions inside daphne's
close timeout. Tasks that many sockets would each ask for (provisioning on hello, recording closes) are coalesced:
:func:`claim` lets one caller per window enqueue, delayed until the window ends so it covers every caller of it.

The site's up time (``site_seen``): each heartbeat stamps when the site last handled one and since when it has
done so without a gap (``SITE_UP_SINCE_KEY``); the learner's silence is judged only since then
(``services.jobs_stall_silent_learners``), so a site outage is not counted against the learner.

Plain Redis, no ORM: the agent socket calls these off the database thread.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence

from django.conf import settings

from dataplane.redis_async import run_scripts
from dataplane.replay_scripts import script

from . import stream, telemetry

SEEN_KEY = "echo2:live:seen"  # zset: worker id -> Unix time of its last heartbeat (or hello)
FOLDED_KEY = "echo2:live:folded"  # Unix time up to which SEEN_KEY was folded into Worker.last_heartbeat
CLOSED_KEY = "echo2:live:closed"  # list of JSON {worker_id, since, at}: closed sockets not yet recorded
SITE_SEEN_KEY = "echo2:site:seen"  # Unix time the site last handled a heartbeat
SITE_UP_SINCE_KEY = "echo2:site:up_since"  # since when it handled them without a gap longer than site_gap_s()
STATE_TTL_S = 86_400


def state_key(worker_id: int) -> str:
    """Hash: ``online`` ("1" while the site holds the worker online), ``state`` and ``job`` of its last heartbeat."""
    return f"echo2:worker:{worker_id}:live"


def _sync_key(worker_id: int) -> str:
    return f"echo2:worker:{worker_id}:synced"


def _billed_key(worker_id: int) -> str:
    return f"echo2:worker:{worker_id}:billed"  # set by the billing fold while it brings the worker's bill up to date


def billed_mark_s() -> float:
    """How long a billing fold's mark (:func:`mark_billed`) spares the worker's heartbeats their periodic report:
    two report periods, so one fold late costs nothing, and a fold that stopped hands the reports back to the
    heartbeats before a span reaches billing's gap limit (``sync_s`` is at most a third of it)."""
    return 2 * sync_s()


def mark_billed(worker_ids: list[int]) -> None:
    """The billing fold (``services.presence.activations_release_silent``) brought these workers' bills up to date:
    their heartbeats need not report to the database for :func:`billed_mark_s`."""
    if worker_ids:
        pipe = stream.client().pipeline(transaction=False)
        for wid in worker_ids:
            pipe.set(_billed_key(wid), "1", ex=max(1, round(billed_mark_s())))
        pipe.execute()


def sync_s() -> float:
    """Longest time between two database reports of a worker in a billed state: ``ECHO2_HEARTBEAT_DB_SYNC_S``, at
    most a third of the worker timeout (billing drops a span between reports longer than the timeout)."""
    return max(1.0, min(float(settings.ECHO2["HEARTBEAT_DB_SYNC_S"]), float(settings.ECHO2["WORKER_TIMEOUT_S"]) / 3))


def site_gap_s() -> float:
    """A pause in the site's heartbeat handling longer than this is an outage (three heartbeat intervals, 10 s
    at least)."""
    return max(10.0, 3 * telemetry.heartbeat_interval())


NOT_ONLINE = "not online"  # a Beat's reason when the site does not hold the worker online


@dataclasses.dataclass(frozen=True)
class Beat:
    """What one heartbeat recorded, and whether the database must hear of it now (``reason``, else "")."""

    previous_at: float | None  # the worker's heartbeat before this one
    reason: str

    @property
    def to_database(self) -> bool:
        return bool(self.reason)


# One heartbeat, server-side, in one call (a pipeline of its nine commands cost the socket process more CPU to pack
# and parse than everything else a heartbeat does). KEYS: seen zset, the worker's samples, its state hash, its sync
# key, its billing fold mark, site seen, site up since. ARGV: worker id, now, the sample (JSON), samples kept, state,
# job ("" for none), the state's TTL, the report period, the site's gap. Returns {previous heartbeat or "", online,
# the state and job before this one ("" where unset), 1 when the periodic report is due}.
_HEARTBEAT = """
local wid, now = ARGV[1], tonumber(ARGV[2])
local previous = redis.call('ZSCORE', KEYS[1], wid)
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], wid)
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
local old = redis.call('HMGET', KEYS[3], 'online', 'state', 'job')
redis.call('HSET', KEYS[3], 'state', ARGV[5], 'job', ARGV[6])
redis.call('EXPIRE', KEYS[3], ARGV[7])
-- the periodic report is due when no fold billed the worker lately and no heartbeat reported within the period
local due = 0
if redis.call('EXISTS', KEYS[5]) == 0 and redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[8]) then due = 1 end
-- the site handled a heartbeat now; after a gap, it is up since now
local seen = tonumber(redis.call('GET', KEYS[6]) or '0')
if now - seen > tonumber(ARGV[9]) or not redis.call('GET', KEYS[7]) then redis.call('SET', KEYS[7], ARGV[2]) end
if now > seen then redis.call('SET', KEYS[6], ARGV[2]) end
return {previous or '', old[1] or '', old[2] or '', old[3] or '', due}
"""


def heartbeat(worker_id: int, *, at: float, throughput: float | None, state: str, job_id: int | None) -> Beat:
    """Record a heartbeat in Redis (one call of one script) and say whether the database must hear of it now."""
    keys, args = _heartbeat_call(worker_id, at=at, throughput=throughput, state=state, job_id=job_id)
    return _beat(script(stream.client(), _HEARTBEAT)(keys=keys, args=args), state=state, job_id=job_id)


async def heartbeats_async(beats: Sequence[dict]) -> list[Beat | BaseException]:
    """:func:`heartbeat` of each of ``beats`` (its keyword arguments, ``worker_id`` among them) on the event loop's
    own client (``stream.async_client``, a pool of its own: no thread hop), all in one round trip on one connection
    (``redis_async.run_scripts``): the heartbeats of a process's sockets that arrive together, written together. A
    heartbeat's outcome, or the error Redis answered it with."""
    calls = [_heartbeat_call(b["worker_id"], at=b["at"], throughput=b["throughput"], state=b["state"],
                             job_id=b["job_id"]) for b in beats]
    found = await run_scripts(stream.async_client("liveness"), _HEARTBEAT, calls)
    return [result if isinstance(result, BaseException) else _beat(result, state=b["state"], job_id=b["job_id"])
            for b, result in zip(beats, found, strict=True)]


def _heartbeat_call(worker_id: int, *, at: float, throughput: float | None, state: str,
                    job_id: int | None) -> tuple[list[str], list]:
    keys = [SEEN_KEY, telemetry.heartbeats_key(worker_id), state_key(worker_id), _sync_key(worker_id),
            _billed_key(worker_id), SITE_SEEN_KEY, SITE_UP_SINCE_KEY]
    return keys, [worker_id, repr(at), json.dumps([at, throughput]), telemetry.KEEP, state,
                  "" if job_id is None else str(job_id), STATE_TTL_S, max(1, round(sync_s())), repr(site_gap_s())]


def _beat(result: list, *, state: str, job_id: int | None) -> Beat:
    previous, online, old_state, old_job, due = result
    job = "" if job_id is None else str(job_id)
    if online != "1":
        reason = NOT_ONLINE
    elif old_job != job or not old_state or (old_state == "failed") != (state == "failed"):
        # what billing takes from a report: the job it is about and whether the agent says it failed (the rest of
        # a bill is what the site observed, folded every expiry period); a state the site never heard, reported
        reason = "state changed"
    elif state == "failed":
        reason = "failing"
    elif due and job:  # in a job: what the site saw it do (leases, groups) is billed, whatever state it reports
        reason = "report due"
    else:
        reason = ""
    return Beat(previous_at=float(previous) if previous else None, reason=reason)


def forget_state(worker_id: int) -> None:
    """The database did not take the heartbeat's state: the next heartbeat goes to it again."""
    forget_states([worker_id])


def forget_states(worker_ids: list[int]) -> None:
    """:func:`forget_state` of each of ``worker_ids``, in one round trip."""
    pipe = stream.client().pipeline(transaction=False)
    for worker_id in worker_ids:
        pipe.hdel(state_key(worker_id), "state", "job")
    pipe.execute()


def mark_online(worker_id: int, *, at: float, state: str | None = None, job_id: int | None = None) -> None:
    """The database holds the worker online as of ``at`` (a hello, or a heartbeat that brought it back): its
    heartbeats stay in Redis from now on. With ``state``, what the database recorded it doing."""
    marks_online([(worker_id, at, state, job_id)])


def marks_online(marks: Sequence[tuple[int, float, str | None, int | None]]) -> None:
    """:func:`mark_online` of each ``(worker_id, at, state, job_id)``, in one round trip (a round of hellos)."""
    pipe = stream.client().pipeline(transaction=False)
    for worker_id, at, state, job_id in marks:
        pipe.zadd(SEEN_KEY, {str(worker_id): at}, gt=True)
        fields = {"online": "1"}
        if state is not None:
            fields.update(state=state, job="" if job_id is None else str(job_id))
        pipe.hset(state_key(worker_id), mapping=fields)
        pipe.expire(state_key(worker_id), STATE_TTL_S)
    pipe.execute()


def mark_offline(worker_ids: list[int]) -> None:
    """The database holds these workers offline: their next heartbeat goes to it (and brings them back)."""
    if worker_ids:
        pipe = stream.client().pipeline(transaction=False)
        for wid in worker_ids:
            pipe.hdel(state_key(wid), "online", "state", "job")
        pipe.execute()


def last_seen(worker_ids: list[int]) -> dict[int, float]:
    """When each worker was last heard from (heartbeat or hello), as Redis holds it; absent if never."""
    if not worker_ids:
        return {}
    scores = stream.client().zmscore(SEEN_KEY, [str(w) for w in worker_ids])
    return {wid: float(s) for wid, s in zip(worker_ids, scores, strict=True) if s is not None}


def seen_since(since: float) -> dict[int, float]:
    """Every worker heard from at or after ``since``, with when."""
    rows = stream.client().zrangebyscore(SEEN_KEY, since, "+inf", withscores=True)
    return {int(wid): float(at) for wid, at in rows}


def folded_at() -> float | None:
    raw = stream.client().get(FOLDED_KEY)
    return None if raw is None else float(raw)


def set_folded_at(at: float) -> None:
    stream.client().set(FOLDED_KEY, repr(at))


def record_close(worker_id: int, *, since: str | None, at: float) -> None:
    """The socket whose hello came at ``since`` (ISO 8601, the session's exact start; None: it said none) closed
    at ``at``: queued for the database
    (``services.worker_closes_record``); its heartbeats no longer count as the database's online worker."""
    pipe = stream.client().pipeline(transaction=False)
    pipe.rpush(CLOSED_KEY, json.dumps({"worker_id": worker_id, "since": since, "at": at}))
    pipe.hdel(state_key(worker_id), "online")
    pipe.execute()


def take_closes(limit: int = 10_000) -> list[dict]:
    """The closes queued so far (oldest first), removed from the queue."""
    pipe = stream.client().pipeline(transaction=True)
    pipe.lrange(CLOSED_KEY, 0, limit - 1)
    pipe.ltrim(CLOSED_KEY, limit, -1)
    rows, _ = pipe.execute()
    return [json.loads(row) for row in rows]


def requeue_closes(closes: list[dict]) -> None:
    """Closes that could not be recorded go back to the head of the queue, for the next drain."""
    if closes:
        stream.client().lpush(CLOSED_KEY, *[json.dumps(c) for c in reversed(closes)])


def pending_closes() -> int:
    return int(stream.client().llen(CLOSED_KEY))


def claim(name: str, *, window_s: float) -> bool:
    """Whether the caller is the first to ask for task ``name`` in the current window (``window_s`` long): that
    one enqueues it, delayed by the window so it runs after every other caller of the window."""
    return bool(stream.client().set(f"echo2:coalesce:{name}", "1", nx=True, px=max(1, int(window_s * 1000))))


def site_up_since(now: float | None = None) -> float | None:
    """Since when the site has handled heartbeats without an outage; None when it never handled one (no agent
    connected since Redis started: then nothing is known of its outages). While it is down (no heartbeat for
    ``site_gap_s``), that is ``now``: silence is not judged during an outage."""
    seen, since = stream.client().mget(SITE_SEEN_KEY, SITE_UP_SINCE_KEY)
    if seen is None or since is None:
        return None
    now = time.time() if now is None else now
    return now if now - float(seen) > site_gap_s() else float(since)
