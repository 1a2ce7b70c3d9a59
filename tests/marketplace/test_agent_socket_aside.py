"""What a submit starts and does not wait for (marketplace/realtime/aside.py), over the real consumer: a worker's
earnings read again once due, and the flush of the groups the process accepted. Each test holds that database work
until the submit's answer has come; waiting for it, the answer would not come."""

from __future__ import annotations

import asyncio
import threading
import time
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async

from marketplace import services
from marketplace.infra import delivered
from marketplace.models import Activation
from marketplace.services import rollouts

from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401
from .test_agent_socket_budget import submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url", "settings_eager")]


def held(real):
    """``real``, run only once ``release`` is set (on the database thread that calls it); ``started`` once called,
    ``calls`` counted."""
    started, release = threading.Event(), threading.Event()

    def call(*args, **kwargs):
        call.calls += 1
        started.set()
        assert release.wait(30), "never released"
        return real(*args, **kwargs)

    call.started, call.release, call.calls = started, release, 0
    return call


async def test_earnings_due_are_read_aside_and_the_answer_carries_the_last_read(monkeypatch):
    job, worker, key = await setup_job_and_worker()
    rollouts._earned.pop(worker.pk, None)
    bill = database_sync_to_async(lambda usd: Activation.objects.filter(job=job, worker=worker).update(
        billed_usd=Decimal(usd)))
    comm = await connect(key)
    await started_with(comm, job)
    await bill("0.25")
    await comm.send_to(text_data=submit(job.pk, "e1", lease=1))
    assert (await comm.receive_json_from(timeout=10))["earned_usd"] == pytest.approx(0.25)  # the first: read now
    await bill("1")
    rollouts._earned[worker.pk] = (time.monotonic() - rollouts.EARNINGS_EVERY_S - 1, 0.25)  # due again
    read = held(rollouts.workers_earned_usd)
    monkeypatch.setattr(services, "workers_earned_usd", read)
    await comm.send_to(text_data=submit(job.pk, "e2", lease=1))
    reply = await comm.receive_json_from(timeout=10)
    assert reply["ref_id"] == "e2" and reply["earned_usd"] == pytest.approx(0.25)  # the held figure, at once
    assert await asyncio.to_thread(read.started.wait, 10)  # the read began, aside
    read.release.set()
    for _ in range(200):  # until the read aside is in (a safety limit, not a timing)
        if rollouts.worker_earned_usd_known(worker.pk) == pytest.approx(1.0):
            break
        await asyncio.sleep(0.05)
    await comm.send_to(text_data=submit(job.pk, "e3", lease=1))
    assert (await comm.receive_json_from(timeout=10))["earned_usd"] == pytest.approx(1.0)
    await comm.disconnect()


async def test_a_flush_due_runs_aside_and_its_counts_reach_the_database(monkeypatch):
    job, worker, key = await setup_job_and_worker()
    delivered.take()  # another test's counts
    comm = await connect(key)
    await started_with(comm, job)
    delivered.add(job_id=job.pk, worker_id=worker.pk, groups=3)
    monkeypatch.setattr(delivered, "_flushed_at", time.monotonic() - delivered.FLUSH_S - 1)  # due
    flush = held(services.groups_accepted_flush)
    monkeypatch.setattr(services, "groups_accepted_flush", flush)
    await comm.send_to(text_data=submit(job.pk, "f1", lease=1))
    assert (await comm.receive_json_from(timeout=10))["ref_id"] == "f1"  # answered while the flush is held
    assert await asyncio.to_thread(flush.started.wait, 10)
    await comm.send_to(text_data=submit(job.pk, "f2", lease=1))  # a flush runs: no second one
    assert (await comm.receive_json_from(timeout=10))["ref_id"] == "f2"
    assert flush.calls == 1
    flush.release.set()
    accepted = database_sync_to_async(lambda: Activation.objects.get(job=job, worker=worker).groups_accepted)
    for _ in range(200):
        if await accepted() == 3:
            break
        await asyncio.sleep(0.05)
    assert await accepted() == 3
    await comm.disconnect()
