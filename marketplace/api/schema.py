"""The OpenAPI schema: our authentication schemes (drf-spectacular extensions; imported in apps.ready) and the
error responses every operation can give, in the one shape of ``api_errors.exception_handler``."""

from __future__ import annotations

from drf_spectacular import openapi
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="The reason; for a bad field 'field: reason' (the first one, "
                                   "then '(and N more in errors)' when there are more).")
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()), required=False,
                                   help_text="Every reason, by field (a dotted path inside JSON objects).")


ERRORS = {
    "400": "Bad input: `detail` names the field and says why.",
    "401": "No credentials, or wrong ones.",
    "403": "Not allowed with these credentials (an agent key outside the agent's own endpoints).",
    "404": "No such object, or not yours.",
    "429": "Too many requests (or failed credentials) lately; `Retry-After` says when to try again.",
}


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's schema plus the error responses: 401, 403 and 429 everywhere; 400 where a body or a query
    parameter is read; 404 wherever the path names an object."""

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        codes = ["401", "403", "429"]
        if self.method in ("POST", "PUT", "PATCH") or self.get_override_parameters():
            codes.append("400")
        if "{" in self.path:
            codes.append("404")
        for code in codes:
            error = OpenApiResponse(ErrorSerializer, description=ERRORS[code])
            responses.setdefault(code, self._get_response_for_code(error, code, direction=direction))
        return dict(sorted(responses.items()))


class AgentKeyScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.api.auth.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "e2w_...",
                "description": "A worker's agent key (shown once at registration). It may only report the "
                               "worker's own calibrations; everything else takes the provider's API token."}


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.api.auth.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "A person's API token: `Token e2u_...` (shown once when made, on the provider page "
                               "or by `manage.py drf_create_token`; only its hash is stored)."}
