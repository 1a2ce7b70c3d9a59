"""Budgets (docs/ledger.md "Budgets"): a job stops at its budget within one step's cost, says why, and
runs again when its owner raises it; the forecast and a finished job's projected cost."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import services
from marketplace.core import budget
from marketplace.models import Activation, Job
from marketplace.reads import ledger, selectors
from marketplace.services.billing import activation_report

from . import factories

pytestmark = pytest.mark.django_db
SECOND = timedelta(seconds=1)
STEP_S = 10.0  # each learner step takes 10 s, the worker generating through it: $0.01 a step at $3.60/h


def test_the_rules():
    assert budget.cost_per_step(prices_per_hour=[3.6, 1.8], step_s=10.0) == pytest.approx(0.015)
    assert budget.forecast(spent=1.0, per_step=0.1, steps_left=20) == pytest.approx(3.0)
    assert budget.forecast(spent=1.0, per_step=0.1, steps_left=20, budget=2.5) == 2.5
    assert budget.over_budget(spent=0.04, per_step=0.01, budget=None) == ""
    assert budget.over_budget(spent=0.04, per_step=0.01, budget=0.055) == ""
    assert budget.over_budget(spent=0.05, per_step=0.01, budget=0.055).startswith("over budget: spent $0.05 of $0.055")


@pytest.fixture
def running(settings, redis_url):
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 30.0}
    owner = factories.user("owner")
    worker, _ = factories.worker(factories.user(), price="3.6")
    job = factories.job(owner, budget_usd=0.055, max_steps=100)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    base = timezone.now() - 1000 * SECOND  # far enough back that the release's interval is past the worker timeout
    activation = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                                           state="generating", reported_at=base, started_at=base)
    return owner, Job.objects.get(pk=job.pk), activation, base


def _step(job: Job, activation: Activation, base, step: int) -> Job:
    """One learner step: the worker billed for its 10 s, then the learner's report."""
    activation_report(activation_id=activation.pk, at=base + step * STEP_S * SECOND, state="generating")
    services.metrics_record(job=job, step=step, values={"reward_mean": 0.5, "t_train": STEP_S, "wait_s": 0.0})
    return Job.objects.get(pk=job.pk)


def test_a_job_stops_at_its_budget_within_one_steps_cost_and_runs_again_when_raised(running):
    owner, job, activation, base = running
    step = 0
    while job.status == Job.Status.RUNNING and step < 20:
        step += 1
        job = _step(job, activation, base, step)
    spent, per_step = ledger.job_spent_usd(job), 3.6 * STEP_S / 3600
    assert job.status == Job.Status.PAUSED and job.status_reason.startswith("over budget"), job.status_reason
    assert job.reason_code == Job.Reason.OVER_BUDGET
    assert step == 5, "0.05 spent: the sixth step would pass 0.055"
    budget = job.settings.budget_usd
    assert spent <= budget and budget - spent < per_step, (spent, budget)
    assert not job.activations.filter(ended_at=None).exists(), "its workers released: billing stopped"
    assert selectors.job_summary(job)["budget_usd"] == 0.055

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    assert api.post(f"/api/jobs/{job.pk}/resume/").json()["errors"]["budget_usd"], "resuming over budget: refused"
    bad = api.post(f"/api/jobs/{job.pk}/budget/", {"budget_usd": -1}, format="json")
    assert bad.status_code == 400 and "budget_usd" in bad.json()["errors"]
    raised = api.post(f"/api/jobs/{job.pk}/budget/", {"budget_usd": 1.0}, format="json")
    assert raised.status_code == 200 and raised.json()["status"] == "running" and raised.json()["budget_usd"] == 1.0


def test_a_paused_job_the_owner_paused_stays_paused_when_its_budget_changes(running):
    owner, job, _, _ = running
    services.job_pause(job=job, by="owner", reason="over budget, says the owner")  # words decide nothing
    job = services.job_budget_set(job=Job.objects.get(pk=job.pk), budget_usd=2.0)
    assert job.status == Job.Status.PAUSED and job.settings.budget_usd == 2.0
    assert job.reason_code == Job.Reason.BY_PERSON


def test_the_projection_of_a_running_job_is_its_forecast_and_of_a_finished_one_its_spend(running):
    owner, job, activation, base = running
    job = _step(job, activation, base, 1)
    summary = selectors.job_summary(job)
    assert summary["cost_usd"] == pytest.approx(0.01)
    assert summary["projected_cost_usd"] == pytest.approx(0.055), "99 steps left at $0.01: capped by the budget"
    services.job_finish(job=job, status=Job.Status.CANCELLED)
    assert selectors.job_summary(Job.objects.get(pk=job.pk))["projected_cost_usd"] == pytest.approx(0.01)


def _owner_api(owner) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    return api


def test_a_budget_lowered_below_the_spend_pauses_the_running_job_at_once_and_says_why(running):
    owner, job, activation, base = running
    for step in (1, 2, 3):  # $0.03 spent
        job = _step(job, activation, base, step)
    reply = _owner_api(owner).post(f"/api/jobs/{job.pk}/budget/", {"budget_usd": 0.02}, format="json")
    assert reply.status_code == 200, reply.content
    body = reply.json()
    assert body["status"] == "paused" and body["status_reason"].startswith("over budget: spent $0.03 of $0.02"), body
    assert body["reason_code"] == "over_budget", body  # what a client decides by, not the words
    assert not job.activations.filter(ended_at=None).exists(), "its workers released now, not after the next step"


def test_a_raise_that_is_still_short_keeps_it_paused_with_the_new_figures(running):
    owner, job, activation, base = running
    step = 0
    while job.status == Job.Status.RUNNING:
        step += 1
        job = _step(job, activation, base, step)  # paused at $0.05 of $0.055
    reply = _owner_api(owner).post(f"/api/jobs/{job.pk}/budget/", {"budget_usd": 0.058}, format="json").json()
    assert reply["status"] == "paused" and "of $0.058" in reply["status_reason"], reply
    assert reply["status_reason"].startswith("over budget"), "still a budget pause: the next raise resumes it"
    reply = _owner_api(owner).post(f"/api/jobs/{job.pk}/budget/", {"budget_usd": 0.5}, format="json").json()
    assert reply["status"] == "running" and reply["status_reason"] == ""


def test_the_scheduler_beat_pauses_a_job_whose_learner_does_not_step(running, settings):
    """Workers are billed while they generate whether or not the learner trains (stalled, not started): the beat
    checks the budget too, so the bill cannot run on past it waiting for a step report."""
    from marketplace import tasks

    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner, job, activation, base = running
    activation_report(activation_id=activation.pk, at=base + 30 * SECOND, state="generating")  # $0.03, no step
    tasks.replan_running_jobs()
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, "$0.03 of $0.055: it runs on"
    activation_report(activation_id=activation.pk, at=base + 60 * SECOND, state="generating")  # $0.06, no step
    tasks.replan_running_jobs()
    job = Job.objects.get(pk=job.pk)
    assert job.status == Job.Status.PAUSED and job.status_reason.startswith("over budget: spent $0.06 of $0.055")
    assert not job.activations.filter(ended_at=None).exists()
