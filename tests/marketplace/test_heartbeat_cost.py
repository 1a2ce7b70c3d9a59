"""A heartbeat the database hears of (a worker in a job reports every few heartbeats) asks only what Redis cannot
say: whether the worker was marked offline is asked of the database only when Redis does not hold it online."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace import services
from marketplace.infra import liveness
from marketplace.models import Worker

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def offline_checks(queries) -> int:
    return sum('"marketplace_worker"."status" =' in q["sql"] and q["sql"].startswith("SELECT") for q in queries)


def beat(worker: Worker) -> tuple[liveness.Beat, int]:
    """One heartbeat recorded and applied as the agent socket does; with the database's offline checks it made."""
    recorded = services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0)
    with CaptureQueriesContext(connection) as queries:
        services.worker_heartbeat_apply(worker=worker, beat=recorded, throughput=1.0)
    return recorded, offline_checks(queries.captured_queries)


def test_a_worker_held_online_is_not_asked_for_and_one_marked_offline_comes_back():
    worker, _ = factories.worker(factories.user())
    services.worker_connected(worker=worker, installed_version=None)
    liveness.mark_online(worker.pk, at=time.time())  # as the hello's commit does: held online from here
    recorded, asked = beat(worker)
    assert recorded.reason == "state changed" and asked == 0
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.OFFLINE)  # expired...
    liveness.mark_offline([worker.pk])  # ...and so no longer held online
    recorded, asked = beat(worker)
    assert recorded.reason == liveness.NOT_ONLINE and asked == 1
    assert Worker.objects.get(pk=worker.pk).status == Worker.Status.IDLE  # back
