"""The audits' probation across a learner restart (docs/trust.md "Audits of work"): each worker's count of groups
read since it joined the job or last failed (``Auditor.seen``, learner/audit.py) is kept in the checkpoint and taken
back on resume, so a restarted learner neither audits every worker in full as if it were new, nor forgets that one
failed.

Two corrections keep the restored counts on the side of auditing more, never less:
- the groups read and not yet trained when the checkpoint was taken are not counted in it: a restarted learner
  reads them again and counts them then;
- a worker that failed after the checkpoint (the count went back to 0 in the process that died) is found by the
  entries held for the site (``dataplane.audit_hold``: every failed entry is copied aside, stamped with its worker)
  newer than the last entry the checkpoint counted: its count starts again from 0."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from .audit import Auditor, entry_order


def probation_state(audit: Auditor, unsettled: Iterable[int] = ()) -> dict:
    """What the checkpoint keeps: each worker's count (JSON keys) less its groups read and not yet trained
    (``unsettled``: their worker ids), and the newest entry counted."""
    counts = collections.Counter(dict(audit.seen))  # one C-level copy: the reader thread may be counting
    counts.subtract(unsettled)
    return {"seen": {str(w): max(0, n) for w, n in counts.items()}, "read_through": audit.read_through}


def restore_probation(audit: Auditor, state: dict | None, failed_since: dict[str, int] | None = None) -> None:
    """Take back a checkpoint's counts; ``failed_since`` (held failed entries -> their workers) puts every worker
    with a failure newer than the checkpoint's last counted entry back on full audit."""
    state = state or {}
    seen = state.get("seen", {})
    audit.seen.update({int(w): int(n) for w, n in seen.items() if str(w).isdigit() and int(n) >= 0})
    through = entry_order(str(state.get("read_through", "0-0")))
    for entry_id, worker_id in (failed_since or {}).items():
        if entry_order(entry_id) > through:
            audit.seen[worker_id] = 0
    audit.read_through = max(audit.read_through, str(state.get("read_through", "0-0")), key=entry_order)
