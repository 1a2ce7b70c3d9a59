"""Failed work is free (docs/ledger.md "Credits for failed work"): the billed time a worker's failed groups were
generated in goes back to the owner as ledger entries, once, and the ledger still reconciles to the cent with the
job's cost and the provider's earnings; a forged failure gives nothing back."""

from __future__ import annotations

import csv
import io
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.core import billing
from marketplace.infra import stream
from marketplace.models import Activation, Job, LedgerEntry, Worker
from marketplace.reads import selectors
from marketplace.services.billing import activation_report

from . import factories
from .test_audits import deliver, learner_api, report, reward_failures

pytestmark = pytest.mark.django_db


@pytest.fixture
def billed(redis_url, settings):
    """An honest worker and a liar (wrong rewards) of two providers deliver to a running job while billed
    ``generating``; the liar's prompts waited 0.3 s in the stream before it leased them (its generating time)."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AUDIT_SUSPEND_AFTER": 10, "WORKER_TIMEOUT_S": 1000.0}
    owner = factories.user()
    honest, _ = factories.worker(factories.user(), name="honest", price="3.6")
    liar, _ = factories.worker(factories.user(), name="liar", price="7.2")
    Worker.objects.update(status=Worker.Status.IDLE)
    job = factories.job(owner)
    services.job_start(job=job)
    job.refresh_from_db()
    services.job_activate_idle_workers(job=job)
    start = timezone.now() - timedelta(seconds=30)
    Activation.objects.filter(job=job).update(state="generating", reported_at=start, state_since=start)
    deliver(job, honest, 3)
    PromptFeeder(stream.client(), job_id=job.pk, task=build_task(job.spec["task"]), seed=7,
                 backlog=stream.replay(job.pk).outstanding() + 4).top_up()
    time.sleep(0.3)
    deliver(job, liar, 4, lie=True)  # leases the waiting prompts first (the stream is first in, first out)
    for activation in Activation.objects.filter(job=job):  # a heartbeat bills both up to now
        activation_report(activation_id=activation.pk, at=timezone.now(), state="generating")
    return {"api": learner_api(owner, job), "job": job, "honest": honest, "liar": liar}


def reconciles(job: Job) -> Decimal:
    """The ledger's sum of ``job``, checked against every running sum the pages show; returns it."""
    entries = LedgerEntry.objects.filter(job=job)
    total = sum((e.amount for e in entries), Decimal(0))
    for entry in entries:
        assert entry.amount == (entry.seconds * entry.rate / 3600).quantize(billing.NANO_USD)
    for activation in Activation.objects.filter(job=job):
        assert activation.billed_usd == sum((e.amount for e in entries.filter(activation=activation)), Decimal(0))
    summary = selectors.job_summary(Job.objects.get(pk=job.pk))
    assert billing.cents(Decimal(str(summary["cost_usd"]))) == billing.cents(total)
    return total


def test_failed_groups_are_credited_to_the_owner_once(billed):
    api, job, liar, honest = billed["api"], billed["job"], billed["liar"], billed["honest"]
    reconciles(job)
    liar_before = Activation.objects.get(job=job, worker=liar).billed_usd
    failures = reward_failures(job, liar, 2)
    assert report(api, job, 1, [{"worker_id": liar.pk, "passed": 0, "failed": 2, "reason": "records.0.reward",
                                 "evidence": failures}]).status_code == 201

    credits = LedgerEntry.objects.filter(job=job, state="credit")
    assert credits and {c.worker_id for c in credits} == {liar.pk}
    assert all(c.seconds < 0 and c.amount < 0 and c.rate == Decimal("7.2") for c in credits)
    given = -sum(c.seconds for c in credits)
    assert Decimal("0.3") <= given <= Decimal("30"), "the window its failed groups were generated in"
    liar_after = Activation.objects.get(job=job, worker=liar)
    assert liar_after.ended_at is not None  # released from the job: billing stopped there
    generating = sum(e.amount for e in LedgerEntry.objects.filter(job=job, worker=liar).exclude(state="credit"))
    assert liar_after.billed_usd == generating + sum(c.amount for c in credits) < generating
    assert generating >= liar_before
    reconciles(job)

    # Sent again (a restarted learner), and the same entries under a later step: nothing more is given back.
    count, amount = credits.count(), sum(c.amount for c in credits)
    report(api, job, 1, [{"worker_id": liar.pk, "passed": 0, "failed": 2, "evidence": failures}])
    report(api, job, 2, [{"worker_id": liar.pk, "passed": 0, "failed": 2, "evidence": failures}])
    again = LedgerEntry.objects.filter(job=job, state="credit")
    assert (again.count(), sum(c.amount for c in again)) == (count, amount)
    reconciles(job)

    # The owner's statement shows the credit, as a line of its own and in the total.
    rows = list(csv.DictReader(io.StringIO(api.get(f"/api/ledger/?job={job.pk}&format=csv").content.decode())))
    assert [r for r in rows if r["state"] == "credit"] and Decimal(rows[-1]["total_usd"]) == billing.cents(
        reconciles(job))
    totals = api.get(f"/api/ledger/?job={job.pk}").json()["totals"]
    assert Decimal(totals["credited_usd"]) == -sum(c.amount for c in again)
    assert honest.pk not in {c.worker_id for c in again}


def test_a_forged_failure_gives_nothing_back(billed):
    """The owner's learner calls the honest worker's right rewards wrong: refused by the site, no credit."""
    api, job, honest = billed["api"], billed["job"], billed["honest"]
    forged = [f | {"recomputed_reward": 0.5} for f in reward_failures(job, honest, 2)]
    assert report(api, job, 1, [{"worker_id": honest.pk, "passed": 0, "failed": 2, "reason": "made up",
                                 "evidence": forged}]).status_code == 201
    assert not LedgerEntry.objects.filter(job=job, state="credit").exists()
    reconciles(job)
