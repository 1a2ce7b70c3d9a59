"""``GET /api/ledger/``: the ledger's entries a person may read, with their totals, as JSON or CSV (docs/ledger.md).

``?job=ID&worker=ID&from=WHEN&to=WHEN&format=json|csv``: an owner gets the entries of its jobs (an invoice), a
provider those of its workers (a statement), staff all; ``from`` and ``to`` are ISO 8601 dates or times (UTC when
no offset is given), ``from`` included, ``to`` excluded.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder
from rest_framework.views import APIView

from .. import ledger

FORMATS = ("json", "csv")


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


class LedgerView(APIView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    def initial(self, request, *args, **kwargs):
        fmt = request.query_params.get("format")
        if fmt is not None and fmt not in FORMATS:
            raise ValidationError({"format": [f"must be one of {', '.join(FORMATS)}"]})
        super().initial(request, *args, **kwargs)

    @extend_schema(responses=dict, parameters=[
        OpenApiParameter("job", int, description="Only this job's entries."),
        OpenApiParameter("worker", int, description="Only this worker's entries."),
        OpenApiParameter("from", str, description="Billed at or after (ISO 8601; UTC without an offset)."),
        OpenApiParameter("to", str, description="Billed before (ISO 8601)."),
        OpenApiParameter("format", str, enum=list(FORMATS), description="json (default) or csv.")])
    def get(self, request):
        """Billed intervals (worker, job, observed state, seconds, rate, amount, time) you may read: your jobs'
        (an invoice) and your workers' (a statement); totals exact and to the cent, per rate, job and worker."""
        found = filters(request.query_params)
        qs = ledger.entries(user=request.user, **found)
        if request.accepted_renderer.format == "csv":
            response = HttpResponse(ledger.as_csv(qs), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = 'attachment; filename="ledger.csv"'
            return response
        shown = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in found.items()}
        return Response({"filters": shown, "totals": ledger.totals(qs),
                         "entries": [ledger.row(entry) for entry in qs]})
