"""The learner's door to its job's streams: the Redis 7 ACL user the site makes for each learner session.

Owners are strangers to each other (docs/trust.md "The learner's door"): a learner holds the keys of its own job
and nothing else of the Redis it shares with every other job and, on one machine, with the site's channel layer,
Celery broker and cache. This module says what that user may do; the site applies it
(``marketplace.infra.learner_door``), with its own connection, which keeps full rights.

Keys: exactly those the learner touches (``dataplane.replay``, ``dataplane.audit_hold``): the prompt and trajectory
streams, the counters it adds to, the held copies of failed audits and their index. Not ``delivered`` (the site's
evidence of what each worker delivered, which bounds the audits a learner may report) nor any other key of the job.

Commands: those the learner sends (the reader, the prompt feeder, acknowledgements, counters, the held copies) and
those its Lua scripts call (``replay_scripts.ACK_COUNTED``, ``audit_hold.HOLD``; Redis checks a script's commands
and keys against the caller's ACL as if sent one by one). Nothing key-less that reaches beyond the job (``KEYS``,
``SCAN``, ``RANDOMKEY``, ``MONITOR``, ``CONFIG``, ``FLUSH*``, ``SELECT``, ``ACL``, ``CLIENT`` beyond what a
connection says of itself), no pub/sub channel (``resetchannels``), no blocking list or sorted-set pop, no
``FUNCTION``, no ``SCRIPT FLUSH``/``KILL``."""

from __future__ import annotations

from .audit_hold import held_index_key, held_key
from .replay import counters_key, prompts_key, trajectories_key

# What the learner sends itself, then what its scripts call. Subcommands as Redis names them (``xgroup|create``).
LEARNER_COMMANDS: tuple[str, ...] = (
    # the staleness-gated reader and its acknowledgements (learner/consumer.py, dataplane.replay)
    "xreadgroup", "xack", "xdel", "xlen", "xgroup|create", "xrange",
    # the prompt feeder (learner/prompts.py) and the job's counters
    "xadd", "hincrby", "hgetall",
    # the held copies of failed audits and the probation a restarted learner reads back (dataplane.audit_hold)
    "hget", "hset", "exists", "expire", "zadd", "zrangebyscore", "zremrangebyscore",
    # scripts by SHA (redis-py loads one the server does not know), pipelines as transactions, a health check
    "evalsha", "eval", "script|load", "multi", "exec", "discard", "ping",
)  # (redis-py's CLIENT SETINFO at connect is refused, which it ignores)


def learner_username(job_id: int) -> str:
    """The Redis user of job ``job_id``'s learner (one per job: a new session rotates its password)."""
    return f"echo2-learner-job{int(job_id)}"


def learner_key_patterns(job_id: int) -> list[str]:
    """The keys the learner of job ``job_id`` reads and writes, as ACL glob patterns (no other job's key matches:
    each ends in a fixed suffix after the job id)."""
    return [prompts_key(job_id), trajectories_key(job_id), counters_key(job_id), held_key(job_id, "*"),
            held_index_key(job_id)]


def learner_acl_rules(job_id: int, *, password_sha256: str) -> list[str]:
    """``ACL SETUSER <learner_username(job_id)> <rules...>``: everything reset, then on with this password (its
    sha256 hex: the site never stores the password itself), the job's keys, no channels, only
    :data:`LEARNER_COMMANDS`."""
    if len(password_sha256) != 64 or any(c not in "0123456789abcdef" for c in password_sha256):
        raise ValueError("password_sha256 must be 64 lowercase hex digits")
    return ["reset", "on", f"#{password_sha256}", *(f"~{p}" for p in learner_key_patterns(job_id)),
            "resetchannels", "-@all", *(f"+{c}" for c in LEARNER_COMMANDS)]
