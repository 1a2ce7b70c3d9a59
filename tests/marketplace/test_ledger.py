"""The ledger (docs/ledger.md): every billed interval one immutable entry, at the rate then in force;
its sums are what the dashboard shows, to the cent, over a run with a price change and a fault; read as JSON and
CSV, scoped to the owner's jobs and the provider's workers."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import services
from marketplace.core import billing
from marketplace.models import Activation, Job, LedgerEntry
from marketplace.models.ledger import LedgerError
from marketplace.reads import selectors
from marketplace.services.billing import activation_report

from . import factories

pytestmark = pytest.mark.django_db
SECOND = timedelta(seconds=1)


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


@pytest.fixture
def run(settings, redis_url):
    """A running job served by two workers of two providers, both generating since ``t0`` (100 s ago)."""
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 1000.0}
    owner, alice, bob = factories.user("owner"), factories.user("alice"), factories.user("bob")
    a, _ = factories.worker(alice, price="3.6", name="a-rig")
    b, _ = factories.worker(bob, price="1.8", name="b-rig")
    job = factories.job(owner)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    t0 = timezone.now() - 100 * SECOND
    acts = {w.name: Activation.objects.create(job=job, worker=w, price_per_hour=w.price_per_hour, state="generating",
                                              reported_at=t0, started_at=t0) for w in (a, b)}
    return {"owner": owner, "alice": alice, "bob": bob, "a": a, "b": b, "job": Job.objects.get(pk=job.pk),
            "t0": t0, "acts": acts}


def cents(value) -> Decimal:
    return billing.cents(Decimal(str(value)))


def test_a_run_with_a_price_change_and_a_fault_reconciles_to_the_cent(run):
    a, b, job, t0 = run["a"], run["b"], run["job"], run["t0"]
    for worker in (a, b):  # 10 s generating each, at the registered prices
        activation_report(activation_id=run["acts"][worker.name].pk, at=t0 + 10 * SECOND, state="generating")
    services.worker_price_set(worker=a, price_per_hour=Decimal("7.2"))  # bills a-rig up to now at 3.6 first
    changed = Activation.objects.get(pk=run["acts"]["a-rig"].pk).reported_at  # loading then (no install seen)
    activation_report(activation_id=run["acts"]["a-rig"].pk, at=changed + SECOND, state="generating")
    activation_report(activation_id=run["acts"]["a-rig"].pk, at=changed + 21 * SECOND, state="idle")  # 20 s at 7.2
    # the fault: b-rig's socket closes 50 s in; nothing after it is billed (it stays silent, is released later)
    services.worker_disconnected(worker=b, at=t0 + 50 * SECOND)
    services.job_finish(job=job, status=Job.Status.COMPLETED)

    entries = LedgerEntry.objects.filter(job=job)
    a_rates = {e.rate: e.seconds for e in entries.filter(worker=a, rate=Decimal("7.2"))}
    assert sorted({e.rate for e in entries.filter(worker=a)}) == [Decimal("3.6"), Decimal("7.2")]
    assert a_rates == {Decimal("7.2"): Decimal("20.000000")}, "the later interval at the new rate, exactly"
    assert sum(e.seconds for e in entries.filter(worker=b)) == Decimal("50"), "nothing billed after the close"
    for entry in entries:
        assert entry.amount == (entry.seconds * entry.rate / 3600).quantize(billing.NANO_USD)

    total = sum(e.amount for e in entries)
    summary = selectors.job_summary(Job.objects.get(pk=job.pk))
    earnings = selectors.worker_earnings([a, b])
    assert cents(summary["cost_usd"]) == billing.cents(total)
    assert cents(sum(e["earned_usd"] for e in earnings.values())) == billing.cents(total)
    for worker in (a, b):
        assert cents(earnings[worker.pk]["earned_usd"]) == billing.cents(
            sum(e.amount for e in entries.filter(worker=worker)))
    assert summary["projected_cost_usd"] == summary["cost_usd"], "a finished job's projection is its spend"

    owner = client_for(run["owner"]).get(f"/api/ledger/?job={job.pk}").json()
    assert owner["totals"]["total_usd"] == str(billing.cents(total)) and len(owner["entries"]) == entries.count()
    assert {r["rate_per_hour"] for r in owner["totals"]["by_rate"]} == {"1.8000", "3.6000", "7.2000"}
    sheet = client_for(run["owner"]).get(f"/api/ledger/?job={job.pk}&format=csv")
    assert sheet["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(sheet.content.decode())))
    assert sum(Decimal(r["amount_usd"]) for r in rows[:-1]) == total
    assert rows[-1]["id"] == "total" and rows[-1]["total_usd"] == str(billing.cents(total))
    # a spreadsheet's SUM over the whole amount column is the total, not twice it (the total has a column of its own)
    assert sum(Decimal(r["amount_usd"] or 0) for r in rows) == total
    assert sum(Decimal(d["amount_usd"]) for d in owner["totals"]["by_day"]) == total  # per UTC day, all of it


def test_each_side_sees_only_its_entries_and_entries_are_immutable(run):
    for act in run["acts"].values():
        activation_report(activation_id=act.pk, at=run["t0"] + 10 * SECOND, state="generating")
    alice = client_for(run["alice"]).get("/api/ledger/").json()
    assert {e["worker_name"] for e in alice["entries"]} == {"a-rig"}, "a provider sees its workers' entries"
    assert client_for(run["bob"]).get(f"/api/ledger/?worker={run['a'].pk}").json()["entries"] == []
    assert len(client_for(run["owner"]).get("/api/ledger/").json()["entries"]) == 2, "the owner sees its job's"
    assert client_for(factories.user()).get("/api/ledger/").json()["totals"]["total_usd"] == "0.00"
    entry = LedgerEntry.objects.first()
    entry.amount = Decimal(0)
    with pytest.raises(LedgerError):
        entry.save()
    with pytest.raises(LedgerError):
        entry.delete()


@pytest.mark.parametrize(("query", "field"), [("job=x", "job"), ("worker=-1", "worker"), ("from=yesterday", "from"),
                                              ("from=2026-12-02&to=2026-12-01", "to"), ("format=xml", "format")])
def test_bad_ledger_queries_name_the_field(query, field):
    reply = client_for(factories.user()).get(f"/api/ledger/?{query}")
    assert reply.status_code == 400 and field in reply.json()["errors"], reply.content


def test_from_and_to_bound_the_entries_by_when_they_were_billed(run):
    act = run["acts"]["a-rig"]
    activation_report(activation_id=act.pk, at=run["t0"] + 10 * SECOND, state="generating")
    activation_report(activation_id=act.pk, at=run["t0"] + 20 * SECOND, state="generating")
    cut = (run["t0"] + 15 * SECOND).isoformat().replace("+00:00", "Z")
    api = client_for(run["alice"])
    assert [e["seconds"] for e in api.get("/api/ledger/", {"to": cut}).json()["entries"]] == ["10.000000"]
    assert [e["seconds"] for e in api.get("/api/ledger/", {"from": cut}).json()["entries"]] == ["10.000000"]
    assert len(api.get("/api/ledger/", {"from": cut, "to": cut[:10] + "T23:59:59Z"}).json()["entries"]) == 1
