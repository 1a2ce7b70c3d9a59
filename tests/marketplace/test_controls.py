"""Provider and owner controls (docs/ledger.md): a worker's price from now on, pause, resume and removal;
a job archived or deleted; the ledger intact through all of them."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import services
from marketplace.models import Activation, Job, LedgerEntry, Worker
from marketplace.services.billing import activation_report

from . import factories

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


@pytest.fixture
def serving(settings, redis_url):
    """A worker generating for a running job for the last 10 s, billed."""
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 1000.0}
    owner, provider = factories.user("owner"), factories.user("provider")
    worker, key = factories.worker(provider, price="3.6", name="rig")
    job = factories.job(owner)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    t0 = timezone.now() - timedelta(seconds=20)
    activation = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                                           state="generating", reported_at=t0, started_at=t0)
    activation_report(activation_id=activation.pk, at=t0 + timedelta(seconds=10), state="generating")
    return {"owner": owner, "provider": provider, "worker": worker, "key": key, "job": Job.objects.get(pk=job.pk),
            "activation": activation}


def test_a_price_change_has_a_date_and_names_the_field_when_bad(serving):
    api, worker = client_for(serving["provider"]), serving["worker"]
    bad = api.post(f"/api/workers/{worker.pk}/price/", {"price_per_hour": "free"}, format="json")
    assert bad.status_code == 400 and "price_per_hour" in bad.json()["errors"]
    assert client_for(serving["owner"]).post(f"/api/workers/{worker.pk}/price/", {"price_per_hour": "1"},
                                             format="json").status_code == 404, "only its provider changes it"
    assert api.post(f"/api/workers/{worker.pk}/price/", {"price_per_hour": "0.9"}, format="json").json()[
        "price_per_hour"] == "0.9000"
    history = api.get(f"/api/workers/{worker.pk}/price/").json()["history"]
    assert [h["price_per_hour"] for h in history] == ["3.6000", "0.9000"]
    assert Activation.objects.get(pk=serving["activation"].pk).price_per_hour == Decimal("0.9"), "from now on"


def test_a_paused_worker_is_released_and_not_activated_until_resumed(serving):
    api, worker, job = client_for(serving["provider"]), serving["worker"], serving["job"]
    assert api.post(f"/api/workers/{worker.pk}/pause/").json()["paused_at"]
    ended = Activation.objects.get(pk=serving["activation"].pk)
    assert ended.ended_at is not None and ended.end_reason == "paused by its provider"
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.IDLE)
    assert services.job_activate_idle_workers(job=job) == []
    with pytest.raises(services.ServiceError, match="paused"):
        services.worker_activate(worker=worker, job=job)
    assert api.post(f"/api/workers/{worker.pk}/resume/").json()["paused_at"] is None
    assert [a.worker_id for a in services.job_activate_idle_workers(job=job)] == [worker.pk]


def test_a_removed_worker_is_unregistered_and_its_ledger_kept(serving):
    api, worker = client_for(serving["provider"]), serving["worker"]
    billed = set(LedgerEntry.objects.filter(worker=worker).values_list("id", flat=True))
    assert billed and api.delete(f"/api/workers/{worker.pk}/").status_code == 200  # its release bills up to now
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {serving['key']}")
    assert agent.get(f"/api/workers/{worker.pk}/calibrations/").status_code == 401, "its key no longer works"
    assert api.get("/api/workers/").json()["results"] == []
    assert [w["id"] for w in api.get("/api/workers/?removed=1").json()["results"]] == [worker.pk]
    statement = api.get("/api/ledger/").json()
    assert billed <= {e["id"] for e in statement["entries"]} and {e["worker_name"] for e in statement["entries"]} == {
        "rig"}, "the statement still names it"
    assert Activation.objects.get(pk=serving["activation"].pk).ended_at is not None
    with pytest.raises(services.ServiceError):
        services.worker_activate(worker=worker, job=serving["job"])


def test_an_owner_archives_an_ended_job_and_deletes_only_one_that_never_ran(serving):
    api, job = client_for(serving["owner"]), serving["job"]
    refused = api.post(f"/api/jobs/{job.pk}/archive/")
    assert refused.status_code == 400 and "status" in refused.json()["errors"]
    deleted = api.delete(f"/api/jobs/{job.pk}/")
    assert deleted.status_code == 400 and "job" in deleted.json()["errors"]
    api.post(f"/api/jobs/{job.pk}/cancel/")
    assert api.post(f"/api/jobs/{job.pk}/archive/").json()["archived_at"]
    assert api.get("/api/jobs/").json()["results"] == []
    assert [j["id"] for j in api.get("/api/jobs/?archived=1").json()["results"]] == [job.pk]
    assert api.get(f"/api/ledger/?job={job.pk}").json()["entries"], "an archived job keeps its ledger"
    assert api.post(f"/api/jobs/{job.pk}/unarchive/").json()["archived_at"] is None

    draft = factories.job(serving["owner"])
    assert api.delete(f"/api/jobs/{draft.pk}/").status_code == 204
    assert not Job.objects.filter(pk=draft.pk).exists()


def test_a_price_over_the_jobs_max_price_releases_the_worker_at_once(settings, redis_url):
    provider = factories.user("provider")
    worker, _ = factories.worker(provider, price="0.5", name="rig")
    job = factories.job(factories.user("owner"), requirements={"max_price_per_hour": 1.0})
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    activation = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour)
    services.worker_price_set(worker=worker, price_per_hour=Decimal("0.9"))
    assert Activation.objects.get(pk=activation.pk).ended_at is None, "still under the job's cap"
    services.worker_price_set(worker=worker, price_per_hour=Decimal("1.5"))
    ended = Activation.objects.get(pk=activation.pk)
    assert ended.ended_at is not None and "max_price_per_hour" in ended.end_reason
