"""The ASGI gate in front of Django: what is refused before a request touches the database or its body is read.

Django's ASGI handler reads a whole request body (to a spooled file) before any view runs, and a sign-in form
holds a pooled database connection while it hashes a password. So two kinds of request are answered here, in
the event loop, without a thread, a connection or the body:

- **Sign-in floods.** ``POST`` to a sign-in path (``/accounts/login/``, ``/admin/login/``) passes only within a
  per-address token bucket (``ECHO2_SIGNIN_PER_ADDRESS``/minute, that many at once), a site-wide bucket
  (``ECHO2_SIGNIN_PER_MIN``/minute per process) and a cap on sign-ins in progress (``ECHO2_SIGNIN_INFLIGHT``,
  well under ``ECHO2_DB_POOL_MAX``): past any of them it is a 429 with ``Retry-After``, never a 500. Agents
  (websockets), learners and owners (tokens, sessions) never pass through these buckets, so the pool's other
  connections stay theirs however many anonymous posts arrive.
- **Anonymous load.** A request with no credentials (no ``Authorization`` header, no session cookie) waits for
  nothing: past ``ECHO2_ANON_INFLIGHT`` such requests in progress it is a 503 with ``Retry-After`` (the sign-in
  form a flood fetches first is CPU, and the agents' and owners' requests share that CPU). Health checks,
  static files and the agent wheel are exempt.
- **Bodies over a cap.** ``POST /api/datasets/`` whose ``Content-Length`` passes ``ECHO2_DATASET_MAX_BYTES``, and
  any other request whose ``Content-Length`` passes ``ECHO2_MAX_BODY_BYTES`` (64 MiB: far above any report, form
  or job file), is a 413 before a byte of the body is received.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict

from django.conf import settings

SIGNIN_PATHS = ("/accounts/login/", "/admin/login/")
EXEMPT = ("/healthz", "/readyz", "/metrics", "/static/", "/dist/")
DATASETS_PATH = "/api/datasets/"
_ADDRESSES = 50_000  # buckets kept; the least recently seen address is forgotten first


class Bucket:
    """A token bucket: ``burst`` at once, refilled at ``per_minute``."""

    def __init__(self, per_minute: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = per_minute / 60.0, burst, burst, now

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one will be there."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate if self.rate > 0 else 60.0


class Gate:
    """ASGI middleware around the HTTP application (see the module)."""

    def __init__(self, app, *, clock=time.monotonic) -> None:
        self.app, self.clock = app, clock
        limits = settings.ECHO2
        self.per_address = float(limits.get("SIGNIN_PER_ADDRESS", 10))
        self.inflight_max = int(limits.get("SIGNIN_INFLIGHT", 4))
        self.site = Bucket(float(limits.get("SIGNIN_PER_MIN", 600)), float(limits.get("SIGNIN_INFLIGHT", 4)) * 4,
                           clock())
        self.addresses: OrderedDict[str, Bucket] = OrderedDict()
        self.inflight = 0
        self.anonymous_max, self.anonymous = int(limits.get("ANON_INFLIGHT", 16)), 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, post = scope.get("path", ""), scope.get("method") == "POST"
        refused = self._too_large(scope, datasets=post and path == DATASETS_PATH)
        if refused:
            return await _answer(send, 413, refused, None)
        if _anonymous(scope) and not path.startswith(EXEMPT):
            if self.anonymous >= self.anonymous_max:
                return await _answer(send, 503, "the site is busy with anonymous requests; retry in a moment", 1.0)
            self.anonymous += 1
            try:
                return await self._signin(scope, receive, send) if post and path in SIGNIN_PATHS else \
                    await self.app(scope, receive, send)
            finally:
                self.anonymous -= 1
        if post and path in SIGNIN_PATHS:
            return await self._signin(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _signin(self, scope, receive, send):
        wait = self._admit(_address(scope))
        if wait:
            return await _answer(send, 429, "too many sign-in attempts; retry later", wait)
        self.inflight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.inflight -= 1

    def _admit(self, address: str) -> float:
        """0 to let a sign-in through, else the seconds to wait (Retry-After)."""
        if self.inflight >= self.inflight_max:
            return 1.0
        now = self.clock()
        bucket = self.addresses.pop(address, None) or Bucket(self.per_address, self.per_address, now)
        self.addresses[address] = bucket
        while len(self.addresses) > _ADDRESSES:
            self.addresses.popitem(last=False)
        wait = bucket.take(now)
        if wait:
            return wait
        wait = self.site.take(now)
        if wait:
            bucket.tokens += 1  # the site was full, not this address: its attempt is not spent
        return wait

    def _too_large(self, scope, *, datasets: bool) -> str | None:
        cap = int(settings.ECHO2["DATASET_MAX_BYTES"] if datasets else settings.ECHO2.get("MAX_BODY_BYTES", 64 << 20))
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > cap:
                return (f"body: a data set of {int(value)} bytes, at most {cap} (ECHO2_DATASET_MAX_BYTES)" if datasets
                        else f"body: {int(value)} bytes, at most {cap} (ECHO2_MAX_BODY_BYTES)")
        return None


def _anonymous(scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"authorization" or (name == b"cookie" and b"sessionid=" in value):
            return False
    return True


def _address(scope) -> str:
    """The address the API's throttles count by (``ECHO2_NUM_PROXIES``, as DRF reads X-Forwarded-For): behind a
    proxy the socket's peer is the proxy, and every sign-in would share one bucket."""
    proxies = int(settings.REST_FRAMEWORK.get("NUM_PROXIES") or 0)
    if proxies > 0:
        forwarded = next((v for n, v in scope.get("headers", ()) if n == b"x-forwarded-for"), b"").decode("latin-1")
        hops = [h.strip() for h in forwarded.split(",") if h.strip()]
        if hops:
            return hops[-min(proxies, len(hops))]
    client = scope.get("client")
    return str(client[0]) if client else "?"


async def _answer(send, status: int, detail: str, retry_after: float | None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, int(retry_after + 0.999))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
