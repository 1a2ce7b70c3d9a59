"""Transfer credentials: who may fetch which weights, and until when (docs/trust.md).

The site issues each assigned worker a short-lived token bound to (job, versions, worker), signed with the
job's secret (``Job.transfer_secret``), which only the site and the job's learner hold::

    e2t1.<job>.<worker>.<lowest version>.<highest version>.<expires, Unix s>.<hex HMAC-SHA256 of the rest>

- The learner (its HTTP server and relay hub) checks a token with the secret: :func:`verify`.
- An agent relay does not know the secret. The site tells it the sha256 of the token it gave each child it
  must serve (:func:`fingerprint`), and the relay admits a child only with that very token:
  :func:`verify_issued`. A claimed worker id proves nothing.

Fields travel in clear (they are no secret: the job, the versions, the worker, the expiry); only the
signature (or, at an agent relay, the site's fingerprint) makes them trustworthy. Comparisons are constant
time. Stdlib only: the agent, the learner, the site and the benchmark all use this module.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

PREFIX = "e2t1"
_TOKEN = re.compile(r"^e2t1\.(\d{1,12})\.(\d{1,12})\.(\d{1,12})\.(\d{1,12})\.(\d{1,14})\.([0-9a-f]{64})$")
MAX_TOKEN_CHARS = 200


class CredentialError(ValueError):
    """A credential that does not admit its bearer; ``str(err)`` is the one-line reason sent back."""


@dataclass(frozen=True)
class Grant:
    """What a valid credential allows: ``worker_id`` may fetch versions ``lowest..highest`` of ``job_id``."""

    job_id: int
    worker_id: int
    lowest: int
    highest: int
    expires: int

    def covers(self, version: int) -> bool:
        return self.lowest <= version <= self.highest


def new_secret() -> str:
    """A fresh per-job secret (256 random bits, hex: it never starts with ``-``, so it is safe as a
    command-line value; a urlsafe token did one time in 64 and argparse took it for an option)."""
    return secrets.token_hex(32)


def _signature(secret: str, body: str) -> str:
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()


def issue(secret: str, *, job_id: int, worker_id: int, lowest: int, highest: int, expires: int) -> str:
    """The token letting ``worker_id`` fetch versions ``lowest..highest`` of ``job_id`` until ``expires`` (Unix
    seconds). Deterministic: the same arguments give the same token (the site relies on it to tell a parent
    the fingerprint of the very token it gives the child)."""
    if not secret:
        raise ValueError("a credential needs the job's secret")
    if min(job_id, worker_id, lowest, expires) < 0 or highest < lowest:
        raise ValueError(f"bad credential fields: job {job_id} worker {worker_id} versions {lowest}..{highest}")
    body = f"{PREFIX}.{job_id}.{worker_id}.{lowest}.{highest}.{int(expires)}"
    return f"{body}.{_signature(secret, body)}"


def fingerprint(token: str) -> str:
    """sha256 (hex) of a token: what the site tells a relay parent about its child's credential."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse(token: object) -> tuple[Grant, str, str]:
    """The grant a token claims, its signed body and its signature; nothing is verified yet."""
    if not isinstance(token, str) or not token:
        raise CredentialError("no credential")
    match = _TOKEN.match(token) if len(token) <= MAX_TOKEN_CHARS else None
    if match is None:
        raise CredentialError("malformed credential")
    job, worker, lowest, highest, expires = (int(g) for g in match.groups()[:5])
    if highest < lowest:
        raise CredentialError("malformed credential")
    return Grant(job, worker, lowest, highest, expires), token.rpartition(".")[0], match.group(6)


def _check_scope(grant: Grant, *, job_id: int, version: int, now: float) -> Grant:
    if grant.job_id != job_id:
        raise CredentialError(f"credential for job {grant.job_id}, not job {job_id}")
    if not grant.covers(version):
        raise CredentialError(f"credential covers versions {grant.lowest}..{grant.highest}, not {version}")
    if now >= grant.expires:
        raise CredentialError(f"credential expired {now - grant.expires:.0f} s ago")
    return grant


def verify(secret: str | None, token: object, *, job_id: int, version: int, now: float,
           worker_id: int | None = None) -> Grant:
    """The grant of a token signed with ``secret`` for ``job_id`` that covers ``version`` and has not expired
    at ``now`` (and, when ``worker_id`` is given, was issued to that worker); raises :class:`CredentialError`
    naming the first thing wrong: malformed, bad signature, another job, version not covered, expired,
    another worker's."""
    if not secret:
        raise CredentialError("this server does not hold the job's transfer secret yet")
    grant, body, signature = parse(token)
    if not hmac.compare_digest(_signature(secret, body), signature):
        raise CredentialError("bad credential signature")
    _check_scope(grant, job_id=job_id, version=version, now=now)
    if worker_id is not None and grant.worker_id != worker_id:
        raise CredentialError(f"credential of worker {grant.worker_id}, not of worker {worker_id}")
    return grant


def verify_issued(token: object, fingerprints: Iterable[str], *, job_id: int, version: int, worker_id: int,
                  now: float) -> Grant:
    """For a relay without the secret: the token must be one the site issued to ``worker_id`` (its sha256 is
    among ``fingerprints``, the site's word for that child), for this job and version, and unexpired."""
    grant, _, _ = parse(token)
    presented = fingerprint(token)  # type: ignore[arg-type]  # parse() proved it a str
    matched = False
    for expected in fingerprints:  # every one compared, in constant time each
        matched |= hmac.compare_digest(presented, expected)
    if not matched:
        raise CredentialError(f"credential is not the one the site issued to worker {worker_id}")
    if grant.worker_id != worker_id:
        raise CredentialError(f"credential of worker {grant.worker_id}, not of worker {worker_id}")
    return _check_scope(grant, job_id=job_id, version=version, now=now)


LEARNER_PREFIX = "e2l1"
LEARNER_HEADER = "X-Echo2-Learner"
"""The header a learner's reports carry its :func:`learner_token` in (``POST /api/jobs/<id>/metrics/``)."""


def learner_token(secret: str, *, job_id: int) -> str:
    """The job's learner credential, ``e2l1.<job>.<HMAC-SHA256 hex>``: what vouches that a report comes from a
    process holding the job's secret (the learner, from its announcement's reply), not merely from someone with
    the owner's API token. The site takes audits of workers only with it (docs/trust.md "Audits of work")."""
    if not secret:
        raise ValueError("a learner credential needs the job's secret")
    body = f"{LEARNER_PREFIX}.{int(job_id)}"
    return f"{body}.{_signature(secret, body)}"


def verify_learner(secret: str | None, token: object, *, job_id: int) -> None:
    """Raises :class:`CredentialError` unless ``token`` is job ``job_id``'s :func:`learner_token` (constant time)."""
    if not isinstance(token, str) or not token:
        raise CredentialError("no learner credential")
    if not secret:
        raise CredentialError("the job has no transfer secret")
    if len(token) > MAX_TOKEN_CHARS or not hmac.compare_digest(token.encode(), learner_token(secret, job_id=job_id)
                                                               .encode()):
        raise CredentialError(f"not job {job_id}'s learner credential")
