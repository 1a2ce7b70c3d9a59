"""Each agent request's verdict, kept in Redis by (worker, request id) for as long as a resend of it can arrive.

An agent sends a request again under the same id when its reply is late, lost with a connection, or refused for
the transport's sake (``worker_agent.connection``). Under load a reply can take longer than the agent waits, so the
same ``submit`` arrives several times: the first one's outcome is kept here and every resend is answered with it,
not run again (running it again would lease more prompts and call stored groups expired).

The request and the keeping of its outcome are one Lua script (``dataplane.replay.ReplayBuffer.submit``): the
script looks the key up first and answers a resend from it, else runs the request and keeps what it did, so a
request costs one round trip and two sendings of one request, on two sockets at once, are never both run. What is
kept is the script's outcome with the caller's ``context`` (what the site decided before the script: groups it
refused on their content, the earnings it announced), from which the site words the same replies again
(``services.rollouts``). A request refused before it reached Redis (the worker is not active in the job) keeps
nothing: a resend of it runs again, and finds the verdict its first sending got if that one ran (:func:`stored`).

The key also carries a fingerprint of what the request asks (type, job, leases answered, groups wanted), so an id
used again by another request (an agent restarted, counting from 1) is never answered with an old verdict.
"""

from __future__ import annotations

import hashlib

import orjson

from dataplane import messages as m
from dataplane.replay import KeptVerdict, Submitted, kept_outcome

from . import stream

# A resend under the same id comes within the agent's request deadline (worker_agent/rollout_loop.py
# RETURN_DEADLINE_S, 120 s); groups kept longer go again under new ids and are recognised by the return script's own
# memory of stored groups (dataplane/replay.py RESEND_MEMORY_S, 900 s, a few bytes each). A verdict carries leased
# prompts, so it is kept only as long as its own resends can come: a busy site's 50 submits a second stay ~15,000 keys.
VERDICT_MEMORY_S = 300
RESENT_KEY = "echo2:resent"  # hash: worker id -> requests answered from their stored verdict


def fingerprint(message: m.LeaseRequest | m.Trajectories | m.Submit) -> str:
    """What the request asks, in 16 hex digits: the same request sent again has the same."""
    match message:
        case m.Submit():
            what = [message.job_id, message.lease, [(g.lease_id, g.group_id) for g in message.groups]]
        case m.Trajectories():
            what = [message.group.job_id, 0, [(message.group.lease_id, message.group.group_id)]]
        case _:
            what = [message.job_id, message.groups, []]
    return hashlib.sha256(orjson.dumps([message.type, *what])).hexdigest()[:16]


def verdict_key(worker_id: int, request_id: str, fingerprint_: str) -> str:
    return f"echo2:worker:{worker_id}:verdict:{request_id}:{fingerprint_}"


def key_for(worker_id: int, message: m.LeaseRequest | m.Trajectories | m.Submit) -> str:
    """Where the verdict of ``message`` (sent with an id) is kept."""
    return verdict_key(worker_id, message.id, fingerprint(message))


def kept(worker_id: int, key: str, context: dict) -> KeptVerdict:
    """Keep the outcome of the request under ``key`` with ``context`` (JSON), for ``VERDICT_MEMORY_S``."""
    return KeptVerdict(key=key, ttl_s=VERDICT_MEMORY_S, context=orjson.dumps(context).decode(), resent_key=RESENT_KEY,
                       resent_field=str(worker_id))


def stored(worker_id: int, key: str) -> Submitted | None:
    """The outcome kept under ``key`` (counted as a resend answered from it), or None. For a request refused before
    its script ran, whose first sending may have run."""
    raw = stream.client().get(key)
    if raw is None:
        return None
    stream.client().hincrby(RESENT_KEY, str(worker_id), 1)
    return kept_outcome(raw)


def resent_counts() -> dict[int, int]:
    """Requests answered from a stored verdict, per worker (each a resend that was not run again)."""
    return {int(k): int(v) for k, v in stream.client().hgetall(RESENT_KEY).items()}
