"""The batched, paced agent protocol over the real consumer (Channels communicator, real Redis): the welcome
announces the connection's budget; a ``submit`` returns several groups and leases more in one round trip; a frame
over the budget is refused unread but named (type and request id) with ``retry_after``, and the same request sent
again then is applied once; a reconnecting agent still serving a job it lost is told so."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.utils import timezone
from prometheus_client import generate_latest

from dataplane import messages as m
from dataplane import replay
from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.infra import refusals
from marketplace.models import Activation, Job
from marketplace.reads import selectors
from marketplace.services import rollouts

from . import factories
from .test_agent_socket import connect, settings_eager, setup_job_and_worker, started_with  # noqa: F401
from .test_agent_socket_parts import answer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url", "settings_eager")]


def submit(job_id: int, request_id: str, groups=(), lease: int = 0) -> str:
    return m.Submit(id=request_id, job_id=job_id, groups=list(groups), lease=lease).model_dump_json()


async def test_the_welcome_announces_the_budget_the_connection_enforces(settings):
    settings.ECHO2 = {**settings.ECHO2, "AGENT_MESSAGES_PER_S": 7.0, "AGENT_MESSAGE_BURST": 9.0,
                      "AGENT_BYTES_PER_S": 123456.0}
    _, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    welcome = await comm.receive_json_from()
    assert (welcome["messages_per_s"], welcome["message_burst"], welcome["bytes_per_s"]) == (7.0, 9.0, 123456.0)
    await comm.disconnect()


async def test_a_submit_returns_a_batch_and_leases_more_in_one_round_trip(redis_client):
    job, _, key = await setup_job_and_worker(batch_trajectories=12)  # R/n = 3 groups a lease at most
    comm = await connect(key)
    await started_with(comm, job)
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=4).top_up()
    await comm.send_to(text_data=submit(job.pk, "a1", lease=5))  # capped
    first = await comm.receive_json_from(timeout=5)
    assert first["type"] == "submitted" and first["ref_id"] == "a1" and first["results"] == []
    leases = first["lease"]["leases"]
    assert len(leases) == 3
    groups = [answer(job.pk, lease, tokens=4) for lease in leases]
    groups[1] = groups[1].model_copy(update={"records": [r.model_copy(update={"prompt": "9+9="})
                                                         for r in groups[1].records]})  # not the leased prompt
    await comm.send_to(text_data=submit(job.pk, "a2", groups, lease=1))
    reply = await comm.receive_json_from(timeout=5)
    assert reply["ref_id"] == "a2" and [r["accepted"] for r in reply["results"]] == [4, 0, 4]
    assert "prompt" in reply["results"][1]["reasons"][0]
    assert len(reply["lease"]["leases"]) == 1
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 2
    await comm.disconnect()


async def test_a_submits_answer_carries_what_the_ledger_billed_for_the_worker_read_at_most_every_10_s():
    """The agent's status line says what its worker earned: the sum of its activations' ledger sums, every job, as
    the site last read it (once per EARNINGS_EVERY_S and process, not per submit)."""
    job, worker, key = await setup_job_and_worker()
    rollouts._earned.pop(worker.pk, None)

    @database_sync_to_async
    def billed(usd: str) -> None:
        Activation.objects.filter(job=job, worker=worker).update(billed_usd=Decimal(usd))

    @database_sync_to_async
    def an_earlier_job_billed(usd: str) -> None:
        Activation.objects.create(job=factories.job(User.objects.get(pk=job.owner_id)), worker=worker,
                                  price_per_hour="0.35", billed_usd=Decimal(usd), ended_at=timezone.now())

    comm = await connect(key)
    await started_with(comm, job)
    await billed("0.0125")
    await an_earlier_job_billed("0.5")
    await comm.send_to(text_data=submit(job.pk, "e1", lease=1))
    assert (await comm.receive_json_from(timeout=5))["earned_usd"] == pytest.approx(0.5125)
    await billed("1")
    await comm.send_to(text_data=submit(job.pk, "e2", lease=1))
    assert (await comm.receive_json_from(timeout=5))["earned_usd"] == pytest.approx(0.5125)  # read 10 s ago at most
    await comm.disconnect()


async def test_a_frame_over_budget_is_named_with_retry_after_and_applied_once_when_sent_again(settings, redis_client):
    # A slow refill (4 s a message): on a loaded machine the burst must still be spent when the frame comes again.
    settings.ECHO2 = {**settings.ECHO2, "AGENT_MESSAGES_PER_S": 0.25, "AGENT_MESSAGE_BURST": 3.0}
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)  # the hello: one message of the burst
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=2).top_up()
    await comm.send_to(text_data=submit(job.pk, "b1", lease=1))
    lease = (await comm.receive_json_from(timeout=5))["lease"]["leases"][0]
    group = answer(job.pk, lease, tokens=4)
    frame = submit(job.pk, "b2", [group])
    await comm.send_to(text_data=frame)  # the last of the burst
    assert (await comm.receive_json_from(timeout=5))["results"][0]["accepted"] == 4
    await comm.send_to(text_data=frame)  # over budget: refused unread
    refused = await comm.receive_json_from(timeout=5)
    assert refused["type"] == "rejected" and refused["ref"] == "submit" and refused["ref_id"] == "b2"
    assert 0 < refused["retry_after"] <= 4.0 and refused["reason"].startswith("rate limit:")
    await asyncio.sleep(refused["retry_after"])
    await comm.send_to(text_data=frame)  # the same request again: read now, its verdict given again, not run twice
    again = await comm.receive_json_from(timeout=5)
    assert again["type"] == "submitted" and again["ref_id"] == "b2" and again["results"][0]["accepted"] == 4
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 1
    assert replay.ReplayBuffer(redis_client, job.pk).counters()["accepted_groups"] == 1
    assert await database_sync_to_async(refusals.counts)([worker.pk]) == {worker.pk: 1}

    @database_sync_to_async
    def shown() -> tuple[int, str]:
        live = selectors.job_live(Job.objects.get(pk=job.pk))
        return live["workers"][0]["refused"], generate_latest(_registry()).decode()

    on_page, metrics = await shown()
    assert on_page == 1 and f'echo2_agent_frames_refused_total{{worker="{worker.pk}"}} 1.0' in metrics
    await comm.disconnect()


def _registry():
    from prometheus_client import CollectorRegistry

    from marketplace.api.observability import _SiteCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SiteCollector())
    return registry


async def test_an_agent_back_for_a_job_it_was_released_from_meanwhile_is_told_so(redis_client):
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    await comm.disconnect()

    @database_sync_to_async
    def release() -> None:
        services.worker_release(activation=Activation.objects.get(worker=worker, ended_at=None), reason="test")

    await release()
    again = await connect(key)
    await again.send_json_to({"type": "hello", "agent_version": "test", "job_id": job.pk})
    replies = [await again.receive_json_from(timeout=5) for _ in range(2)]
    assert replies[0]["type"] == "welcome"
    assert replies[1] == {"type": "release", "job_id": job.pk, "reason": "not active in this job any more"}
    await again.disconnect()


async def test_an_install_reported_as_the_job_completed_is_ignored_not_refused(redis_client):
    """The install finished as the job completed (seen in ``make demo``): the report is late, not wrong."""
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)

    @database_sync_to_async
    def complete() -> None:
        services.job_finish(job=Job.objects.get(pk=job.pk), status=Job.Status.COMPLETED)

    await complete()
    assert (await comm.receive_json_from(timeout=5))["type"] == "release"
    await comm.send_json_to({"type": "snapshot_installed", "job_id": job.pk, "version": 0, "seconds": 1.0})
    assert await comm.receive_nothing(0.3)
    await comm.send_json_to({"type": "snapshot_installed", "job_id": job.pk + 999, "version": 0, "seconds": 1.0})
    assert (await comm.receive_json_from(timeout=5))["type"] == "rejected"  # a job it never served: refused
    await comm.disconnect()


@pytest.mark.django_db
def test_the_earnings_of_the_workers_due_are_read_in_one_query_and_the_others_are_not_read():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    owner, provider = factories.user(), factories.user()
    workers = [factories.worker(provider)[0] for _ in range(3)]
    for worker, usd in zip(workers, ("0.25", "1.5", "0"), strict=True):
        Activation.objects.create(job=factories.job(owner), worker=worker, price_per_hour="0.35",
                                  billed_usd=Decimal(usd), ended_at=timezone.now())
    Activation.objects.create(job=factories.job(owner), worker=workers[0], price_per_hour="0.35",
                              billed_usd=Decimal("0.5"), ended_at=timezone.now())
    for worker in workers:
        rollouts._earned.pop(worker.pk, None)
    rollouts._earned[workers[2].pk] = (100.0, 7.0)  # read 1 s before: held
    ids = [w.pk for w in workers]
    with CaptureQueriesContext(connection) as queries:
        assert rollouts.workers_earned_usd(ids, now=101.0) == pytest.approx([0.75, 1.5, 7.0])
    assert len(queries) == 1
    with CaptureQueriesContext(connection) as queries:
        assert rollouts.workers_earned_usd(ids, now=105.0) == pytest.approx([0.75, 1.5, 7.0])
    assert len(queries) == 0  # every one held now
    for worker in workers:
        rollouts._earned.pop(worker.pk, None)
