"""The site's key for sealing the groups it appends to a job's stream (``dataplane.seal``; docs/trust.md "Audits the
site checks").

Derived from ``SECRET_KEY`` with a purpose of its own, so it is as private as the secret that signs sessions and is
never given to a learner or an agent. A rotated secret (Django's ``SECRET_KEY_FALLBACKS``) still verifies the groups
sealed under it: the audit hold keeps a failed group up to a week, longer than a rotation should cost its evidence.
"""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings

from dataplane.seal import seal_key

PURPOSE = "echo2.marketplace.group-seal"


@lru_cache(maxsize=8)
def _derive(secret: str) -> bytes:
    return seal_key(secret, PURPOSE)


def signing_key() -> bytes:
    """The key new groups are sealed with (the current ``SECRET_KEY``'s)."""
    return _derive(settings.SECRET_KEY)


def verifying_keys() -> list[bytes]:
    """Every key a stored group's seal may be under: the current one, then each of ``SECRET_KEY_FALLBACKS``."""
    return [_derive(secret) for secret in (settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", ()))]
