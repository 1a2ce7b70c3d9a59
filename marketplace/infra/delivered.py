"""The groups the site accepted from each worker for each job, counted by the site process that accepted them and
written to the database (``Activation.groups_accepted``): the site's own record of what a worker delivered, which
caps the audits a learner may report of it (``services.audits``; docs/trust.md "Who may report, and how much").

The stream's ``delivered`` hash (``dataplane.replay``) counts the same in Redis, where a learner handed the streams'
URL without its own user ("Where there is no door") could write it; this count lives in the process and the
database only. Accepting a group stays one Redis round trip: the count is added here in memory and flushed in one
bulk update at most every ``FLUSH_S`` by whoever asks (the agent socket after a rollout message, on its database
thread; ``services.audits`` before it reads the count). A process that dies loses at most its last ``FLUSH_S`` of
counts: the cap is then lower than what was delivered, never higher.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

FLUSH_S = 5.0

_lock = threading.Lock()
_pending: Counter[tuple[int, int]] = Counter()  # (job id, worker id) -> groups accepted, not yet in the database
_flushed_at = 0.0


def add(*, job_id: int, worker_id: int, groups: int) -> None:
    """Count ``groups`` newly stored groups of ``worker_id`` in ``job_id`` (a resend of a stored group is not new)."""
    if groups > 0:
        with _lock:
            _pending[(job_id, worker_id)] += groups


def due(now: float | None = None) -> bool:
    """Whether counts wait and the last flush is ``FLUSH_S`` old."""
    return bool(_pending) and (time.monotonic() if now is None else now) - _flushed_at >= FLUSH_S


def take() -> dict[tuple[int, int], int]:
    """The counts waiting, handed to the caller to write (and forgotten here)."""
    global _flushed_at
    with _lock:
        out = dict(_pending)
        _pending.clear()
        _flushed_at = time.monotonic()
    return out


def give_back(counts: dict[tuple[int, int], int]) -> None:
    """Counts a failed write could not store: kept for the next flush."""
    with _lock:
        _pending.update(counts)
