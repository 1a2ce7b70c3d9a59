"""Credentials open only what they are for: an agent key speaks the agent protocol and reports its own worker's
calibrations, nothing else; API tokens are stored hashed and shown once; no key travels in a URL."""

from __future__ import annotations

import hashlib
import importlib
from types import SimpleNamespace

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import Worker

from . import factories

pytestmark = pytest.mark.django_db


def agent_client(key: str) -> APIClient:
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return agent


REGISTER = {"name": "minted", "price_per_hour": "0.3", "bandwidth_bps": 1000}
JOB = {"name": "j", "model_dir": factories.checkpoint_dir(), "task": {"name": "arithmetic"}}


@pytest.mark.parametrize(("method", "path", "body"), [
    ("post", "/api/workers/", REGISTER),
    ("get", "/api/workers/", None),
    ("get", "/api/workers/{worker}/", None),
    ("post", "/api/jobs/", JOB),
    ("get", "/api/jobs/", None),
    ("get", "/api/jobs/{job}/", None),
    ("post", "/api/jobs/plan/", JOB),
    ("post", "/api/jobs/{job}/start/", None),
    ("post", "/api/jobs/{job}/learner/", {"t_train": 1.0}),
    ("post", "/api/jobs/{job}/metrics/", {"step": 1, "reward_mean": 0.5}),
])
def test_an_agent_key_cannot_act_as_its_provider(method, path, body):
    provider = factories.user()
    worker, key = factories.worker(provider)
    job = factories.job(provider)  # the provider's own job: the key still may not touch it
    reply = getattr(agent_client(key), method)(path.format(worker=worker.pk, job=job.pk), body, format="json")
    assert reply.status_code == 403, reply.content
    assert reply.json()["detail"].startswith("an agent key may only report its own worker's calibrations")
    assert Worker.objects.filter(name="minted").count() == 0


def test_an_agent_key_still_reports_and_reads_its_own_calibrations():
    provider = factories.user()
    worker, key = factories.worker(provider)
    agent = agent_client(key)
    body = {"model_dir": "/models/tiny", "task": {"name": "arithmetic"}, "throughput": 3.0}
    assert agent.post(f"/api/workers/{worker.pk}/calibrations/", body, format="json").status_code == 201
    assert [c["throughput"] for c in agent.get(f"/api/workers/{worker.pk}/calibrations/").json()] == [3.0]


def test_the_provider_token_still_does_everything_the_key_may_not():
    provider = factories.user()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(provider)}")
    assert api.post("/api/workers/", REGISTER, format="json").status_code == 201
    assert api.get("/api/workers/").status_code == 200
    assert api.post("/api/jobs/", JOB, format="json").status_code == 201


def test_api_tokens_are_stored_hashed():
    from knox.models import AuthToken

    user = factories.user()
    token = factories.token(user)
    row = AuthToken.objects.get(user=user)
    assert token.startswith("e2u_") and token not in (row.digest, row.token_key)
    assert row.digest == hashlib.sha512(token.encode()).hexdigest()


@pytest.mark.parametrize("header", ["Token e2u_nope", "Token " + "a" * 64, "Token e2u_\x00abcdefghijklmnopqrstuvwxyz",
                                    "Token e2u_ünïcodeünïcodeünïcode"])
def test_a_wrong_or_malformed_token_is_a_401_not_a_500(header):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=header.encode().decode("latin-1"))
    assert api.get("/api/jobs/").status_code == 401


def test_the_migration_hashes_existing_plain_tokens_and_they_keep_working():
    """A database from before: Django REST framework's authtoken table with plain-text keys."""
    from django.apps import apps
    from django.db import connection

    migration = importlib.import_module("marketplace.migrations.0012_api_tokens_hashed")
    user = factories.user()
    plain = "3f" * 20  # DRF's keys were 40 hex characters
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamp with time zone, "
                       "user_id integer)" if connection.vendor == "postgresql" else
                       "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created datetime, user_id integer)")
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s, %s)", [plain, timezone.now(), user.pk])
    migration.hash_plain_tokens(apps, SimpleNamespace(connection=connection))  # it uses the editor's connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone()[0] == 0, "no plain-text token is left"
        cursor.execute("DROP TABLE authtoken_token")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {plain}")
    assert api.get("/api/jobs/").status_code == 200
