"""Live state kept in Redis so every site process and Celery worker sees it: recent heartbeats per worker, what
the site observed each worker do for a job (groups accepted, leases taken, installs) and the
forwarding-chain plan of each published snapshot.

The scheduler's throughput ``mu_i(t)`` is what the site accepted (``measured_throughput``); heartbeats give only the
availability ``a_i(t)`` of paper section 4.3 (their arrival, which the site sees) and a ``reported`` figure shown,
never planned with (docs/trust.md, "What the scheduler believes"). Billing and the silence bound read
``observed``; the chain plans drive relay repair and the job page's picture of who feeds whom.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import secrets
import time

from django.conf import settings

from dataplane.broadcast import chains
from dataplane.replay import PROMPT_GROUP, TimedEvent, add_event, consumer_name, prompts_key

from ..core import controller
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


def accepted_key(worker_id: int, job_id: int) -> str:
    return f"echo2:worker:{worker_id}:job:{job_id}:accepted"


_NONCE_PREFIX = secrets.token_hex(4)  # this process's: a member is unique across processes and within one
_nonces = itertools.count()


def _nonce() -> str:
    """A member's nonce, unique however many groups share a time and a size: a token of the process's and a count
    (an ``os.urandom`` call per group cost more than the rest of the event)."""
    return f"{_NONCE_PREFIX}{next(_nonces):x}"


def accepted_event(worker_id: int, *, job_id: int, at: float, records: int) -> TimedEvent:
    """The site accepted ``records`` trajectories of ``job_id`` from the worker: the evidence its measured
    throughput is computed from (never the worker's own figures). A sorted set by time, trimmed to two
    windows, so reading the window costs what the window holds (heartbeats read it). Returned as an event for
    the replay buffer to add in the same round trip as the group it counts (``ReplayBuffer.return_group``)."""
    return TimedEvent(key=accepted_key(worker_id, job_id), member=f"{at!r}:{records}:{_nonce()}",
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
        events = [member.split(":") for member in members]  # at:records:nonce[:ms the lease was held]
        out[wid] = [(float(e[0]), int(e[1])) for e in events]
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


def observed_key(worker_id: int, job_id: int) -> str:
    return f"echo2:worker:{worker_id}:job:{job_id}:observed"


OBSERVED_TTL_S = 86_400


def record_observed(worker_id: int, *, job_id: int, what: str, at: float) -> None:
    """The site saw the worker do ``what`` for ``job_id`` at ``at``: ``leased`` (it was given prompts), ``starved``
    (it asked for prompts and the job had none) or ``installed`` (it reported installing a published version of the
    job, ``services.snapshot_installed``). Groups accepted are read from :func:`accepted_key`, written with the
    group."""
    records_observed([(worker_id, job_id, what, at)])


def records_observed(seen: list[tuple[int, int, str, float]]) -> None:
    """:func:`record_observed` of each ``(worker_id, job_id, what, at)``, in one round trip."""
    pipe = stream.client().pipeline(transaction=False)
    for worker_id, job_id, what, at in seen:
        pipe.hset(observed_key(worker_id, job_id), what, repr(at))
        pipe.expire(observed_key(worker_id, job_id), OBSERVED_TTL_S)
    pipe.execute()


@dataclasses.dataclass(frozen=True)
class Observed:
    """When the site last saw a worker take a lease, have a group accepted, report an install and ask for work in
    vain, for one job (Unix times; None: never, or not within the keys' lifetimes)."""

    leased: float | None = None
    accepted: float | None = None
    installed: float | None = None
    starved: float | None = None  # it asked for work and there was none
    held_since: float | None = None  # when the leases it holds now (unexpired) began to be held; None: none held
    held_until: float | None = None  # when the last lease it held stopped being held (accepted, or timed out)
    # (start, end) of each lease recently held and ended: an accepted group's (its delivery or last renewal to its
    # acceptance, within the throughput window), and an expired lease's (delivery to timeout): what bills follow
    holds: tuple[tuple[float, float], ...] = ()
    # (time, records) of each group accepted within the keys' two windows: what ``measured_throughput`` reads
    accepted_events: tuple[tuple[float, int], ...] = ()

    @property
    def active(self) -> float | None:
        """The last lease or accepted group."""
        times = [t for t in (self.leased, self.accepted) if t is not None]
        return max(times) if times else None


def observed(worker_ids: list[int], *, job_id: int) -> dict[int, Observed]:
    """:class:`Observed` of each worker in ``job_id``, in one round trip: with the leases pending under its consumer
    in the job's prompt stream (``dataplane.replay``), which say whether it holds one now and since when."""
    pipe = stream.client().pipeline(transaction=False)
    # Redis' clock, read in the same round trip as the idle times and the accepted groups' times (both on it): ours,
    # read after the reply, would date every lease late by the round trip
    pipe.time()
    for wid in worker_ids:
        pipe.hmget(observed_key(wid, job_id), ["leased", "installed", "starved"])
        pipe.zrangebyscore(accepted_key(wid, job_id), "-inf", "+inf", withscores=True)  # trimmed to two windows
        pipe.xpending_range(prompts_key(job_id), PROMPT_GROUP, min="-", max="+", count=HELD_SCAN,
                            consumername=consumer_name(wid))
    clock, *rows = pipe.execute(raise_on_error=False)
    now = time.time() if isinstance(clock, Exception) else clock[0] + clock[1] / 1e6
    timeout = float(settings.ECHO2["LEASE_TIMEOUT_S"])
    out = {}
    for i, wid in enumerate(worker_ids):
        (leased, installed, starved), last, pending = rows[3 * i: 3 * i + 3]
        for row in (leased, last):
            if isinstance(row, Exception):
                raise row
        accepted = float(last[-1][1]) if last else None
        idles = [] if isinstance(pending, Exception) else [p["time_since_delivered"] / 1000 for p in pending]
        held_since, held_until = lease_hold(idles, accepted=accepted, now=now, timeout_s=timeout)
        out[wid] = Observed(leased=_time(leased), accepted=accepted, installed=_time(installed),
                            starved=_time(starved), held_since=held_since, held_until=held_until,
                            holds=(*accepted_holds(last), *expired_holds(idles, now=now, timeout_s=timeout)),
                            accepted_events=tuple((float(at), int(member.split(":")[1])) for member, at in last))
    return out


HELD_SCAN = 256  # pending leases read per worker: a lease takes at most one step's groups, and it holds one or two


def lease_hold(idles: list[float], *, accepted: float | None, now: float,
               timeout_s: float) -> tuple[float | None, float | None]:
    """``(held_since, held_until)`` of a worker whose pending leases were delivered ``idles`` seconds before
    ``now`` (a prompt stream's pending entries; one past ``timeout_s`` is no longer held: it may go to anyone) and
    whose last group was accepted at ``accepted``. A stream missing its group (no prompts yet) has no pending."""
    live = [idle for idle in idles if idle < timeout_s]
    held_since = now - max(live) if live else None
    expired = [now - idle + timeout_s for idle in idles if idle >= timeout_s]
    ends = [t for t in (accepted, max(expired, default=None)) if t is not None]
    return held_since, max(ends) if ends else None


def accepted_holds(events: list[tuple[str, float]]) -> list[tuple[float, float]]:
    """(start, end) of the lease of each accepted group in ``events`` (members with scores): the member's last field,
    when it has four, is the milliseconds the lease was held before its group was accepted at the score."""
    out = []
    for member, at in events:
        parts = member.split(":")
        if len(parts) == 4:
            out.append((float(at) - int(parts[3]) / 1000, float(at)))
    return out


def expired_holds(idles: list[float], *, now: float, timeout_s: float) -> list[tuple[float, float]]:
    """(start, end) of each lease still pending past its timeout: held from its delivery until the timeout."""
    return [(now - idle, now - idle + timeout_s) for idle in idles if idle >= timeout_s]


def _time(raw: str | None) -> float | None:
    return None if raw is None else float(raw)


def relay_failure_witness(job_id: int, *, parent_id: int, child_id: int, window_s: float) -> int:
    """Child ``child_id`` says its relay parent ``parent_id`` failed in ``job_id``: counted once per child, and
    forgotten ``window_s`` after the last report (the chain score's decay window). Returns how many distinct
    children have said so: one child's word is not enough to count a failure (``services.repair``)."""
    key = _relay_failure_key(job_id, parent_id)
    pipe = stream.client().pipeline(transaction=True)
    pipe.sadd(key, str(child_id))
    pipe.expire(key, max(1, round(window_s)))
    pipe.scard(key)
    return int(pipe.execute()[-1])


def relay_failure_reporters(job_id: int, parent_ids: list[int]) -> dict[int, set[int]]:
    """The children that said each of ``parent_ids`` failed in ``job_id`` within the window (one round trip)."""
    pipe = stream.client().pipeline(transaction=False)
    for parent_id in parent_ids:
        pipe.smembers(_relay_failure_key(job_id, parent_id))
    return {p: {int(c) for c in found} for p, found in zip(parent_ids, pipe.execute(), strict=True) if found}


def _relay_failure_key(job_id: int, parent_id: int) -> str:
    return f"echo2:relayfail:{job_id}:{parent_id}"


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
