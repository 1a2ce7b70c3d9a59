"""The learner's audit outcomes at the site (marketplace/services/audits.py): counted once per step however
often a report is re-sent, shown to the provider, and a worker past ECHO2_AUDIT_SUSPEND_AFTER failures is
suspended: released from its job (billing stops) and never planned or activated again."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace import scheduling, services
from marketplace.models import Activation, Worker, WorkerAudit

from . import factories

pytestmark = pytest.mark.django_db


def report(api, job, step: int, audits: list[dict]):
    return api.post(f"/api/jobs/{job.pk}/metrics/", {"step": step, "reward_mean": 0.5, "audits": audits},
                    format="json")


@pytest.fixture
def running(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "AUDIT_SUSPEND_AFTER": 2}
    owner, provider = factories.user(), factories.user()
    honest, _ = factories.worker(provider, name="honest")
    liar, _ = factories.worker(provider, name="liar")
    Worker.objects.update(status=Worker.Status.IDLE)
    job = factories.job(owner)
    services.job_start(job=job)
    job.refresh_from_db()
    services.job_activate_idle_workers(job=job)  # the calibration phase: both idle workers join
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    return {"api": api, "job": job, "honest": honest, "liar": liar, "provider": provider}


def test_outcomes_count_once_per_step_and_repeat_failures_suspend(running):
    api, job, honest, liar = running["api"], running["job"], running["honest"], running["liar"]
    assert Activation.objects.filter(job=job, ended_at=None).count() == 2
    first = [{"worker_id": honest.pk, "passed": 2, "failed": 0},
             {"worker_id": liar.pk, "passed": 0, "failed": 1, "dropped_records": 12, "reason": "logprobs: ..."}]
    assert report(api, job, 1, first).status_code == 201
    assert report(api, job, 1, first).status_code == 201  # the same step again (a restarted learner): counted once
    liar.refresh_from_db()
    assert (liar.audits_failed, liar.suspended_at) == (1, None)
    assert WorkerAudit.objects.get(worker=liar, step=1).dropped_records == 12

    assert report(api, job, 2, [{"worker_id": liar.pk, "passed": 1, "failed": 1, "reason": "records.0.reward: x"}]
                  ).status_code == 201
    liar.refresh_from_db()
    assert liar.suspended_at is not None and "after 2 failed audits" in liar.suspended_reason
    assert "records.0.reward" in liar.suspended_reason
    assert liar.audit_pass_rate == pytest.approx(1 / 3)
    # Released at once (its billing stops), the honest worker stays; the scheduler never plans it again.
    assert not Activation.objects.filter(worker=liar, ended_at=None).exists()
    assert Activation.objects.get(worker=liar).end_reason == "suspended: failed audits"
    assert Activation.objects.filter(worker=honest, ended_at=None).exists()
    pool = scheduling.candidate_pool(model_dir=job.model_dir, task_name="arithmetic")
    assert liar.pk not in pool.workers
    with pytest.raises(services.ServiceError, match="suspended"):
        services.worker_activate(worker=liar, job=job)
    honest.refresh_from_db()
    assert (honest.audits_passed, honest.audits_failed, honest.audit_pass_rate) == (2, 0, 1.0)


def test_the_provider_sees_pass_rates_and_the_suspension(running):
    api, job, liar, provider = running["api"], running["job"], running["liar"], running["provider"]
    report(api, job, 1, [{"worker_id": liar.pk, "passed": 3, "failed": 2, "reason": "logprobs: forged"}])
    page = Client()
    page.force_login(provider)
    html = page.get("/provider/").content.decode()
    row = html.split('data-worker="liar"', 1)[1].split("</tr>", 1)[0]
    assert "60.0 %" in row and "(5)" in row and "suspended" in row and "logprobs: forged" in row
    listed = {w["name"]: w for w in APIClient().get("/api/workers/", HTTP_AUTHORIZATION=f"Token "
                                                                 f"{factories.token(provider)}").json()["results"]}
    assert listed["liar"]["audit_pass_rate"] == pytest.approx(0.6) and listed["liar"]["suspended_at"]
    assert listed["honest"]["audit_pass_rate"] is None


@pytest.mark.parametrize("bad", [
    {"worker_id": 0, "passed": 1, "failed": 0},
    {"worker_id": 1, "passed": -1, "failed": 0},
    {"worker_id": 1, "passed": 1, "failed": 10**9},
    {"worker_id": 1, "passed": 1},
])
def test_a_malformed_audit_report_is_a_400_naming_the_field(running, bad):
    reply = report(running["api"], running["job"], 1, [bad])
    assert reply.status_code == 400
    body = reply.json()
    assert body["detail"].startswith("audits.0.") and all(key.startswith("audits.0.") for key in body["errors"])
