"""One error shape for the whole API: ``{"detail": reason, "errors": {field: [reasons]}}``, never a 500 page."""

from __future__ import annotations

from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and "detail" in data:
        return response
    if isinstance(data, dict):
        first_field, first_errors = next(iter(data.items()), ("request", ["invalid"]))
        reason = first_errors[0] if isinstance(first_errors, list) and first_errors else first_errors
        response.data = {"detail": f"{first_field}: {reason}", "errors": data}
    elif isinstance(data, list):
        response.data = {"detail": str(data[0]) if data else "invalid request", "errors": {"request": data}}
    return response
