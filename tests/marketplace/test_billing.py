"""Billing only useful work (issues 13 and 26): an activation is billed for the time the site saw its worker
generating (leases taken, groups accepted), never for loading, idling, a crashed rollout loop, a silence longer than
the worker timeout, or what its heartbeats claim."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.core import billing
from marketplace.infra import liveness, telemetry
from marketplace.models import Activation, Job
from marketplace.reads import selectors
from marketplace.services.billing import activation_report

from . import factories
from .test_agent_socket import connect, setup_job_and_worker, started_with

SECOND = timedelta(seconds=1)

# ---- the rules, with explicit times ---------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "billed"), [("generating", 10.0), ("installing", 10.0), ("loading", 0.0),
                                               ("idle", 0.0), ("failed", 0.0)])
def test_only_installing_and_generating_time_is_billable(state, billed):
    assert billing.billable_seconds(state=state, since=100.0, until=110.0, gap_limit_s=30.0) == billed


def test_a_gap_beyond_the_worker_timeout_is_not_billed_nor_is_time_running_backwards():
    assert billing.billable_seconds(state="generating", since=100.0, until=130.0, gap_limit_s=30.0) == 30.0
    assert billing.billable_seconds(state="generating", since=100.0, until=130.5, gap_limit_s=30.0) == 0.0
    assert billing.billable_seconds(state="generating", since=100.0, until=99.0, gap_limit_s=30.0) == 0.0


def test_a_heartbeat_about_another_job_is_idle_for_this_one():
    assert billing.effective_state(reported="generating", reported_job_id=3, job_id=3) == "generating"
    assert billing.effective_state(reported="generating", reported_job_id=2, job_id=3) == "idle"
    assert billing.effective_state(reported="generating", reported_job_id=None, job_id=3) == "idle"


def test_a_short_wait_between_two_leases_is_not_billed_and_a_lease_taken_with_the_return_is():
    # a group returned at 101.0 and the next lease asked for in another round trip 20 ms later: the 20 ms held
    # nothing (a 50 ms merge used to bill it, about 1.4 s per worker over a 250-step job); the lease taken by the
    # same script as the return, dated a millisecond apart by Redis' rounding, is one span
    reports = billing.observed_reports(state="generating", reported_at=100.0, started=0.0, reported="generating",
                                       installed=1.0, held_since=101.02, held_until=101.0,
                                       holds=[(99.0, 101.0)], now=102.0)
    folded = billing.fold_reports(state="generating", reported_at=100.0, rate=Decimal(36), reports=reports,
                                  gap_limit_s=30.0)
    assert sum(folded.added_seconds) == pytest.approx(1.98)
    assert billing.held_spans(holds=[(99.0, 101.0)], held_since=101.001, since=100.0, until=102.0) == [(100.0, 102.0)]


def test_failing_too_long_counts_from_when_the_loop_first_failed():
    assert not billing.failing_too_long(state="failed", since=100.0, now=219.0, limit_s=120.0)
    assert billing.failing_too_long(state="failed", since=100.0, now=220.0, limit_s=120.0)
    assert not billing.failing_too_long(state="idle", since=0.0, now=1e9, limit_s=120.0)


def test_cost_is_billed_time_at_the_frozen_price():
    assert billing.cost_usd(price_per_hour=0.36, billed_seconds=1800.0) == pytest.approx(0.18)


# ---- the database side, with explicit times -------------------------------------------------------------------


@pytest.fixture
def activation(settings):
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 30.0}
    worker, _ = factories.worker(factories.user(), price="3.6")
    job = factories.job(factories.user())
    return Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour)


@pytest.mark.django_db
def test_each_report_bills_the_interval_before_it_in_the_state_reported_before(activation):
    t0 = activation.reported_at
    activation_report(activation_id=activation.pk, at=t0 + 5 * SECOND, state="generating")  # loading: free
    activation_report(activation_id=activation.pk, at=t0 + 15 * SECOND, state="idle")  # 10 s generating
    activation_report(activation_id=activation.pk, at=t0 + 40 * SECOND, state="installing")  # idle: free
    activation_report(activation_id=activation.pk, at=t0 + 42 * SECOND, state="generating")  # 2 s installing
    row = activation_report(activation_id=activation.pk, at=t0 + 92 * SECOND, state="generating")  # 50 s: silent
    assert row.billed_seconds == pytest.approx(12.0)
    assert row.state == "generating" and row.state_since == t0 + 42 * SECOND  # a repeated state keeps its start
    assert row.cost_usd() == pytest.approx(3.6 * 12 / 3600)


@pytest.mark.django_db
def test_a_stale_report_neither_bills_twice_nor_moves_the_clock_back(activation):
    t0 = activation.reported_at
    activation_report(activation_id=activation.pk, at=t0, state="generating")
    activation_report(activation_id=activation.pk, at=t0 + 10 * SECOND, state="generating")
    late = activation_report(activation_id=activation.pk, at=t0 + 4 * SECOND, state="generating")
    assert late.billed_seconds == pytest.approx(10.0) and late.reported_at == t0 + 10 * SECOND
    again = activation_report(activation_id=activation.pk, at=t0 + 12 * SECOND, state="idle")
    assert again.billed_seconds == pytest.approx(12.0)


@pytest.mark.django_db
def test_a_release_bills_up_to_its_end_and_nothing_after(activation, settings):
    now = timezone.now()
    Activation.objects.filter(pk=activation.pk).update(state="generating", reported_at=now - 8 * SECOND)
    activation.refresh_from_db()
    services.worker_release(activation=activation, reason="test")
    ended = Activation.objects.get(pk=activation.pk)
    assert ended.billed_seconds == pytest.approx(8.0, abs=1.0)
    assert activation_report(activation_id=activation.pk, at=now + 60 * SECOND, state="generating") is None
    assert Activation.objects.get(pk=activation.pk).billed_seconds == ended.billed_seconds
    assert selectors.job_cost_usd(ended.job) == pytest.approx(ended.cost_usd())


@pytest.mark.django_db
def test_earnings_are_billed_hours_not_hours_in_the_job(activation):
    Activation.objects.filter(pk=activation.pk).update(billed_seconds=900.0, billed_usd=Decimal("0.9"),  # the ledger's
                                                       started_at=timezone.now() - timedelta(hours=1))
    row = selectors.worker_earnings([activation.worker])[activation.worker_id]
    assert row["hours"] == pytest.approx(0.25) and row["active_hours"] == pytest.approx(1.0, abs=0.01)
    assert row["earned_usd"] == pytest.approx(3.6 * 0.25)


# ---- over the agent websocket ---------------------------------------------------------------------------------

@pytest.fixture
def settings_eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 30.0, "ROLLOUT_FAILED_RELEASE_S": 60.0}
    return settings


@database_sync_to_async
def rewind(job_id: int, seconds: float, **fields) -> None:
    """Pretend the last state report (and, with ``state_since``, the state's start) came ``seconds`` ago: the
    interval until the next heartbeat is then ``seconds`` long, whatever the wall clock does in the test."""
    back = timezone.now() - timedelta(seconds=seconds)
    Activation.objects.filter(job_id=job_id, ended_at=None).update(
        reported_at=back, **{name: back for name, on in fields.items() if on})


def age_leases(job_id: int, seconds: float) -> None:
    """Pretend every lease pending in the job's prompt stream was taken ``seconds`` earlier (its idle time, which is
    what bills follow): with :func:`rewind`, a report interval the leases really spanned."""
    from dataplane.replay import PROMPT_GROUP, prompts_key

    client = liveness.stream.client()
    for p in client.xpending_range(prompts_key(job_id), PROMPT_GROUP, min="-", max="+", count=1000):
        client.xclaim(prompts_key(job_id), PROMPT_GROUP, p["consumer"], 0, [p["message_id"]],
                      idle=int(p["time_since_delivered"] + seconds * 1000), justid=True)


@database_sync_to_async
def billed(job_id: int) -> Activation:
    """The job's first activation (a released worker may be activated again by the re-plan)."""
    return Activation.objects.filter(job_id=job_id).order_by("id").first()


