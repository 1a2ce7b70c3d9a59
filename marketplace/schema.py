"""OpenAPI descriptions of our authentication schemes (drf-spectacular extensions; imported in apps.ready)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class AgentKeyScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.auth.AgentKeyAuthentication"
    name = "agentKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "e2w_...",
                "description": "A worker's agent key (shown once at registration). It may only report the "
                               "worker's own calibrations; everything else takes the provider's API token."}


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "marketplace.auth.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "A person's API token: `Token e2u_...` (shown once when made, on the provider page "
                               "or by `manage.py drf_create_token`; only its hash is stored)."}
