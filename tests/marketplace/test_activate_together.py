"""The calibration phase activates every idle worker that qualifies together (``services.workers_activate``): each
gets its activation at its own price and its own assignment, in a number of statements that does not grow with the
workers; a worker ``worker_activate`` would refuse (suspended, paused) is left out."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dataplane import credentials
from marketplace import services
from marketplace.models import Activation, Job, Worker

from . import factories
from .test_billing_fold import running_job
from .test_pushes_together import listen

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


def idle_workers(count: int) -> list[Worker]:
    provider = factories.user()
    workers = [factories.worker(provider, price=f"0.{10 + i}")[0] for i in range(count)]
    Worker.objects.filter(pk__in=[w.pk for w in workers]).update(status=Worker.Status.IDLE)
    return list(Worker.objects.filter(pk__in=[w.pk for w in workers]).order_by("pk"))


def activate(job: Job) -> int:
    """The calibration phase's activations; the statements they took."""
    with CaptureQueriesContext(connection) as queries:
        services.job_activate_idle_workers(job=Job.objects.get(pk=job.pk))
    return len(queries)


def test_every_idle_worker_is_activated_and_assigned_in_statements_that_do_not_grow():
    statements = {}
    for count in (3, 12):
        Worker.objects.filter(status=Worker.Status.IDLE).update(status=Worker.Status.OFFLINE)  # the last round's
        job = running_job()
        workers = idle_workers(count)
        inboxes = {w.pk: listen(services.worker_group(w.pk)) for w in workers}
        statements[count] = activate(job)
        for worker in workers:
            activation = Activation.objects.get(worker=worker, ended_at=None)
            assert activation.job_id == job.pk and activation.price_per_hour == worker.price_per_hour
            assert Worker.objects.get(pk=worker.pk).status == Worker.Status.ACTIVE
            sent = [e["message"] for e in inboxes[worker.pk]()]
            assert [(s["type"], s["job_id"]) for s in sent] == [("assign", job.pk)], sent
        Activation.objects.filter(job=job).update(ended_at=timezone.now())
        Worker.objects.filter(pk__in=[w.pk for w in workers]).update(status=Worker.Status.OFFLINE)
    assert statements[12] == statements[3]


def test_each_assignment_carries_the_workers_own_credential_and_a_paused_worker_is_left_out():
    job = running_job()
    services.snapshot_publish(job=job, version=1, url="http://l/v1/", manifest=factories.manifest(job, 1))
    workers = idle_workers(3)
    paused = workers[1]
    Worker.objects.filter(pk=paused.pk).update(paused_at=timezone.now())  # after the caller read it idle
    inboxes = {w.pk: listen(services.worker_group(w.pk)) for w in workers}
    activations = services.workers_activate(job=Job.objects.get(pk=job.pk), workers=workers)
    assert sorted(a.worker_id for a in activations) == [workers[0].pk, workers[2].pk]
    assert not Activation.objects.filter(worker=paused).exists()
    assert inboxes[paused.pk]() == []
    for worker in (workers[0], workers[2]):
        (assign,) = [e["message"] for e in inboxes[worker.pk]()]
        assert assign["type"] == "assign" and assign["snapshot"]["version"] == 1
        grant = credentials.verify(job.transfer_secret, assign["snapshot"]["credential"], job_id=job.pk, version=1,
                                   now=time.time(), worker_id=worker.pk)
        assert (grant.lowest, grant.highest) == (1, 1)
