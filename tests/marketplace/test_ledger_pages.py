"""``GET /api/ledger/`` in pages (docs/ledger.md "Reading it"): a cursor over (at, id), forward and back, every
entry exactly once even with ties in ``at`` and entries billed mid-walk; totals of the whole selection on every
page; bad ``limit`` or ``cursor`` a 400 naming it; the schema shows it; the CLI follows the pages."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.models import LedgerEntry

from . import factories

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


def bill(job, worker, at, seconds: int = 10) -> LedgerEntry:
    return LedgerEntry.objects.create(worker=worker, job=job, provider=worker.provider, owner=job.owner,
                                      worker_name=worker.name, job_name=job.name, state="generating",
                                      started_at=at - timedelta(seconds=seconds), at=at, seconds=Decimal(seconds),
                                      rate=Decimal("3.6"), amount=Decimal(seconds) / 1000)


@pytest.fixture
def books():
    """An owner's job billed 11 times by one worker: entries 3-5 share one ``at`` (a billing sweep), as do 8-9."""
    owner = factories.user("owner")
    worker, _ = factories.worker(owner, price="3.6", name="rig")
    job = factories.job(owner)
    t0 = timezone.now() - timedelta(hours=1)
    ats = [0, 1, 2, 2, 2, 3, 4, 5, 5, 6, 7]
    made = [bill(job, worker, t0 + timedelta(seconds=10 * k)) for k in ats]
    return {"api": client_for(owner), "job": job, "worker": worker, "ids": [e.pk for e in made], "t0": t0}


def walk(api, url: str, key: str = "next") -> tuple[list[int], list[dict]]:
    seen, pages = [], []
    while url:
        reply = api.get(url)
        assert reply.status_code == 200, reply.content
        page = reply.json()
        pages.append(page)
        seen += [e["id"] for e in page["entries"]]
        url = page[key]
    return seen, pages


@pytest.mark.parametrize("limit", [1, 3, 4, 11, 1000])
def test_the_pages_hold_every_entry_once_in_order_with_the_whole_totals(books, limit):
    seen, pages = walk(books["api"], f"/api/ledger/?job={books['job'].pk}&limit={limit}")
    assert seen == books["ids"], "every entry once, by at then id (ties in at kept apart by id)"
    assert len(pages) == -(-11 // limit)
    assert all(len(p["entries"]) == limit for p in pages[:-1]) and pages[-1]["next"] is None
    assert pages[0]["previous"] is None
    assert {p["totals"]["entries"] for p in pages} == {11}, "totals are of the selection, not the page"
    assert {p["totals"]["total_usd"] for p in pages} == {"0.11"}
    assert all(f"job={books['job'].pk}" in p["next"] for p in pages[:-1]), "the filters travel with the cursor"


def test_previous_walks_back_over_the_same_pages(books):
    _, pages = walk(books["api"], "/api/ledger/?limit=3")
    back, back_pages = walk(books["api"], pages[-1]["previous"], key="previous")
    assert back_pages[0]["entries"] == pages[-2]["entries"]
    assert sorted(back) == sorted(books["ids"][:9]) and back_pages[-1]["previous"] is None
    again = books["api"].get(back_pages[-1]["next"]).json()
    assert again["entries"] == pages[1]["entries"], "next from a page reached backwards"


def test_an_entry_billed_mid_walk_moves_nothing(books):
    api = books["api"]
    first = api.get("/api/ledger/?limit=4").json()
    late = bill(books["job"], books["worker"], timezone.now())  # billed while the client walks
    seen, _ = walk(api, first["next"])
    assert [e["id"] for e in first["entries"]] + seen == books["ids"] + [late.pk]


def test_default_limit_is_the_apis_page_size(books, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "PAGE_SIZE": 5}
    page = books["api"].get("/api/ledger/").json()
    assert page["limit"] == 5 and len(page["entries"]) == 5 and page["next"]


@pytest.mark.parametrize(("query", "field"), [
    ("limit=0", "limit"), ("limit=1001", "limit"), ("limit=abc", "limit"), ("limit=-3", "limit"),
    ("cursor=bm9wZQ", "cursor"), ("cursor=%%%", "cursor"),
    ("cursor=" + base64.urlsafe_b64encode(b"n|2026-12-01T00:00:00|7").decode(), "cursor"),  # no offset: not ours
    ("cursor=" + base64.urlsafe_b64encode(b"x|2026-12-01T00:00:00+00:00|7").decode(), "cursor"),
    ("format=csv&limit=5", "limit"), ("format=csv&cursor=abc", "cursor")])
def test_bad_paging_is_a_400_naming_the_parameter(books, query, field):
    reply = books["api"].get(f"/api/ledger/?{query}")
    body = json.loads(reply.content)  # a CSV's errors come as JSON text (the CSV renderer's)
    assert reply.status_code == 400 and field in body["errors"], (query, reply.content)
    assert body["detail"].startswith(field)


def test_the_csv_stays_the_whole_statement(books):
    sheet = books["api"].get("/api/ledger/?format=csv")
    assert sheet.status_code == 200 and len(sheet.content.decode().splitlines()) == 1 + 11 + 1


def test_the_schema_shows_the_pages(books):
    schema = books["api"].get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/ledger/"]["get"]
    assert {"limit", "cursor"} <= {p["name"] for p in operation["parameters"]}
    body = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    fields = schema["components"]["schemas"][body]["properties"]
    assert {"filters", "totals", "entries", "limit", "next", "previous"} <= set(fields)
    assert "400" in operation["responses"]
