"""The pushes of a job's end (and every service that releases many workers at once) sent together once the
transaction commits (``services.base.pushes_together``): one trip to the event loop however many workers, each
worker's events in order, a repeated event once, and a rolled back transaction's pushes never sent."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from dataplane import messages as m
from marketplace import services
from marketplace.models import Job
from marketplace.services import base

from . import factories
from .test_billing_fold import generating, running_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


def listen(group: str):
    """A channel in ``group``, as a socket would be; returns a function reading what it was sent so far."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)

    async def drain() -> list[dict]:
        got = []
        while True:
            try:
                async with asyncio.timeout(0.3 if got else 1.0):
                    got.append(await layer.receive(channel))
            except TimeoutError:
                return got

    return lambda: async_to_sync(drain)()


@pytest.fixture
def trips(monkeypatch):
    """How many trips to an event loop the pushes took."""
    count = {"n": 0}
    real = base.async_to_sync

    def counted(fn):
        count["n"] += 1
        return real(fn)

    monkeypatch.setattr(base, "async_to_sync", counted)
    return count


def test_a_cancel_of_many_workers_sends_every_release_in_one_trip(trips):
    job = running_job()
    activations = generating(job, 12)
    inboxes = {a.worker_id: listen(services.worker_group(a.worker_id)) for a in activations}
    page = listen(services.job_group(job.pk))
    trips["n"] = 0
    services.job_finish(job=Job.objects.get(pk=job.pk), status=Job.Status.CANCELLED, reason="by the owner")
    assert trips["n"] == 1
    for inbox in inboxes.values():
        sent = inbox()
        assert [e["message"] for e in sent] == [{"type": "release", "job_id": job.pk, "reason": "job cancelled"}]
    assert page() == [{"type": "job.changed", "job_id": job.pk}]  # once, not once per release


def test_events_keep_their_order_and_a_rolled_back_transaction_sends_nothing(trips):
    worker, _ = factories.worker(factories.user())
    inbox = listen(services.worker_group(worker.pk))  # (a channel is read once: a test's reads each run a loop)
    trips["n"] = 0
    with base.pushes_together():
        with transaction.atomic():
            for n in range(5):
                base.push_to_worker(worker.pk, m.NoWork(job_id=n + 1, retry_after=0.5))
        with pytest.raises(RuntimeError), transaction.atomic():
            base.push_to_worker(worker.pk, m.NoWork(job_id=99, retry_after=0.5))
            raise RuntimeError("rolled back")
        assert trips["n"] == 0  # nothing sent before the end
    assert [e["message"]["job_id"] for e in inbox()] == [1, 2, 3, 4, 5]
    trips["n"], inbox = 0, listen(services.worker_group(worker.pk))
    with transaction.atomic():  # outside pushes_together: sent at its commit, as before
        base.push_to_worker(worker.pk, m.NoWork(job_id=7, retry_after=0.5))
    assert trips["n"] == 1 and [e["message"]["job_id"] for e in inbox()] == [7]
