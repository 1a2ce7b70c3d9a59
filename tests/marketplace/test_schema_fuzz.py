"""The API against its own OpenAPI schema (schemathesis, property-based): whatever a client sends, no server error,
and every response (status, content type, body) is what the schema says. Bounded examples per operation."""

from __future__ import annotations

import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis import checks

from . import factories

FUZZ_EXAMPLES = int(os.environ.get("ECHO2_FUZZ_EXAMPLES", "25"))  # per operation and id mode
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance]


pytestmark = pytest.mark.django_db


schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())


@pytest.fixture
def in_test_transaction():
    """The WSGI app runs in this thread, inside the test's transaction: like Django's test client, keep the
    end of each request from closing the database connection (PostgreSQL would lose the transaction)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def owner(db, redis_url, settings, in_test_transaction):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "auth_failures": "100000/min"}}
    user = factories.user()
    job = factories.job(user)
    worker, _ = factories.worker(user)
    return {"headers": {"Authorization": f"Token {factories.token(user)}"}, "job": job.pk, "worker": worker.pk}


@pytest.mark.parametrize("real_ids", [False, True], ids=["any-id", "own-objects"])
@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_error_and_no_schema_violation(case, owner, real_ids):
    """Once with the ids hypothesis makes up (mostly 404s), once on the owner's own job and worker, so that
    every operation really runs with fuzzed bodies and parameters."""
    if real_ids and "id" in (case.path_parameters or {}):
        case.path_parameters["id"] = owner["worker" if case.path.startswith("/api/workers/") else "job"]
    case.call_and_validate(headers=owner["headers"], checks=CHECKS)
