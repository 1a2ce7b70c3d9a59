"""Abuse limits the site enforces itself (docs/trust.md "Limits"): failed credentials per client address (HTTP
and the agent websocket), hellos per worker, and a token bucket of messages per agent connection.

Counters that must hold across connections and processes live in Django's cache (``ECHO2_CACHE_URL``: Redis in
production; the default local-memory cache counts per process). The per-connection bucket is plain memory.
Request rates of the REST API are DRF's own throttles (``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``).
"""

from __future__ import annotations

import ipaddress
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header
from rest_framework.throttling import BaseThrottle

from dataplane.budget import ConnectionBudget

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _rate(scope: str) -> tuple[int, int]:
    """(events, seconds) of a rate named in ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``, e.g. ``20/min`` (DRF's
    notation: the period's first letter counts)."""
    count, period = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"][scope].split("/")
    return int(count), _PERIODS[period.strip()[0]]


class SlidingWindow:
    """At most ``N`` events per ``T`` seconds per key (the rate of ``scope``), counted in the cache."""

    def __init__(self, scope: str) -> None:
        self.scope = scope

    def _key(self, ident: str) -> str:
        return f"echo2:throttle:{self.scope}:{ident}"

    def _recent(self, ident: str, now: float) -> tuple[list[float], int, int]:
        allowed, window = _rate(self.scope)
        history = [t for t in cache.get(self._key(ident), []) if t > now - window]
        return history, allowed, window

    def wait(self, ident: str, *, now: float | None = None) -> float:
        """Seconds until ``ident`` may act again; 0 while it is within its rate."""
        now = time.time() if now is None else now
        history, allowed, window = self._recent(ident, now)
        return 0.0 if len(history) < allowed else max(1.0, min(history) + window - now)

    def hit(self, ident: str, *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        history, allowed, window = self._recent(ident, now)
        cache.set(self._key(ident), (history + [now])[-allowed:], window)

    def take(self, ident: str, *, now: float | None = None) -> float:
        """Count one event if ``ident`` is within its rate (returns 0), else the seconds to wait (not counted)."""
        wait = self.wait(ident, now=now)
        if not wait:
            self.hit(ident, now=now)
        return wait


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


AUTH_FAILURES = SlidingWindow("auth_failures")
"""Wrong API tokens and agent keys per client address, on HTTP and the agent websocket alike."""

HELLOS = SlidingWindow("agent_hellos")
"""Hellos per worker, across its connections (each one opens a session and re-sends its assignment)."""


def guarded_authenticate(request, keyword: str, authenticate):
    """``authenticate(request)`` for a request carrying ``Authorization: <keyword> ...``, unless its client
    address failed too often lately: then a 429 (DRF's ``Throttled``, with Retry-After) before any credential is
    looked up. A failure is counted. Requests with another scheme, or none, pass through untouched."""
    header = get_authorization_header(request).split()
    if not header or header[0].lower() != keyword.lower().encode():
        return None
    ident = client_address(request) or "unknown"
    wait = AUTH_FAILURES.wait(ident)
    if wait:
        raise exceptions.Throttled(wait, detail=f"too many failed credentials from this address; retry in "
                                                f"{wait:.0f} s")
    try:
        return authenticate(request)
    except exceptions.AuthenticationFailed:
        AUTH_FAILURES.hit(ident)
        raise


class MessageBucket:
    """One agent connection's budget (``dataplane.budget.ConnectionBudget``): ``rate`` messages per second on
    average, bursts of ``burst``, and ``bytes_per_s`` bytes (bursts of two largest frames). Each refused frame
    counts as abuse; after ``close_after`` refusals in a row the site closes the connection."""

    def __init__(self, *, rate: float, burst: float, close_after: int, bytes_per_s: float | None = None,
                 max_frame: int = 1 << 20) -> None:
        self.rate, self.burst, self.bytes_per_s, self.close_after = rate, burst, bytes_per_s, close_after
        self.budget = ConnectionBudget(messages_per_s=rate, message_burst=burst, bytes_per_s=bytes_per_s,
                                       byte_burst=2 * max_frame if bytes_per_s else None)
        self.refused_in_a_row = 0
        self.refused = 0

    @classmethod
    def from_settings(cls) -> MessageBucket:
        knobs = settings.ECHO2
        return cls(rate=knobs["AGENT_MESSAGES_PER_S"], burst=knobs["AGENT_MESSAGE_BURST"],
                   close_after=knobs["AGENT_ABUSE_CLOSE_AFTER"], bytes_per_s=knobs.get("AGENT_BYTES_PER_S"),
                   max_frame=knobs["WS_MAX_MESSAGE_BYTES"])

    def take(self, size: int = 0, *, now: float | None = None) -> float:
        """0 when a frame of ``size`` bytes is within the budget (counted); else the seconds until it would be."""
        wait = self.budget.take(size, now=time.monotonic() if now is None else now)
        if wait == 0:
            self.refused_in_a_row = 0
        else:
            self.refused_in_a_row += 1
            self.refused += 1
        return wait

    @property
    def abusive(self) -> bool:
        return self.refused_in_a_row >= self.close_after

    def announced(self) -> dict[str, float | None]:
        """The ``welcome``'s budget fields."""
        return {"messages_per_s": self.rate, "message_burst": self.burst, "bytes_per_s": self.bytes_per_s}
