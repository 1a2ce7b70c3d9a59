"""Each agent request's verdict, kept in Redis by (worker, request id) for as long as a resend of it can arrive.

An agent sends a request again under the same id when its reply is late, lost with a connection, or refused for
the transport's sake (``worker_agent.connection``). Under load a reply can take longer than the agent waits, so the
same ``submit`` arrives several times: the first one's replies are stored here and every resend is answered with
them, not run again (running it again would lease more prompts and call stored groups expired). While the first is
still being handled (a resend on a new socket), a resend is told to come back shortly (``BUSY``).

The key also carries a fingerprint of what the request asks (type, job, leases answered, groups wanted), so an id
used again by another request (an agent restarted, counting from 1) is never answered with an old verdict.
Only verdicts on the content are stored: a reply that says "send it again" (``retry_after``) is forgotten, and the
resend runs.
"""

from __future__ import annotations

import hashlib
import json

from dataplane import messages as m

from . import stream

# A resend under the same id comes within the agent's request deadline (worker_agent/rollout_loop.py
# RETURN_DEADLINE_S, 120 s); groups kept longer go again under new ids and are recognised by the return script's own
# memory of stored groups (dataplane/replay.py RESEND_MEMORY_S, 900 s, a few bytes each). A verdict carries leased
# prompts, so it is kept only as long as its own resends can come: a busy site's 50 submits a second stay ~15,000 keys.
VERDICT_MEMORY_S = 300
RUNNING = "running"
RESENT_KEY = "echo2:resent"  # hash: worker id -> requests answered from their stored verdict
RUNNING_TTL_S = 120  # a handler that died with its process frees the id after this long
BUSY = object()  # claim(): the request is being handled now


def fingerprint(message: m.LeaseRequest | m.Trajectories | m.Submit) -> str:
    """What the request asks, in 16 hex digits: the same request sent again has the same."""
    match message:
        case m.Submit():
            what = [message.job_id, message.lease, [(g.lease_id, g.group_id) for g in message.groups]]
        case m.Trajectories():
            what = [message.group.job_id, 0, [(message.group.lease_id, message.group.group_id)]]
        case _:
            what = [message.job_id, message.groups, []]
    return hashlib.sha256(json.dumps([message.type, *what]).encode()).hexdigest()[:16]


def verdict_key(worker_id: int, request_id: str, fingerprint_: str) -> str:
    return f"echo2:worker:{worker_id}:verdict:{request_id}:{fingerprint_}"


def claim(worker_id: int, message) -> list[dict] | object | None:
    """None: the request is new, and now marked as being handled (:func:`keep` or :func:`forget` it after);
    :data:`BUSY`: it is being handled now; else the replies sent the first time, to send again as they were."""
    key = verdict_key(worker_id, message.id, fingerprint(message))
    held = stream.client().set(key, RUNNING, nx=True, get=True, ex=RUNNING_TTL_S)
    if held is None:
        return None
    if held == RUNNING:
        return BUSY
    stream.client().hincrby(RESENT_KEY, str(worker_id), 1)
    return json.loads(held)


def resent_counts() -> dict[int, int]:
    """Requests answered from a stored verdict, per worker (each a resend that was not run again)."""
    return {int(k): int(v) for k, v in stream.client().hgetall(RESENT_KEY).items()}


def keep(worker_id: int, message, replies: list[dict], *, memory_s: int = VERDICT_MEMORY_S) -> None:
    """The replies sent to the request: what a resend of it gets within ``memory_s``."""
    stream.client().set(verdict_key(worker_id, message.id, fingerprint(message)), json.dumps(replies), ex=memory_s)


def forget(worker_id: int, message) -> None:
    """No verdict was reached (the site could not handle it now): a resend runs again."""
    stream.client().delete(verdict_key(worker_id, message.id, fingerprint(message)))


def is_verdict(replies: list[dict]) -> bool:
    """Whether the replies judge the request's content (to keep), not ask for it again later (``retry_after``)."""
    return not any(reply.get("type") == "rejected" and reply.get("retry_after") is not None for reply in replies)
