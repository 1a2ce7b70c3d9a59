"""The REST API's side of the abuse limits (docs/trust.md "Limits"): the client address the throttles count by,
and a credential check that waits out an address's failed credentials (``infra/limits.py``'s
:data:`~marketplace.infra.limits.AUTH_FAILURES`, shared with the agent websocket). Request rates of the REST API are
DRF's own throttles (``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``).
"""

from __future__ import annotations

import ipaddress

from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header
from rest_framework.throttling import BaseThrottle

from ..infra.limits import AUTH_FAILURES


def client_address(request) -> str | None:
    """The client's address as the throttles see it: the socket's peer, or with ``ECHO2_NUM_PROXIES`` trusted
    proxies the address the outermost one saw (DRF's rule). django-axes locks sign-ins out by it too, and stores
    it in an address column: anything that is not an IP address (a forged header) falls back to the peer's, and
    None when there is none (a request made up in a test)."""
    for candidate in (BaseThrottle().get_ident(request), request.META.get("REMOTE_ADDR")):
        try:
            return str(ipaddress.ip_address((candidate or "").strip()))
        except ValueError:
            continue
    return None


def guarded_authenticate(request, keyword: str, authenticate):
    """``authenticate(request)`` for a request carrying ``Authorization: <keyword> ...``, unless its client
    address failed too often lately: then a 429 (DRF's ``Throttled``, with Retry-After) before any credential is
    looked up. A failure is counted (:class:`FailureBudget`). Requests with another scheme, or none, pass through
    untouched."""
    header = get_authorization_header(request).split()
    if not header or header[0].lower() != keyword.lower().encode():
        return None
    wait, ticket = AUTH_FAILURES.reserve(client_address(request) or "unknown")
    if ticket is None:
        raise exceptions.Throttled(wait, detail=f"too many failed credentials from this address; retry in "
                                                f"{wait:.0f} s")
    failed = True
    try:
        found = authenticate(request)
        failed = False
        return found
    except exceptions.AuthenticationFailed:
        raise
    except Exception:
        failed = False  # no verdict (the database did not answer): nothing counted
        raise
    finally:
        AUTH_FAILURES.finish(ticket, failed=failed)
