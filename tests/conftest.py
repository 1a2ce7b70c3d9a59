"""Shared fixtures: a real Redis (a dedicated database index, flushed per test) and a tiny model."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

# Property tests judge results, not speed: on a loaded CI machine Hypothesis' timing checks (an example's deadline,
# inputs generated too slowly) failed tests whose properties held.
hypothesis_settings.register_profile("echo2", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("echo2")


@pytest.fixture
def redis_url(settings) -> str:
    """A clean Redis database for one test; the site's streams and channel layer point at it."""
    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.fail(f"Redis is not reachable at {TEST_REDIS_URL}: run `make services` (or set TEST_REDIS_URL)")
    client.flushdb()
    settings.REDIS_URL = TEST_REDIS_URL
    settings.STREAMS_REDIS_URL = ""  # the streams beside it
    settings.LEARNER_REDIS_USERS = False  # the machine's Redis: its users are not ours to make (private_redis.py is)
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "marketplace.realtime.channel_layer.ResilientRedisChannelLayer",
                                           "CONFIG": {"hosts": [TEST_REDIS_URL], "prefix": "echo2test"}}}
    from channels.layers import channel_layers

    from marketplace.infra import stream

    channel_layers.backends.clear()
    stream.client.cache_clear()
    yield TEST_REDIS_URL
    stream.client.cache_clear()
    channel_layers.backends.clear()
    client.flushdb()
    client.close()


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Llama model and character tokenizer for the arithmetic task, in Hugging Face layout."""
    from dataplane.tasks import build_task
    from learner.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny-arithmetic"
    return build_tiny_model(path, alphabet=build_task({"name": "arithmetic"}).alphabet, hidden=32, layers=1)


@pytest.fixture(autouse=True)
def _fresh_throttles():
    """Throttle and lockout counters (Django's cache, local memory in tests) start empty in every test. A shared
    cache (ECHO2_CACHE_URL) is never flushed here."""
    from django.conf import settings
    from django.core.cache import cache

    local = settings.CACHES["default"]["BACKEND"].endswith("LocMemCache")
    if local:
        cache.clear()
    yield
    if local:
        cache.clear()


@pytest.fixture(autouse=True)
def _fresh_load_shedding(monkeypatch):
    """The site process's lateness (``marketplace.realtime.lag``) starts on time in every test: a test whose replies
    were slow on purpose (Redis away for seconds) must not make a later test's socket announce a lower budget."""
    from marketplace.realtime import lag

    monkeypatch.setattr(lag, "SHEDDING", lag.Shedding())


@pytest.fixture(autouse=True)
def _close_async_test_connections(request):
    """An async test's database work runs on asgiref's single thread executor (its own ``database_sync_to_async``
    calls) and on the agent sockets' threads (``marketplace.realtime.dbthreads``), whose connections outlive the
    test (CONN_MAX_AGE): left open, PostgreSQL refuses to drop the test database at the end of the session. Closed
    after each async test, in those threads."""
    yield
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        from asgiref.sync import SyncToAsync
        from django.db import connections

        from marketplace.realtime import dbthreads

        SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=30)
        dbthreads.close_connections()


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Users are created in many tests; the production hasher is deliberately slow."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def stack(tmp_path, redis_url):
    """Processes of a live site (tests/live.py), all stopped after the test."""
    from .live import make_stack

    stack = make_stack(tmp_path, redis_url)
    yield stack
    stack.stop()
