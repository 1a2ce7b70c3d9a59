"""The pages' controls (docs/ledger.md): a provider prices, pauses, resumes and removes a worker on the
provider page; an owner sets a job's budget, archives it (gone from the list until asked for) and deletes a draft."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.models import Job, PriceChange, Worker

from ..marketplace import factories

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_provider_prices_pauses_resumes_and_removes_a_worker_on_its_page(redis_url):
    provider = factories.user("prov")
    worker, _ = factories.worker(provider, name="rig", price="0.5")
    page = signed_in(provider)
    assert 'data-controls="rig"' in page.get("/provider/").content.decode()

    page.post(f"/provider/workers/{worker.pk}/price/", {"price_per_hour": "0.75"})
    assert Worker.objects.get(pk=worker.pk).price_per_hour == Decimal("0.75")
    assert list(PriceChange.objects.filter(worker=worker).values_list("price_per_hour", flat=True)) == [
        Decimal("0.5"), Decimal("0.75")]
    shown = page.post(f"/provider/workers/{worker.pk}/price/", {"price_per_hour": "cheap"}, follow=True)
    assert "price_per_hour: must be a number" in shown.content.decode()

    page.post(f"/provider/workers/{worker.pk}/pause/")
    assert Worker.objects.get(pk=worker.pk).paused_at is not None
    assert "resume-button" in page.get("/provider/").content.decode()
    page.post(f"/provider/workers/{worker.pk}/resume/")
    assert Worker.objects.get(pk=worker.pk).paused_at is None

    assert signed_in(factories.user()).post(f"/provider/workers/{worker.pk}/remove/").status_code == 404
    page.post(f"/provider/workers/{worker.pk}/remove/")
    assert Worker.objects.get(pk=worker.pk).removed_at is not None
    assert 'data-controls="rig"' not in page.get("/provider/").content.decode()


def test_an_owner_sets_a_budget_archives_and_deletes_on_the_job_pages(redis_url):
    owner = factories.user("owner")
    job, draft = factories.job(owner), factories.job(owner)
    page = signed_in(owner)
    assert "budget-button" in page.get(f"/jobs/{job.pk}/").content.decode()
    page.post(f"/jobs/{job.pk}/manage/budget/", {"budget_usd": "12.5"})
    assert Job.objects.get(pk=job.pk).settings.budget_usd == 12.5
    refused = page.post(f"/jobs/{job.pk}/manage/budget/", {"budget_usd": "-3"}, follow=True).content.decode()
    assert "budget_usd" in refused and Job.objects.get(pk=job.pk).settings.budget_usd == 12.5

    Job.objects.filter(pk=job.pk).update(status=Job.Status.CANCELLED, started_at=timezone.now())
    page.post(f"/jobs/{job.pk}/manage/archive/")
    assert f"/jobs/{job.pk}/" not in page.get("/").content.decode()
    assert f"/jobs/{job.pk}/" in page.get("/?archived=1").content.decode()
    page.post(f"/jobs/{job.pk}/manage/delete/")
    assert Job.objects.filter(pk=job.pk).exists(), "a job that ran is archived, never deleted"
    page.post(f"/jobs/{draft.pk}/manage/delete/")
    assert not Job.objects.filter(pk=draft.pk).exists()
    invoice = page.get(f"/api/ledger/?job={job.pk}&format=csv", HTTP_ACCEPT="text/html,*/*;q=0.8")  # the page's link
    assert invoice.status_code == 200 and invoice["Content-Type"].startswith("text/csv")
