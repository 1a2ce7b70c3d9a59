"""A job's end releases its workers together (``services.workers_release``): each activation billed by what the site
observed, as a release one at a time bills it, in a number of statements that does not grow with the workers; one
whose row another transaction holds is released alone once it is free, billed once."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from marketplace import services
from marketplace.models import Activation, Job, Worker

from .test_billing_fold import assert_exact, generating, running_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


def cancel(job: Job) -> int:
    """Cancel ``job``; the statements it took."""
    with CaptureQueriesContext(connection) as queries:
        services.job_finish(job=Job.objects.get(pk=job.pk), status=Job.Status.CANCELLED, reason="by the owner")
    return len(queries)


def test_a_cancel_bills_each_worker_what_it_was_seen_doing_in_statements_that_do_not_grow():
    statements, held_s = {}, 10.0
    for count in (3, 12):
        job = running_job()
        activations = generating(job, count, held_s=held_s)
        statements[count] = cancel(job)
        for activation in activations:
            row = Activation.objects.get(pk=activation.pk)
            assert row.ended_at is not None and row.end_reason == "job cancelled"
            assert row.billed_seconds == pytest.approx(held_s, abs=0.5)  # generating since its lease, to the end
            assert_exact(row.pk)
        assert not Worker.objects.filter(pk__in=[a.worker_id for a in activations],
                                         status=Worker.Status.ACTIVE).exists()
    assert statements[12] == statements[3]


def test_a_worker_whose_row_is_held_is_released_alone_once_free_and_billed_once():
    job = running_job()
    activations = generating(job, 4, held_s=10.0)
    held = activations[1]
    locked, go_on = threading.Event(), threading.Event()

    def hold() -> None:  # a heartbeat's report holding the row a moment
        try:
            with transaction.atomic():
                Activation.objects.select_for_update().get(pk=held.pk)
                locked.set()
                go_on.wait(10)
                time.sleep(0.5)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(10)
    go_on.set()  # the finish below waits for the row; the holder lets go half a second later
    cancel(job)
    holder.join(10)
    for activation in activations:
        row = Activation.objects.get(pk=activation.pk)
        assert row.ended_at is not None and row.billed_seconds == pytest.approx(10.0, abs=1.0)
        assert_exact(row.pk)


def test_a_cancel_returns_no_leases_to_streams_it_drops_and_a_pause_returns_every_one(monkeypatch):
    from marketplace.services import workers

    returned = []
    monkeypatch.setattr(workers, "_return_leases", lambda job_id, worker_id: returned.append(worker_id))
    job = running_job()
    generating(job, 3)
    cancel(job)
    assert returned == []  # its streams are dropped with it: the leases go with them
    job = running_job()
    activations = generating(job, 3)
    services.job_pause(job=Job.objects.get(pk=job.pk), by="the owner")
    assert sorted(returned) == sorted(a.worker_id for a in activations)  # kept streams: the prompts come back now
