"""``GET /api/ledger/``: the ledger's entries a person may read, with their totals, as JSON or CSV (docs/ledger.md).

``?job=ID&worker=ID&from=WHEN&to=WHEN&format=json|csv``: an owner gets the entries of its jobs (an invoice), a
provider those of its workers (a statement), staff all; ``from`` and ``to`` are ISO 8601 dates or times (UTC when
no offset is given), ``from`` included, ``to`` excluded.

JSON comes in pages (``?limit=N&cursor=C``): ``entries`` is one page in the ledger's order, ``next`` and
``previous`` the URLs of the pages beside it (null at either end), ``totals`` always of every entry the filters
select. The cursor is a position (an entry's ``at`` and ``id``), not an offset: see
:func:`marketplace.reads.ledger.page`.
The CSV is the whole statement in one download (a file to keep); ``limit`` or ``cursor`` with it is a 400.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import UTC, datetime

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder
from rest_framework.views import APIView

from ..reads import ledger
from .errors import Pagination

FORMATS = ("json", "csv")
MAX_LIMIT = Pagination.max_limit
"""The most entries in one page: the same bound as every other list of the API."""


class CsvRenderer(BaseRenderer):
    """``?format=csv``: the view answers the CSV itself; this renders only its errors (as JSON text)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        return json.dumps(data, cls=JSONEncoder).encode()


def _id(params, field: str) -> int | None:
    value = params.get(field)
    if value in (None, ""):
        return None
    if not re.fullmatch(r"[0-9]{1,18}", value):
        raise ValidationError({field: [f"must be a {field} id (a positive integer), not {value[:40]!r}"]})
    return int(value)


def _when(params, field: str) -> datetime | None:
    value = params.get(field)
    if value in (None, ""):
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError({field: ["must be an ISO 8601 date or time, e.g. 2026-12-01 or "
                                       "2026-12-01T12:00:00Z"]}) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def filters(params) -> dict:
    """The query's filters, each checked (a bad one is a 400 naming it)."""
    found = {"job": _id(params, "job"), "worker": _id(params, "worker"), "since": _when(params, "from"),
             "until": _when(params, "to")}
    if found["since"] and found["until"] and found["until"] <= found["since"]:
        raise ValidationError({"to": ["must be after from"]})
    return found


def _limit(params) -> int:
    value = params.get("limit")
    if value in (None, ""):
        return settings.REST_FRAMEWORK["PAGE_SIZE"]
    if not re.fullmatch(r"[0-9]{1,9}", value) or not 1 <= int(value) <= MAX_LIMIT:
        raise ValidationError({"limit": [f"must be a whole number from 1 to {MAX_LIMIT}, not {value[:40]!r}"]})
    return int(value)


def cursor_for(direction: str, entry) -> str:
    """An opaque cursor: ``n`` (the entries after ``entry``) or ``p`` (those before it), and its position."""
    raw = f"{direction}|{entry.at.isoformat()}|{entry.pk}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _cursor(params) -> tuple[str, ledger.Position] | None:
    value = params.get("cursor")
    if value in (None, ""):
        return None
    try:
        direction, at, pk = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode().split("|")
        when = datetime.fromisoformat(at)
        if direction not in ("n", "p") or when.tzinfo is None or not re.fullmatch(r"[0-9]{1,18}", pk):
            raise ValueError(direction)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise ValidationError({"cursor": ["is not a cursor this endpoint gave (use the next or previous URL of a "
                                          "page as it is)"]}) from None
    return direction, (when, int(pk))


def _page_url(request, cursor: str) -> str:
    query = request.query_params.copy()
    query["cursor"] = cursor
    return request.build_absolute_uri(request.path) + "?" + query.urlencode()


def paged(request, qs) -> dict:
    """The page the query asks for: its entries and the URLs of the pages before and after it."""
    limit, cursor = _limit(request.query_params), _cursor(request.query_params)
    direction, position = cursor or ("n", None)
    if direction == "p":
        rows, more = ledger.page(qs, limit=limit, before=position)
        after, before = rows[-1:] or None, (rows[:1] if more else None)
    else:
        rows, more = ledger.page(qs, limit=limit, after=position)
        after, before = (rows[-1:] if more else None), (rows[:1] if position is not None else None)
    return {"limit": limit, "entries": [ledger.row(entry) for entry in rows],
            "next": _page_url(request, cursor_for("n", after[0])) if after else None,
            "previous": _page_url(request, cursor_for("p", before[0])) if before else None}


