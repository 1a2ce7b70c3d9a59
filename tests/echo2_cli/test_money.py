"""``echo2 ledger``, ``echo2 worker ...`` and ``echo2 job budget|archive|delete`` against a live site:
the ledger's totals as the API gives them, CSV to a file, a price changed from now on, a worker paused and removed,
a job's budget raised, archived, a draft deleted; bad input one line and exit 2."""

from __future__ import annotations

import csv
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from echo2_cli.client import LEDGER_PAGE
from marketplace.models import Activation, Job, LedgerEntry
from marketplace.services.billing import activation_report

from ..marketplace import factories
from .test_cli import echo2, one_line_error


@pytest.fixture
def people(live_server, tmp_path, redis_url, settings):
    """An owner's job served by a provider's worker for 10 billed seconds at $3.60/h; each person's CLI env."""
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 1000.0}
    env = {}
    for name in ("owner", "provider"):
        user = factories.user(name)
        token_file = tmp_path / f"{name}.token"
        token_file.write_text(factories.token(user) + "\n")
        token_file.chmod(0o600)
        env[name] = {"ECHO2_SERVER": live_server.url, "ECHO2_TOKEN_FILE": str(token_file)}
        env[name + "_user"] = user
    worker, _ = factories.worker(env["provider_user"], price="3.6", name="rig")
    job = factories.job(env["owner_user"], budget_usd=5.0)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    t0 = timezone.now() - timedelta(seconds=30)
    activation = Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                                           state="generating", reported_at=t0, started_at=t0)
    activation_report(activation_id=activation.pk, at=t0 + timedelta(seconds=10), state="idle")
    return env, worker, job, tmp_path


@pytest.mark.django_db(transaction=True)
def test_ledger_worker_and_job_controls(people):
    env, worker, job, tmp = people
    owner, provider = env["owner"], env["provider"]

    invoice = json.loads(echo2("ledger", "--job", str(job.pk), "--json", env=owner).stdout)
    assert invoice["totals"]["total_usd"] == "0.01" and invoice["entries"][0]["seconds"] == "10.000000"
    assert "total 0.01 USD" in echo2("ledger", env=provider).stdout
    done = echo2("ledger", "--worker", str(worker.pk), "--csv", "--out", str(tmp / "s.csv"), env=provider)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((tmp / "s.csv").open()))
    assert rows[0]["amount_usd"] == "0.010000000" and (rows[-1]["amount_usd"], rows[-1]["total_usd"]) == ("", "0.01")
    assert one_line_error(echo2("ledger", "--from", "yesterday", env=owner), 2).endswith(
        "from: must be an ISO 8601 date or time, e.g. 2026-12-01 or 2026-12-01T12:00:00Z")

    assert one_line_error(echo2("worker", "price", str(worker.pk), "0", env=provider), 2) == (
        "price_per_hour: must be a positive number of USD")
    assert "0.4200 USD/h" in echo2("worker", "price", str(worker.pk), "0.42", env=provider).stdout
    assert "(paused)" in echo2("worker", "pause", str(worker.pk), env=provider).stdout
    assert "(paused" not in echo2("worker", "resume", str(worker.pk), env=provider).stdout
    assert "removed" in echo2("worker", "remove", str(worker.pk), env=provider).stdout
    assert json.loads(echo2("worker", "list", "--json", env=provider).stdout) == []

    assert json.loads(echo2("job", "budget", str(job.pk), "9.5", "--json", env=owner).stdout)["budget_usd"] == 9.5
    assert one_line_error(echo2("job", "budget", str(job.pk), "lots", env=owner), 2) == (
        "budget_usd: must be a number, not 'lots'")
    assert one_line_error(echo2("job", "delete", str(job.pk), env=owner), 2).endswith("archive it instead")
    echo2("job", "cancel", str(job.pk), env=owner)
    assert json.loads(echo2("job", "archive", str(job.pk), "--json", env=owner).stdout)["archived_at"]
    assert json.loads(echo2("job", "list", "--json", env=owner).stdout) == []
    assert [j["id"] for j in json.loads(echo2("job", "list", "--archived", "--json", env=owner).stdout)] == [job.pk]
    draft = factories.job(env["owner_user"])
    assert echo2("job", "delete", str(draft.pk), env=owner).stdout.strip() == f"job {draft.pk} deleted"
    assert json.loads(echo2("ledger", "--json", env=owner).stdout)["totals"]["total_usd"] == "0.01"


@pytest.mark.django_db(transaction=True)
def test_ledger_follows_every_page(people):
    """More entries than one page holds (the API's most, 1000): the CLI walks the cursor and shows all of them,
    once each, in the ledger's order."""
    env, worker, job, _ = people
    first = LedgerEntry.objects.get(job=job)
    at = first.at
    LedgerEntry.objects.bulk_create([  # one billing sweep's worth at the same instant, then later ones
        LedgerEntry(worker=worker, job=job, provider=worker.provider, owner=job.owner, worker_name=worker.name,
                    job_name=job.name, state="generating", started_at=at, at=at + timedelta(seconds=k // 600),
                    seconds=Decimal(1), rate=Decimal("3.6"), amount=Decimal("0.001"))
        for k in range(LEDGER_PAGE + 200)])
    invoice = json.loads(echo2("ledger", "--job", str(job.pk), "--json", env=env["owner"]).stdout)
    ids = [e["id"] for e in invoice["entries"]]
    assert len(ids) == len(set(ids)) == LEDGER_PAGE + 201 == invoice["totals"]["entries"]
    assert ids == list(LedgerEntry.objects.filter(job=job).order_by("at", "id").values_list("id", flat=True))
    table = echo2("ledger", "--job", str(job.pk), "--entries", env=env["owner"]).stdout
    assert f"{LEDGER_PAGE + 201} entries, total" in table and table.count(" generating ") == LEDGER_PAGE + 201
    summary = echo2("ledger", "--job", str(job.pk), env=env["owner"]).stdout  # the default: per job/worker/day
    assert f"{LEDGER_PAGE + 201} entries, total" in summary and " generating " not in summary
    assert "per job" in summary and "per day (UTC)" in summary and at.date().isoformat() in summary
