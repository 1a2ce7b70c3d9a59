"""The learner's door: a Redis user per learner session on the streams' Redis, whose keys are its job's alone
(``dataplane.learner_acl`` says which keys and commands; docs/trust.md "The learner's door").

The site's own connection (``stream.client``) keeps full rights and makes, rotates and deletes these users. The
password is random, handed to the learner once over the authenticated API; the site keeps its sha256 only, from
which it sets the user again when Redis lost it (ACL users are not in the AOF: a restart drops them).

Where per-job users cannot be had (``ECHO2_LEARNER_REDIS_USERS`` off, a Redis without ACLs, streams outside database
0, which a learner could only reach by ``SELECT``), the door is the site's own streams URL, full rights: the site
logs why when it starts (:func:`log_startup`) and at every learner that gets it.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from django.conf import settings

from dataplane.learner_acl import learner_acl_rules, learner_username

from . import stream

log = logging.getLogger("echo2.learner_door")


@dataclass(frozen=True)
class LearnerDoor:
    """What a learner is handed: the URL it connects with (its user and password in it) and whether that user is its
    job's own (``isolated``), else why not."""

    url: str
    username: str
    isolated: bool
    reason: str = ""


def unisolated_reason() -> str | None:
    """Why learners cannot get users of their own here, or None when they can (one round trip: ``ACL WHOAMI``)."""
    if not settings.LEARNER_REDIS_USERS:
        return "ECHO2_LEARNER_REDIS_USERS is off"
    db = urlsplit(stream.url()).path.strip("/") or "0"
    if db != "0":
        return f"the streams are in Redis database {db}: a learner's user may not SELECT, so per-job users need 0"
    try:
        stream.client().execute_command("ACL", "WHOAMI")
    except redis.ResponseError as err:
        return f"this Redis has no ACLs ({err})"
    return None


def public_url(username: str | None, password: str | None) -> str:
    """The streams' public URL (``STREAMS_PUBLIC_URL``, else the site's without its credentials) as this user (no
    user: the default one; no password: none)."""
    if settings.STREAMS_PUBLIC_URL:
        parts = urlsplit(settings.STREAMS_PUBLIC_URL)
    else:  # the site's own, less what is the site's alone (its CA file's path and the like: ?ssl_ca_certs=...)
        parts = urlsplit(stream.url())._replace(query="")
    host = parts.hostname or "127.0.0.1"
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{parts.port}" if parts.port else ""
    if password:
        netloc = f"{quote(username or '', safe='')}:{quote(password, safe='')}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def door_open(job_id: int) -> tuple[LearnerDoor, str]:
    """A fresh door for job ``job_id``'s learner: its user set with a new password (the old one refused from now
    on) and every connection of the old one closed. Returns the door and the password's sha256 (to keep: it lets
    :func:`door_restore` set the user again). Raises ``redis.RedisError`` when Redis does not answer."""
    reason = unisolated_reason()
    if reason is not None:
        log.warning("job %s: its learner gets the site's own streams URL, with full rights: %s (docs/trust.md "
                    "\"The learner's door\")", job_id, reason)
        site = urlsplit(stream.url())
        return LearnerDoor(url=public_url(site.username, site.password), username=site.username or "default",
                           isolated=False, reason=reason), ""
    password = secrets.token_urlsafe(32)
    digest = hashlib.sha256(password.encode()).hexdigest()
    username = learner_username(job_id)
    client = stream.client()
    client.execute_command("ACL", "SETUSER", username, *learner_acl_rules(job_id, password_sha256=digest))
    closed = client.execute_command("CLIENT", "KILL", "USER", username)  # the previous session's connections
    log.info("job %s: learner door %s opened (%s earlier connection(s) closed)", job_id, username, closed)
    return LearnerDoor(url=public_url(username, password), username=username, isolated=True), digest


def door_restore(job_id: int, password_sha256: str) -> bool:
    """Set job ``job_id``'s learner user again from its password's sha256 (idempotent: the user's connections
    stay). True when it was missing (Redis lost it). Its heartbeat calls this: a restarted Redis lets it in again."""
    username = learner_username(job_id)
    client = stream.client()
    missing = client.execute_command("ACL", "GETUSER", username) is None
    if missing:
        client.execute_command("ACL", "SETUSER", username, *learner_acl_rules(job_id, password_sha256=password_sha256))
        log.warning("job %s: learner door %s was gone from Redis (a restart?); set again", job_id, username)
    return missing


def door_close(job_id: int) -> None:
    """Delete job ``job_id``'s learner user; Redis closes its connections. Redis away: logged, the user stays (its
    keys are gone with the job's streams, and the next door of the job replaces its password)."""
    username = learner_username(job_id)
    try:
        if stream.client().execute_command("ACL", "DELUSER", username):
            log.info("job %s: learner door %s closed", job_id, username)
    except redis.ResponseError:
        pass  # no ACLs here: there was no user to delete
    except redis.RedisError as err:
        log.warning("job %s: could not delete learner user %s (Redis: %s)", job_id, username, err)


def log_startup() -> None:
    """Say once, when the site starts, whether learners get users of their own (and what it means if not)."""
    try:
        reason = unisolated_reason()
    except redis.RedisError as err:
        log.warning("learner doors: cannot tell yet whether this Redis has ACLs (%s)", err)
        return
    if reason is None:
        log.info("learner doors: each learner gets a Redis user of its own, its job's keys alone, on %s",
                 public_url(None, None))
    else:
        log.warning("learner doors: NONE: %s. Every learner is handed the streams' URL with the site's own rights "
                    "(every job's keys, and the channel layer, broker and cache where they share that Redis): run "
                    "this only where every job owner is trusted (docs/trust.md \"The learner's door\")", reason)

