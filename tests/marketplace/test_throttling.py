"""Throttles: sign-in lockout, request rates per user and per address, and wrong credentials get slower."""

from __future__ import annotations

import time

import pytest
from django.test import Client
from rest_framework.test import APIClient
from rest_framework.throttling import SimpleRateThrottle

from . import factories

pytestmark = pytest.mark.django_db


def sign_in(client: Client, username: str, password: str):
    return client.post("/accounts/login/", {"username": username, "password": password})


def test_sign_in_locks_out_after_ten_failures_with_a_clear_message(settings):
    assert settings.AXES_FAILURE_LIMIT == 10
    factories.user("alice")  # password pw-12345678
    browser = Client()
    for _ in range(9):
        assert sign_in(browser, "alice", "guess").status_code == 200  # the form again, "Wrong username or password"
    assert sign_in(browser, "alice", "pw-12345678").status_code == 302, "a success before the limit resets the count"
    browser = Client()
    for _ in range(10):
        sign_in(browser, "alice", "guess")
    locked = sign_in(browser, "alice", "pw-12345678")  # the right password, too late
    page = locked.content.decode()
    assert locked.status_code == 429 and "Sign-in locked" in page and "Too many failed sign-ins" in page
    assert "0:15:00" in page, "the page says for how long"
    assert "_auth_user_id" not in browser.session
    assert sign_in(Client(REMOTE_ADDR="10.9.9.9"), "alice", "pw-12345678").status_code == 302, (
        "another address is not locked out")


def test_api_requests_are_throttled_per_user(monkeypatch):
    monkeypatch.setitem(SimpleRateThrottle.THROTTLE_RATES, "user", "3/min")  # DRF binds the rates at import
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")
    assert [api.get("/api/jobs/").status_code for _ in range(3)] == [200, 200, 200]
    refused = api.get("/api/jobs/")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "throttled" in refused.json()["detail"].lower()
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")
    assert other.get("/api/jobs/").status_code == 200, "the budget is per user"


@pytest.mark.parametrize("scheme, wrong", [("Token", "e2u_" + "0" * 64), ("Bearer", "e2w_wrong")])
def test_wrong_credentials_from_one_address_get_slower(settings, scheme, wrong):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "auth_failures": "3/min"}}
    user = factories.user()
    good = factories.token(user)
    attacker = APIClient(REMOTE_ADDR="203.0.113.9")
    attacker.credentials(HTTP_AUTHORIZATION=f"{scheme} {wrong}")
    assert [attacker.get("/api/jobs/").status_code for _ in range(3)] == [401, 401, 401]
    slowed = attacker.get("/api/jobs/")
    assert slowed.status_code == 429 and int(slowed["Retry-After"]) > 0
    assert "too many failed credentials from this address" in slowed.json()["detail"]
    attacker.credentials(HTTP_AUTHORIZATION=f"Token {good}")
    assert attacker.get("/api/jobs/").status_code == 429, "not even a right guess gets through meanwhile"
    elsewhere = APIClient(REMOTE_ADDR="198.51.100.7")
    elsewhere.credentials(HTTP_AUTHORIZATION=f"Token {good}")
    assert elsewhere.get("/api/jobs/").status_code == 200


def test_a_forged_forwarded_for_header_does_not_reset_the_count(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "auth_failures": "2/min"}}
    attacker = APIClient(REMOTE_ADDR="203.0.113.9")
    attacker.credentials(HTTP_AUTHORIZATION="Bearer e2w_wrong")
    codes = [attacker.get("/api/jobs/", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}").status_code for i in range(4)]
    assert codes == [401, 401, 429, 429]


def test_behind_a_proxy_the_forwarded_address_counts_and_garbage_in_it_is_no_500(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    factories.user("bob")
    for _ in range(10):
        sign_in(Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.4"), "bob", "guess")
    locked = sign_in(Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.4"), "bob", "pw-12345678")
    assert locked.status_code == 429
    other = sign_in(Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.5"), "bob", "pw-12345678")
    assert other.status_code == 302, "another client behind the same proxy is not locked out"
    forged = sign_in(Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="not-an-address"), "bob", "guess")
    assert forged.status_code == 200


@pytest.mark.parametrize("backend", ["locmem", "redis"])
def test_concurrent_wrong_guesses_are_counted_before_they_are_checked(settings, redis_url, backend):
    """Issue 26: the count was read before a check and written after it, so 40 concurrent guesses were all checked
    against a limit of 30. Now a check counts itself before it runs (one atomic increment): at most 30 are checked,
    the others refused unchecked, whatever the cache (Django's local memory, or Redis as in production)."""
    import threading
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from rest_framework.exceptions import AuthenticationFailed, Throttled
    from rest_framework.test import APIRequestFactory

    from marketplace.api.throttling import guarded_authenticate

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "auth_failures": "30/d"}}  # no window edge mid-test
    if backend == "redis":
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                       "LOCATION": redis_url}}
    address = f"2001:db8::{uuid.uuid4().int % 0xFFFF:x}"  # a fresh client: no count left by another run
    checked, lock, start = [], threading.Lock(), threading.Barrier(40)

    def wrong(request):
        with lock:
            checked.append(1)
        time.sleep(0.05)  # the lookup takes a while: the others arrive meanwhile
        raise AuthenticationFailed("invalid token")

    def guess(_, *, together: bool = True) -> int:
        request = APIRequestFactory().get("/api/jobs/", REMOTE_ADDR=address, HTTP_AUTHORIZATION="Token e2u_guess")
        if together:
            start.wait()
        try:
            guarded_authenticate(request, "Token", wrong)
        except Throttled:
            return 429
        except AuthenticationFailed:
            return 401
        return 200

    with ThreadPoolExecutor(40) as pool:
        codes = list(pool.map(guess, range(40)))
    burst = len(checked)
    # Never more than 30 checked; fewer when refused guesses, counted in flight a moment, crowd out others.
    assert 0 < burst <= 30 and codes.count(401) == burst and codes.count(429) == 40 - burst
    while guess(0, together=False) == 401:  # one at a time, the window's failures are spent exactly
        assert len(checked) <= 30
    assert len(checked) == 30
