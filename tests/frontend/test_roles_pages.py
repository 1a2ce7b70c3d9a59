"""Who lands where and what each role reads: a provider signs in onto its own page, which shows a paused worker as
paused, flags a declared GPU its agent did not measure, lists each worker's prices and its earnings per day, and
offers a statement for a period; staff sign in onto the list of every job with why it waits and what can be done."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from marketplace import services
from marketplace.models import LedgerEntry, Worker

from ..marketplace import factories

pytestmark = pytest.mark.django_db


def signs_in(user, password="pw-12345678") -> tuple[Client, str]:
    client = Client()
    landed = client.post("/accounts/login/", {"username": user.username, "password": password}, follow=True)
    return client, landed.redirect_chain[-1][0]


def bill(worker: Worker, job, *, at, seconds: int, rate: str) -> None:
    amount = (Decimal(seconds) * Decimal(rate) / 3600).quantize(Decimal("0.000000001"))
    LedgerEntry.objects.create(worker=worker, job=job, provider=worker.provider, owner=job.owner,
                               worker_name=worker.name, job_name=job.name, state="generating",
                               started_at=at - timedelta(seconds=seconds), at=at, seconds=seconds,
                               rate=Decimal(rate), amount=amount)


def test_a_provider_lands_on_its_page_and_reads_its_books(redis_url):
    provider, owner = factories.user("prov"), factories.user("owner")
    rig, _ = factories.worker(provider, name="rig", price="0.5")
    Worker.objects.filter(pk=rig.pk).update(gpu="rtx-5090", hardware={
        "gpus": [], "engines": ["hf"], "cpu_count": 2, "ram_gb": 8, "disk_free_gb": 10})
    services.worker_price_set(worker=Worker.objects.get(pk=rig.pk), price_per_hour=Decimal("0.75"))
    services.worker_pause(worker=Worker.objects.get(pk=rig.pk))
    job = factories.job(owner)
    now = timezone.now()
    bill(rig, job, at=now - timedelta(days=1), seconds=3600, rate="0.5")
    bill(rig, job, at=now, seconds=1800, rate="0.75")

    page, landed = signs_in(provider)
    assert landed == "/provider/"  # not the empty jobs list of an owner
    html = page.get(landed).content.decode()
    row = re.search(r'<tr data-worker="rig">(.*?)</tr>', html, re.S).group(1)
    assert ">paused<" in row and ">idle<" not in row
    assert "declared rtx-5090, but its agent measured no GPU" in row
    prices = re.search(r'<td class="price-history">(.*?)</td>', html, re.S).group(1)
    assert re.fullmatch(r"0\.5000 from \w{3} \d+, \d\d:\d\d<br>0\.7500 from \w{3} \d+, \d\d:\d\d", prices), prices
    days = re.findall(r'<tr data-day="([\d-]+)"><td>[\d-]+</td><td>1</td><td>([\d.]+)</td><td>([\d.]+)</td>', html)
    assert days == [(now.date().isoformat(), "0.500", "0.38"),
                    ((now - timedelta(days=1)).date().isoformat(), "1.000", "0.50")]
    assert 'id="statement-form"' in html and f'<option value="{rig.pk}">rig</option>' in html

    _, landed = signs_in(owner)
    assert landed == "/"


def test_staff_land_on_every_job_with_why_it_waits_and_its_actions(redis_url):
    staff, owner = factories.user("staff", is_staff=True), factories.user("owner")
    job = factories.job(owner, name="needs a learner")
    services.job_start(job=job)
    page, landed = signs_in(staff)
    assert landed == "/"
    row = re.search(rf"<tr>(<td>{job.pk}</td>.*?)</tr>", page.get("/").content.decode(), re.S).group(1)
    assert f"waiting for learner: none has reported yet (echo2-learner --job {job.pk})" in row
    assert f'action="/jobs/{job.pk}/pause/"' in row and f'action="/jobs/{job.pk}/cancel/"' in row
    assert "/start/" not in row  # only what its status allows


def test_staff_see_paused_workers_and_declared_hardware_flagged_on_the_marketplace(redis_url):
    staff, provider = factories.user("staff", is_staff=True), factories.user("prov")
    rig, _ = factories.worker(provider, name="rig", price="0.5")
    Worker.objects.filter(pk=rig.pk).update(gpu="RTX 5090", hardware={
        "gpus": [{"name": "NVIDIA GeForce RTX 4090", "memory_gb": 24, "capability": "8.9"}], "engines": ["hf"],
        "cpu_count": 8, "ram_gb": 64, "disk_free_gb": 100})
    services.worker_pause(worker=Worker.objects.get(pk=rig.pk))
    page, _ = signs_in(staff)
    row = re.search(r'<tr data-worker="rig">(.*?)</tr>', page.get("/marketplace/").content.decode(), re.S).group(1)
    assert "declared RTX 5090, but its agent measured NVIDIA GeForce RTX 4090" in row and ">paused<" in row