async def heartbeat(comm, job_id: int | None, state: str, reason: str = "") -> None:
    """Send a heartbeat that reaches the database (its periodic report made due) and wait until the site has handled
    it (the lease request behind it is answered after)."""
    for worker_id in await database_sync_to_async(lambda: list(Activation.objects.filter(
            job_id=job_id, ended_at=None).values_list("worker_id", flat=True)))():
        liveness.stream.client().delete(liveness._sync_key(worker_id))
    await comm.send_json_to({"type": "heartbeat", "job_id": job_id, "state": state, "reason": reason})
    await comm.send_json_to({"type": "lease_request", "job_id": job_id or 1})
    assert (await comm.receive_json_from(timeout=5))["type"] in ("no_work", "rejected")


@pytest.mark.django_db(transaction=True)
async def test_heartbeats_bill_nothing_and_what_the_site_saw_bills(settings_eager, redis_client):
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    await heartbeat(comm, job.pk, "generating")
    await rewind(job.pk, 10)
    await heartbeat(comm, job.pk, "generating")  # it says so, but no install was seen: loading, free
    row = await billed(job.pk)
    assert row.billed_seconds == 0.0 and row.state == "loading"

    telemetry.record_observed(worker.pk, job_id=job.pk, what="installed", at=time.time())  # an install report
    await rewind(job.pk, 10)
    await heartbeat(comm, job.pk, "generating")  # installed, no lease taken: idle, whatever it says
    row = await billed(job.pk)
    assert row.billed_seconds == 0.0 and row.state == "idle"

    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=1).top_up()
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk})
    assert (await comm.receive_json_from(timeout=5))["type"] == "lease"  # the site saw it take work
    await heartbeat(comm, job.pk, "idle")
    await rewind(job.pk, 10)
    age_leases(job.pk, 10)
    await heartbeat(comm, job.pk, "idle")  # the 10 s before it were generating (a lease outstanding): billed
    row = await billed(job.pk)
    assert row.billed_seconds == pytest.approx(10.0, abs=0.5) and row.state == "generating"
    live = await database_sync_to_async(lambda: selectors.job_live(Job.objects.get(pk=job.pk)))()
    assert [(w["state"], w["billed_s"]) for w in live["workers"]] == [("generating", round(row.billed_seconds, 3))]
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url")
async def test_an_invalid_state_is_rejected_with_a_reason(settings_eager):
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "mining"})
    reply = await comm.receive_json_from()
    assert reply["type"] == "rejected" and reply["ref"] == "heartbeat"
    assert reply["reason"].startswith("heartbeat.state: ") and "'generating'" in reply["reason"]
    assert (await billed(job.pk)).state == "loading"  # nothing it carried was applied
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url")
async def test_a_rollout_loop_failing_too_long_is_not_billed_and_the_worker_is_released(settings_eager):
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    await heartbeat(comm, job.pk, "failed", "RuntimeError: CUDA error: an illegal memory access")
    await rewind(job.pk, 30, state_since=True)
    await heartbeat(comm, job.pk, "failed", "RuntimeError: CUDA error: an illegal memory access")
    row = await billed(job.pk)
    assert row.billed_seconds == 0.0 and row.ended_at is None and row.state_reason.startswith("RuntimeError")

    await rewind(job.pk, 61, state_since=True)  # failed for longer than ROLLOUT_FAILED_RELEASE_S
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "failed", "reason": "RuntimeError"})
    release = await comm.receive_json_from(timeout=5)
    assert release["type"] == "release" and release["reason"].startswith("rollout loop failing for 60 s")
    row = await billed(job.pk)
    assert row.ended_at is not None and row.billed_seconds == 0.0
    await comm.disconnect()
