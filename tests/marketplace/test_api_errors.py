"""A request that found every pooled database connection of its site process busy for ECHO2_DB_POOL_TIMEOUT_S gets
a 503 with Retry-After (clients retry it), never a 500 page (echo2_site/settings.py)."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from psycopg_pool import PoolTimeout
from rest_framework.test import APIClient

from marketplace.reads import selectors

from . import factories

pytestmark = pytest.mark.django_db


def test_a_request_that_waited_out_the_pool_is_a_503_to_retry(monkeypatch):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")

    def busy(user):
        try:
            raise PoolTimeout("couldn't get a connection after 10.00 sec")
        except PoolTimeout as err:  # as Django's wrapper raises it
            raise OperationalError(str(err)) from err

    monkeypatch.setattr(selectors, "jobs_visible_to", busy)
    reply = api.get("/api/jobs/")
    assert reply.status_code == 503 and reply["Retry-After"] == "1"
    assert reply.json()["detail"] == "the site's database connections are all busy; retry in a moment"


def test_other_database_errors_are_not_hidden_as_busy(monkeypatch):
    api = APIClient(raise_request_exception=True)
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")

    def broken(user):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(selectors, "jobs_visible_to", broken)
    with pytest.raises(OperationalError):
        api.get("/api/jobs/")


@pytest.mark.parametrize("cause", ["DeadlockDetected", "SerializationFailure"])
def test_a_request_chosen_as_a_deadlocks_victim_is_a_503_to_send_again(monkeypatch, cause):
    from psycopg import errors

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")

    def victim(user):
        try:
            raise getattr(errors, cause)("deadlock detected")
        except errors.Error as err:  # as Django's wrapper raises it
            raise OperationalError(str(err)) from err

    monkeypatch.setattr(selectors, "jobs_visible_to", victim)
    reply = api.get("/api/jobs/")
    assert reply.status_code == 503 and reply["Retry-After"] == "1"
    assert reply.json()["detail"].endswith("nothing of it was written; send it again")
