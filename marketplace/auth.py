"""Agents authenticate HTTP calls with their worker key (``Authorization: Bearer e2w_...``).

The request then acts as the worker's provider, and ``request.auth`` is the Worker, so views can
restrict an agent to its own machine.
"""

from __future__ import annotations

from rest_framework import authentication, exceptions

from . import selectors


class AgentKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid agent key header: expected 'Bearer <key>'.")
        worker = selectors.worker_by_key(header[1].decode(errors="replace"))
        if worker is None:
            raise exceptions.AuthenticationFailed("Unknown agent key.")
        return worker.provider.user, worker

    def authenticate_header(self, request) -> str:
        return self.keyword
