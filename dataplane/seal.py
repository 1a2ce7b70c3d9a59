"""The site's seal on a group it accepted (docs/trust.md "Audits the site checks").

When the site appends an accepted group to a job's trajectory stream it adds a ``seal`` field: an HMAC-SHA256, under
a key only the site holds, of the entry as it stores it. The learner holds the job's Redis URL with write access, so
it could write an entry of its own into the stream or into an audit hold (``dataplane.audit_hold``) naming any
worker; the site believes a stored group in an audit only when its seal is valid: one without a seal, or with a
seal that does not match its fields, is no group the site accepted.

What the seal covers, as one canonical byte string (:func:`sealed_bytes`): a version tag, the job, the worker the
site accepted the group from (the entry's ``worker_id``), the lease it answered (``lease_id``, the prompt's entry
id, unique in the job) and the entry's ``data``, the stored bytes themselves (``dataplane.groupcodec``: group id,
version, prompt, completions, rewards, token ids, claimed log-probs, masks, metadata). The integers and the lease id
hold no NUL, and ``data`` comes last, so two different entries never give the same bytes. Not covered: the stream
entry id (assigned by Redis on append); the site binds an audit verdict to the sealed lease as well as to the
entry id, so one accepted group copied under several entry ids is counted once.

Plain functions over bytes: the key is the caller's (``marketplace.infra.group_seal``), never sent to Redis (the
learner can watch every command there) nor to an agent.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

SEAL_FIELD = "seal"
_TAG = b"echo2-group-seal/v1\x00"


def seal_key(secret: str | bytes, purpose: str) -> bytes:
    """A 32-byte key for ``purpose`` derived from a site secret (as Django's ``salted_hmac`` derives its keys): a
    seal key is useless for anything else the secret signs, and the reverse."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(purpose.encode() + b"\x00" + raw).digest()


def sealed_bytes(*, job_id: int, worker_id: int, lease_id: str, data: bytes) -> bytes:
    """The canonical bytes a seal covers (module docstring)."""
    return b"%s%d\x00%d\x00%s\x00%s" % (_TAG, int(job_id), int(worker_id), lease_id.encode(), data)


def seal(key: bytes, *, job_id: int, worker_id: int, lease_id: str, data: bytes) -> str:
    """The seal of one stored entry under ``key``, as hex."""
    return hmac.digest(key, sealed_bytes(job_id=job_id, worker_id=worker_id, lease_id=lease_id, data=data),
                       "sha256").hex()  # the one-shot (OpenSSL's HMAC): a few us less per group than hmac.new


def seal_valid(keys: Iterable[bytes], claimed: str | bytes | None, *, job_id: int, worker_id: int, lease_id: str,
               data: bytes) -> bool:
    """Whether ``claimed`` is the entry's seal under one of ``keys`` (the current key first, then those of rotated
    secrets); constant-time comparison for each."""
    if claimed is None:
        return False
    claimed = claimed.encode() if isinstance(claimed, str) else claimed  # bytes: any text compares, none raises
    msg = sealed_bytes(job_id=job_id, worker_id=worker_id, lease_id=lease_id, data=data)
    return any(hmac.compare_digest(hmac.digest(key, msg, "sha256").hex().encode(), claimed) for key in keys)
