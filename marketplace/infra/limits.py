"""Abuse limits the site enforces itself (docs/trust.md "Limits"), on HTTP and the agent websocket alike: failed
credentials per client address, hellos per worker, and a token bucket of messages per agent connection.

Counters that must hold across connections and processes live in Django's cache (``ECHO2_CACHE_URL``: Redis in
production; the default local-memory cache counts per process). The per-connection bucket is plain memory. The
REST API's side (its throttles, a credential check guarded by :data:`AUTH_FAILURES`) is ``api/throttling.py``.
"""

from __future__ import annotations

import contextlib
import time

from django.conf import settings
from django.core.cache import cache

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


class FailureBudget:
    """At most ``N`` failed credential checks per ``T`` seconds per client address (the rate of ``scope``), counted
    atomically, so concurrent guesses cannot all be checked before the first failure is counted (40 of 40
    concurrent guesses were checked against a limit of 30).

    Two counters per address, each changed by one atomic cache increment (Redis ``INCR`` in production): the
    failures of the current window of ``T`` seconds, and the checks in flight. A check first counts itself in
    flight, and runs only if failures + in flight stay within ``N``; a failure is added to the window before it
    leaves the flight, so the sum never dips. An address over its failures waits for the window's end; one whose
    honest checks merely crowd the budget waits a second. Fixed windows: at most ``2N`` failures across an edge."""

    FLIGHT_TTL_S = 60  # a unit a crashed process never gave back is forgotten after this

    def __init__(self, scope: str) -> None:
        self.scope = scope

    def _keys(self, ident: str, now: float) -> tuple[str, str, int, float]:
        """(the window's failures key, the in-flight key, the failures allowed, seconds left in the window)."""
        allowed, window = _rate(self.scope)
        index = int(now // window)
        base = f"echo2:authfail:{self.scope}:{ident}"
        return f"{base}:{index}", f"{base}:flight", allowed, (index + 1) * window - now

    @staticmethod
    def _add(key: str, delta: int, timeout: float) -> int:
        cache.add(key, 0, timeout=int(timeout) + 2)
        try:
            return cache.incr(key, delta)
        except ValueError:  # expired between add and incr
            cache.add(key, max(delta, 0), timeout=int(timeout) + 2)
            return max(delta, 0)

    def reserve(self, ident: str, *, now: float | None = None) -> tuple[float, tuple[str, str] | None]:
        """(0, a ticket) when ``ident`` may have one credential checked (it is counted in flight), else (seconds to
        wait, None). Every ticket goes back by :meth:`finish`."""
        failures_key, flight_key, allowed, left = self._keys(ident, time.time() if now is None else now)
        flying = self._add(flight_key, 1, self.FLIGHT_TTL_S)
        failed = cache.get(failures_key) or 0
        if failed + flying <= allowed:
            return 0.0, (failures_key, flight_key)
        self._leave(flight_key)
        return (max(1.0, left) if failed >= allowed else 1.0), None

    def finish(self, ticket: tuple[str, str], *, failed: bool) -> None:
        """The check of ``ticket`` is over: a wrong credential is counted in its window, then it leaves the flight."""
        failures_key, flight_key = ticket
        if failed:
            self._add(failures_key, 1, _rate(self.scope)[1])
        self._leave(flight_key)

    @staticmethod
    def _leave(flight_key: str) -> None:
        with contextlib.suppress(ValueError):  # forgotten meanwhile (FLIGHT_TTL_S)
            cache.decr(flight_key)


AUTH_FAILURES = FailureBudget("auth_failures")
"""Wrong API tokens and agent keys per client address, on HTTP and the agent websocket alike."""

HELLOS = SlidingWindow("agent_hellos")
"""Hellos per worker, across its connections (each one opens a session and re-sends its assignment)."""


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
