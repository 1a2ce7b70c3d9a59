"""The ASGI gate (echo2_site/gate.py) as daphne runs it: sign-in floods get a 429 with Retry-After before Django
takes a database connection, per address and site-wide; an upload whose Content-Length passes the cap is a 413
before its body is read."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.testing import HttpCommunicator

from echo2_site.asgi import application
from echo2_site.gate import Gate

pytestmark = pytest.mark.django_db(transaction=True)


async def _post(path: str, address: str, app=application) -> dict:
    communicator = HttpCommunicator(app, "POST", path, body=b"username=a&password=b",
                                    headers=[(b"content-type", b"application/x-www-form-urlencoded"),
                                             (b"host", b"localhost")])
    communicator.scope["client"] = (address, 40000)
    return await communicator.get_response(timeout=20)


async def test_a_sign_in_flood_from_one_address_is_429_with_retry_after_and_others_still_pass(settings):
    statuses = [(await _post("/accounts/login/", "203.0.113.7"))["status"] for _ in range(14)]

    assert statuses[:10] == [403] * 10  # Django answered (no CSRF token): nothing refused these
    assert statuses[10:] == [429] * 4
    refused = await _post("/admin/login/", "203.0.113.7")
    assert refused["status"] == 429 and int(dict(refused["headers"])[b"retry-after"]) >= 1
    assert (await _post("/accounts/login/", "198.51.100.9"))["status"] == 403  # another address is not held


async def test_sign_ins_past_the_in_flight_cap_are_refused_while_the_others_run(settings):
    release = asyncio.Event()

    async def slow_site(scope, receive, send):  # a sign-in that holds its connection until released
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = Gate(slow_site)
    held = [asyncio.ensure_future(_post("/accounts/login/", f"192.0.2.{i}", gate)) for i in range(gate.inflight_max)]
    while gate.inflight < gate.inflight_max:
        await asyncio.sleep(0.01)
    refused = await _post("/accounts/login/", "192.0.2.200", gate)
    release.set()

    assert refused["status"] == 429 and dict(refused["headers"])[b"retry-after"] == b"1"
    assert [r["status"] for r in await asyncio.gather(*held)] == [200] * gate.inflight_max
    assert (await _post("/api/jobs/", "192.0.2.200", gate))["status"] == 200  # other paths never wait here


async def test_an_upload_over_the_cap_is_a_413_before_its_body_is_read(settings):
    communicator = ApplicationCommunicator(application, {
        "type": "http", "http_version": "1.1", "method": "POST", "path": "/api/datasets/",
        "raw_path": b"/api/datasets/",
        "query_string": b"", "root_path": "", "scheme": "http", "client": ("203.0.113.8", 1), "server": ("t", 80),
        "headers": [(b"content-length", str(1 << 40).encode()), (b"authorization", b"Token nope")]})
    # no body is ever sent: a site that read it first would wait here until the timeout
    start = await communicator.receive_output(timeout=5)
    body = await communicator.receive_output(timeout=5)

    assert start["status"] == 413
    assert b"at most" in body["body"] and b"ECHO2_DATASET_MAX_BYTES" in body["body"]


async def test_anonymous_requests_past_their_cap_are_503_while_owners_and_health_checks_pass(settings):
    release = asyncio.Event()

    async def slow_site(scope, receive, send):
        if scope["path"] != "/healthz":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def get(path: str, *headers: tuple[bytes, bytes]) -> int:
        communicator = HttpCommunicator(gate, "GET", path, headers=list(headers))
        return (await communicator.get_response(timeout=20))["status"]

    gate = Gate(slow_site)
    held = [asyncio.ensure_future(get("/accounts/login/")) for _ in range(gate.anonymous_max)]
    while gate.anonymous < gate.anonymous_max:
        await asyncio.sleep(0.01)

    assert await get("/") == 503
    assert await get("/healthz") == 200
    owner = asyncio.ensure_future(get("/api/jobs/", (b"authorization", b"Token e2u_x")))
    await asyncio.sleep(0.05)
    assert not owner.done() and gate.anonymous == gate.anonymous_max  # it runs, not refused, not counted
    release.set()
    assert await owner == 200 and [await h for h in held] == [200] * gate.anonymous_max


async def test_any_other_body_over_the_cap_is_a_413_before_it_is_read(settings):
    communicator = ApplicationCommunicator(application, {
        "type": "http", "http_version": "1.1", "method": "POST", "path": "/api/jobs/1/metrics/",
        "raw_path": b"/api/jobs/1/metrics/", "query_string": b"", "root_path": "", "scheme": "http",
        "client": ("203.0.113.8", 1), "server": ("t", 80),
        "headers": [(b"content-length", str(10 << 30).encode()), (b"authorization", b"Token nope")]})
    start = await communicator.receive_output(timeout=5)  # no body is ever sent

    assert start["status"] == 413
    assert b"ECHO2_MAX_BODY_BYTES" in (await communicator.receive_output(timeout=5))["body"]


async def test_behind_a_proxy_each_forwarded_address_has_its_own_bucket(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}

    async def site(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = Gate(site)

    async def post(forwarded: bytes) -> int:
        communicator = HttpCommunicator(gate, "POST", "/accounts/login/", headers=[(b"x-forwarded-for", forwarded)])
        communicator.scope["client"] = ("10.0.0.1", 5000)  # the proxy
        return (await communicator.get_response(timeout=20))["status"]

    assert [await post(b"198.51.100.1") for _ in range(11)][-1] == 429
    assert await post(b"198.51.100.1, 198.51.100.2") == 200  # another client behind the same proxy
