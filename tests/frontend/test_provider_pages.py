"""The provider page and the staff marketplace page show each worker's relay score, uptime and utilization."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.models import Activation, Worker, WorkerSession

from ..marketplace import factories

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def row(page: str, name: str) -> str:
    """The table row of worker ``name``."""
    return re.search(rf'<tr data-worker="{name}">(.*?)</tr>', page, re.S).group(1)


def cell(page: str, name: str, css_class: str) -> str:
    return re.search(rf'<td class="{css_class}">(.*?)</td>', row(page, name), re.S).group(1)


@pytest.fixture
def fleet():
    """A provider with a relay online for the last day of its two (registered two days ago), and a worker
    without a relay address that never connected."""
    now = timezone.now()
    provider = factories.user("prov")
    relay, _ = factories.worker(provider, name="relay-rig")
    plain, _ = factories.worker(provider, name="plain-rig")
    Worker.objects.filter(pk=relay.pk).update(relay_address="10.0.0.1:7000", status=Worker.Status.IDLE,
                                              last_heartbeat=now, created_at=now - timedelta(days=2))
    Worker.objects.filter(pk=plain.pk).update(created_at=now - timedelta(days=2))
    WorkerSession.objects.create(worker=relay, started_at=now - timedelta(days=1))
    return provider, relay, plain


def test_provider_page_shows_score_uptime_and_online_since(fleet):
    provider, relay, _ = fleet
    page = signed_in(provider).get("/provider/").content.decode()
    assert ">Score</th>" in page and ">Uptime (7 d)</th>" in page and ">Online since</th>" in page
    assert cell(page, "relay-rig", "score") == "0.65"  # the fleet's only relay: full Speed, no history yet
    assert cell(page, "relay-rig", "uptime") == "50.0 %"
    since = WorkerSession.objects.get(worker=relay).started_at
    assert cell(page, "relay-rig", "online-since") == timezone.localtime(since).strftime("%b %-d, %H:%M")
    assert "No relay address" in cell(page, "plain-rig", "score")
    assert (cell(page, "plain-rig", "uptime"), cell(page, "plain-rig", "online-since")) == ("0.0 %", "—")
    assert "Score: the rank (0 to 1) the scheduler gives a worker" in page  # what the score means
    # factories register 12.5 MB/s = 100 Mbit/s; nothing measured until a chain child installs through it
    assert cell(page, "relay-rig", "link") == "100.0 / —"
    Worker.objects.filter(pk=relay.pk).update(measured_bandwidth_bps=5e6)
    page = signed_in(provider).get("/provider/").content.decode()
    assert cell(page, "relay-rig", "link") == "100.0 / 40.0"


def test_marketplace_page_shows_uptime_and_utilization_per_worker(fleet):
    _, relay, plain = fleet
    job = factories.job(factories.user())
    Activation.objects.create(job=job, worker=relay, price_per_hour=relay.price_per_hour,
                              started_at=timezone.now() - timedelta(hours=12))
    page = signed_in(factories.user(is_staff=True)).get("/marketplace/").content.decode()
    assert ">Uptime (7 d)</th>" in page and ">Utilization (7 d)</th>" in page and ">Score</th>" in page
    assert cell(page, "relay-rig", "uptime") == "50.0 %"
    assert cell(page, "relay-rig", "utilization") == "25.0 %"  # half a day of two
    assert cell(page, "plain-rig", "utilization") == "0.0 %"
    assert cell(page, "relay-rig", "score") == "0.65"


def test_provider_creates_and_replaces_the_api_token_shown_once():
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    provider = factories.user()
    client = signed_in(provider)
    page = client.get("/provider/").content.decode()
    assert "Create my API token" in page and "--token-file ~/.echo2-token" in page
    assert client.get("/provider/token/").status_code == 405  # creating it is a POST

    def works(token: str) -> bool:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        return api.get("/api/jobs/").status_code == 200

    reply = client.post("/provider/token/")
    page = reply.content.decode()
    first = re.search(r'<pre id="new-token">(e2u_[0-9a-f]{64})</pre>', page)[1]
    assert reply.status_code == 200 and "shown only now" in page and "A new API token was created" in page
    assert works(first)
    assert first not in client.get("/provider/").content.decode(), "a token is shown once"
    assert "Replace my API token" in client.get("/provider/").content.decode()
    stored = AuthToken.objects.get(user=provider)
    assert first not in (stored.digest, stored.token_key) and len(stored.digest) == 128  # sha512, never the token

    second = re.search(r'<pre id="new-token">(\S+)</pre>', client.post("/provider/token/").content.decode())[1]
    assert second != first and works(second) and not works(first), "replacing revokes the old token at once"
    assert first not in signed_in(factories.user()).get("/provider/").content.decode()


def test_provider_page_shows_the_state_its_agent_reports_and_billed_hours_beside_active_ones(fleet):
    provider, relay, _ = fleet
    job = factories.job(factories.user())
    Activation.objects.create(job=job, worker=relay, price_per_hour=relay.price_per_hour, billed_seconds=1800.0,
                              started_at=timezone.now() - timedelta(hours=2), state="failed",
                              state_reason="RuntimeError: CUDA error")
    page = signed_in(provider).get("/provider/").content.decode()
    status = cell(page, "relay-rig", "status")
    assert status.startswith("idle")
    assert '<span class="state state-failed" title="RuntimeError: CUDA error">failed</span>' in status
    assert cell(page, "relay-rig", "hours") == "2.000 / 0.500"  # active in the job two hours, billed half an hour
    assert cell(page, "plain-rig", "status") == "offline"  # in no job: no state
