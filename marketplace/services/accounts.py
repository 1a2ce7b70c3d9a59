"""People's API tokens (owners, learners, ``echo2-agent register``): knox stores only their hash, so a token is
seen once, in the reply that made it."""

from __future__ import annotations

from django.db import transaction
from knox.models import AuthToken


@transaction.atomic
def api_token_issue(*, user, replace: bool = True) -> str:
    """A new API token for ``user``, returned once (only its sha512 is kept). With ``replace`` (the provider page,
    ``manage.py drf_create_token -r``) every older token of the user stops working at once."""
    if replace:
        AuthToken.objects.filter(user=user).delete()
    _, token = AuthToken.objects.create(user=user, expiry=None)
    return token
