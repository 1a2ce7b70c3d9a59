"""Who a request is: people with their API token (``Authorization: Token e2u_...``, stored hashed by knox),
agents with their worker key (``Authorization: Bearer e2w_...``).

The request then acts as the worker's provider, and ``request.auth`` is the Worker, so views can
restrict an agent to its own machine. An agent key is scoped: ``NotAgentKey`` (a default permission)
refuses it everywhere but the few endpoints the agent itself calls, which opt out (docs/trust.md).
"""

from __future__ import annotations

import re

from knox.auth import TokenAuthentication
from rest_framework import authentication, exceptions, permissions

from dataplane import credentials

from ..models import Job, Worker
from ..reads import selectors
from . import throttling

_TOKEN_SHAPE = re.compile(rb"[A-Za-z0-9_-]{20,200}")


class ApiTokenAuthentication(TokenAuthentication):
    """knox's token check (only the token's sha512 is stored), after a shape check: a token that cannot be one
    (a NUL, non-ASCII bytes) is refused as unknown before it reaches the database."""

    def authenticate(self, request):
        return throttling.guarded_authenticate(request, self.authenticate_header(request), super().authenticate)

    def authenticate_credentials(self, token: bytes):
        if not _TOKEN_SHAPE.fullmatch(token):
            raise exceptions.AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)


class AgentKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        return throttling.guarded_authenticate(request, self.keyword, self._authenticate)

    def _authenticate(self, request):
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


class NotAgentKey(permissions.BasePermission):
    """Refuses requests made with an agent key: it may report its own worker's calibrations (the agent's
    ``bench --report``) and speak the agent websocket, nothing else. A leaked agent key cannot register
    machines (minting keys), create or read jobs, or list the provider's workers."""

    message = ("an agent key may only report its own worker's calibrations and speak the agent websocket; "
               "this endpoint takes the provider's API token (Authorization: Token ...)")

    def has_permission(self, request, view) -> bool:
        return not isinstance(request.auth, Worker)


AGENT_KEY_ALLOWED = [permissions.IsAuthenticated]
"""The permissions of the endpoints an agent key may call (they drop ``NotAgentKey``)."""


def learner_problem(request, job: Job) -> str | None:
    """Why the request does not come from ``job``'s learner (None when it does): a learner proves itself with the
    job's learner credential (``dataplane.credentials.learner_token``, made from the transfer secret its
    announcement got) in the ``X-Echo2-Learner`` header, beside the owner's API token. What only the learner may
    report (audits of workers) needs it; an owner's token alone is not enough (docs/trust.md "Audits of work")."""
    try:
        credentials.verify_learner(job.transfer_secret, request.headers.get(credentials.LEARNER_HEADER),
                                   job_id=job.pk)
    except credentials.CredentialError as err:
        return str(err)
    return None
