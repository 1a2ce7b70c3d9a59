"""The site reads a published snapshot from the job's learner (learner/serving.py), as a worker would: over the
snapshot URL the learner announced, with a transfer credential the site issues itself from the job's secret, every
chunk checked against the manifest the site recorded when the version was published. What reads this way: an
owner's export (``marketplace/api/exports.py``) and the tokenizer the site checks text audits with
(``infra/job_tokenizer.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from dataplane import credentials
from dataplane.snapshot import Manifest, SnapshotError, fetch_chunk, full_url, parse_manifest

from ..core.addresses import AddressError, PeerPolicy, check_dial_url

SITE_CREDENTIAL_HOLDER = 0
"""The worker id in the credentials the site issues itself (no worker has id 0)."""
FETCH_TIMEOUT_S = 30.0


def version_source(*, job_id: int, secret: str, url: str, manifest: Any, highest: int,
                   deadline: float | None = None) -> tuple[Manifest, Callable[[int], bytes]]:
    """The manifest (as the site recorded it, ``manifest``) and a reader of the chunks of a published version's
    full payload (a delta version's is served under full/) at ``url``. Each chunk read is verified against the
    manifest, with a fresh credential for versions ``0..highest`` (a slow download outlives any one); ``deadline``
    (``time.monotonic()``) bounds every read. Raises :class:`SnapshotError`, an address the rules refuse
    included."""
    parsed, url = parse_manifest(manifest), dialable(url)
    if parsed.kind == "delta":
        parsed, url = parsed.full, full_url(url)
    ttl = settings.ECHO2["TRANSFER_CREDENTIAL_TTL_S"]

    def fetch(index: int) -> bytes:
        if deadline is not None and time.monotonic() > deadline:
            raise SnapshotError(f"chunk {index} of version {parsed.version}: the time to fetch it ran out")
        token = credentials.issue(secret, job_id=job_id, worker_id=SITE_CREDENTIAL_HOLDER, lowest=0,
                                  highest=highest, expires=int(time.time() + ttl))
        timeout = FETCH_TIMEOUT_S if deadline is None else max(0.1, min(FETCH_TIMEOUT_S, deadline - time.monotonic()))
        return fetch_chunk(url, parsed, index, timeout=timeout, retries=1, credential=token, deadline=deadline)

    return parsed, fetch


def dialable(url: str) -> str:
    """``url`` if the site may dial it now, by the rules every peer address passes (marketplace/core/addresses.py),
    its host name's addresses included; else a :class:`SnapshotError`."""
    policy = PeerPolicy(allow_loopback=settings.ECHO2["ALLOW_LOOPBACK_PEERS"],
                        allow_private=settings.ECHO2["ALLOW_PRIVATE_PEERS"])
    try:
        return check_dial_url(url, policy)
    except AddressError as err:
        raise SnapshotError(f"snapshot URL {url!r} refused: {err}") from None