class LedgerEntrySerializer(serializers.Serializer):  # the schema's, of ``ledger.row`` (decimals as strings)
    id = serializers.IntegerField()
    at = serializers.CharField()
    started_at = serializers.CharField()
    job_id = serializers.IntegerField(allow_null=True)
    job_name = serializers.CharField()
    worker_id = serializers.IntegerField(allow_null=True)
    worker_name = serializers.CharField()
    state = serializers.CharField()
    seconds = serializers.CharField()
    rate_per_hour = serializers.CharField()
    amount_usd = serializers.CharField()


class LedgerBalanceSerializer(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True)
    name = serializers.CharField()
    seconds = serializers.CharField()
    amount_usd = serializers.CharField()
    total_usd = serializers.CharField()


class LedgerRateSerializer(serializers.Serializer):
    rate_per_hour = serializers.CharField()
    seconds = serializers.CharField()
    amount_usd = serializers.CharField()


class LedgerDaySerializer(serializers.Serializer):
    day = serializers.DateField(help_text="A UTC day (the entries' at).")
    entries = serializers.IntegerField()
    seconds = serializers.CharField()
    amount_usd = serializers.CharField()
    total_usd = serializers.CharField()


class LedgerTotalsSerializer(serializers.Serializer):
    entries = serializers.IntegerField(help_text="How many entries the filters select (on every page).")
    seconds = serializers.CharField()
    amount_usd = serializers.CharField()
    total_usd = serializers.CharField(help_text="The amount rounded to the cent.")
    by_rate = LedgerRateSerializer(many=True)
    by_job = LedgerBalanceSerializer(many=True)
    by_worker = LedgerBalanceSerializer(many=True)
    by_day = LedgerDaySerializer(many=True, help_text="Per UTC day, oldest first: spend or earnings over time.")


class LedgerFiltersSerializer(serializers.Serializer):
    job = serializers.IntegerField(allow_null=True)
    worker = serializers.IntegerField(allow_null=True)
    since = serializers.CharField(allow_null=True)
    until = serializers.CharField(allow_null=True)


class LedgerPageSerializer(serializers.Serializer):
    filters = LedgerFiltersSerializer()
    totals = LedgerTotalsSerializer(help_text="Of every entry the filters select, not only this page's.")
    limit = serializers.IntegerField(help_text="The page size used.")
    entries = LedgerEntrySerializer(many=True, help_text="This page, oldest first (by at, then id).")
    next = serializers.URLField(allow_null=True, help_text="The next page's URL; null on the last page.")
    previous = serializers.URLField(allow_null=True, help_text="The previous page's URL; null on the first page.")


class LedgerView(APIView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    def initial(self, request, *args, **kwargs):
        fmt = request.query_params.get("format")
        if fmt is not None and fmt not in FORMATS:
            raise ValidationError({"format": [f"must be one of {', '.join(FORMATS)}"]})
        super().initial(request, *args, **kwargs)

    @extend_schema(responses=LedgerPageSerializer, parameters=[
        OpenApiParameter("job", int, description="Only this job's entries."),
        OpenApiParameter("worker", int, description="Only this worker's entries."),
        OpenApiParameter("from", str, description="Billed at or after (ISO 8601; UTC without an offset)."),
        OpenApiParameter("to", str, description="Billed before (ISO 8601)."),
        OpenApiParameter("format", str, enum=list(FORMATS), description="json (default) or csv (every entry)."),
        OpenApiParameter("limit", int, description=f"Entries per JSON page, 1 to {MAX_LIMIT} (default "
                         f"{settings.REST_FRAMEWORK['PAGE_SIZE']})."),
        OpenApiParameter("cursor", str, description="Where the page starts: from a page's next or previous URL.")])
    def get(self, request):
        """Billed intervals (worker, job, observed state, seconds, rate, amount, time) you may read: your jobs'
        (an invoice) and your workers' (a statement); totals exact and to the cent, per rate, job and worker."""
        found = filters(request.query_params)
        qs = ledger.entries(user=request.user, **found)
        if request.accepted_renderer.format == "csv":
            for paging in ("limit", "cursor"):
                if request.query_params.get(paging):
                    raise ValidationError({paging: ["the CSV is the whole statement, unpaged: leave out limit and "
                                                    "cursor, or ask for format=json"]})
            response = HttpResponse(ledger.as_csv(qs), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = 'attachment; filename="ledger.csv"'
            return response
        shown = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in found.items()}
        return Response({"filters": shown, "totals": ledger.totals(qs), **paged(request, qs)})
