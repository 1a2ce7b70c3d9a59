"""One error shape for the whole API: ``{"detail": reason, "errors": {field: [reasons]}}``, never a 500 page.

``detail`` is the first reason (with how many more there are); ``errors`` holds every one, so a client that
sent three bad fields hears of all three at once."""

from __future__ import annotations

from django.db import OperationalError
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return _pool_exhausted(exc) or _conflicted(exc)
    data = response.data
    if isinstance(data, dict) and "detail" in data:
        return response
    if isinstance(data, dict):
        data = flat_errors(data)
        first_field, first_errors = next(iter(data.items()), ("request", ["invalid"]))
        reason = first_errors[0] if isinstance(first_errors, list) and first_errors else first_errors
        count = sum(len(v) if isinstance(v, list) else 1 for v in data.values())
        more = f" (and {count - 1} more in errors)" if count > 1 else ""
        response.data = {"detail": f"{first_field}: {reason}{more}", "errors": data}
    elif isinstance(data, list):
        response.data = {"detail": str(data[0]) if data else "invalid request", "errors": {"request": data}}
    return response


def _pool_exhausted(exc) -> Response | None:
    """A request that waited ``ECHO2_DB_POOL_TIMEOUT_S`` for one of its process's pooled database connections and got
    none: a 503 with ``Retry-After`` (the learner and scripts retry it), not a 500 page."""
    if not isinstance(exc, OperationalError) or type(exc.__cause__).__name__ != "PoolTimeout":
        return None
    return Response({"detail": "the site's database connections are all busy; retry in a moment"},
                    status=503, headers={"Retry-After": "1"})


def _conflicted(exc) -> Response | None:
    """PostgreSQL chose this request's transaction as the victim of a deadlock (or a serialization failure) with
    another that locks the same rows, say a cancel against a worker's heartbeat. Nothing of it was written, so the
    same request succeeds when sent again: a 503 with ``Retry-After`` that says so, not a 500."""
    if not isinstance(exc, OperationalError) or type(exc.__cause__).__name__ not in ("DeadlockDetected",
                                                                                     "SerializationFailure"):
        return None
    return Response({"detail": "this request met another changing the same records and nothing of it was written; "
                               "send it again"}, status=503, headers={"Retry-After": "1"})


def flat_errors(errors, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested errors (a list field's ``{0: {"worker_id": [...]}}``) as dotted paths to lists of strings
    (``{"audits.0.worker_id": [...]}``): the shape the schema documents for every 400."""
    if isinstance(errors, dict):
        out: dict[str, list[str]] = {}
        for key, value in errors.items():
            out.update(flat_errors(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(errors, list) and any(isinstance(e, dict | list) for e in errors):
        out = {}
        for index, value in enumerate(errors):
            if value:  # DRF lists an empty dict for each valid item
                out.update(flat_errors(value, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return {prefix or "request": [str(e) for e in errors] if isinstance(errors, list) else [str(errors)]}


@csrf_exempt  # nothing to protect: it only ever says 404
def not_found(request, *args, **kwargs) -> JsonResponse:
    """Any /api/ path no route matches (``/api/jobs/0.5/``): a JSON 404 like the API's own, not Django's page."""
    return JsonResponse({"detail": "Not found."}, status=404)


class Pagination(LimitOffsetPagination):
    """``?limit=&offset=`` with bounds: a limit of 10^21 or an offset past any table is a short page, not an
    integer overflow in the database."""

    max_limit = 1000
    max_offset = 2**31 - 1

    def get_offset(self, request) -> int:
        return min(super().get_offset(request), self.max_offset)
