"""Who an agent socket is: the agent key from its ``Authorization`` header, checked against the workers' keys
under the per-client budget of failed credentials (``infra.limits.AUTH_FAILURES``)."""

from __future__ import annotations

from ..infra import limits
from ..models import Worker
from ..reads import selectors


def bearer_key(scope) -> str:
    """The key from the ``Authorization: Bearer`` header, never from the URL (URLs end up in proxy logs)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization" and value.lower().startswith(b"bearer "):
            return value[7:].decode(errors="replace").strip()
    return ""


def worker_by_key(client: str, key: str | None) -> tuple[Worker | None, float]:
    """(the worker of agent key ``key``, 0), or (None, 0) for a wrong key (a failure counted against ``client``),
    or (None, seconds to wait) when ``client`` may have no credential checked now (limits.AUTH_FAILURES)."""
    wait, ticket = limits.AUTH_FAILURES.reserve(client)
    if ticket is None:
        return None, wait
    try:
        worker = selectors.worker_by_key(key)
    except Exception:
        limits.AUTH_FAILURES.finish(ticket, failed=False)  # no verdict (the database did not answer)
        raise
    limits.AUTH_FAILURES.finish(ticket, failed=worker is None)
    return worker, 0.0
