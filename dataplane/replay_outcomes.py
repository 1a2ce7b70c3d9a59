"""What the replay buffer's scripts answer, and what a caller hands them to keep: plain values, no Redis
(``dataplane.replay`` runs the scripts; the site words the answers, ``marketplace.services.rollouts``)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from .replay_scripts import RETURN_ERRORS
from .stored import text


class StoredId(str):
    """A returned group's trajectory stream id; ``resent``: it had been stored by an earlier return of the group."""

    resent: bool = False


class LeaseError(ValueError):
    """A returned group that no open lease of this worker can take; ``str(err)`` is the reason."""


def return_error(code: str, lease_id: str) -> str:
    """The reason of a return script's error ``code`` (``replay_scripts.RETURN_ERRORS``) for lease ``lease_id``."""
    return f"lease_id: {lease_id!r} is not a lease" if code == "badid" else RETURN_ERRORS[code]


def returned(result: str) -> StoredId | LeaseError:
    """A return script's answer for one group: its stored id (``resent`` when stored by an earlier return), or the
    error (``str``: the code's reason, lease id left out: see :func:`return_error`)."""
    if result in RETURN_ERRORS:
        return LeaseError(result)
    stored = StoredId(result.removeprefix("resent "))
    stored.resent = result.startswith("resent ")
    return stored


@dataclass(frozen=True)
class LeasedPrompt:
    lease_id: str
    group_id: str
    prompt: str


@dataclass(frozen=True)
class TimedEvent:
    """A member added to a time-sorted set (score ``at``), dropping members older than ``keep_after`` and keeping
    the key ``ttl_s`` seconds: what a caller counts alongside an accepted group. The key and the member's layout
    are the caller's (``marketplace.infra.telemetry``); this module only writes them."""

    key: str
    member: str
    at: float
    keep_after: float
    ttl_s: int


@dataclass(frozen=True)
class KeptVerdict:
    """Where :meth:`ReplayBuffer.submit` keeps a request's outcome, so that the same request sent again (its reply was
    late or lost) is answered with it, not run again. The key and ``context`` are the caller's
    (``marketplace.infra.verdicts``): ``context`` is what the caller knew before the script (a text without a
    newline), kept and handed back with the outcome. A resend answered from it counts one in hash ``resent_key``,
    field ``resent_field``."""

    key: str
    ttl_s: int
    context: str
    resent_key: str
    resent_field: str


@dataclass(frozen=True)
class Submitted:
    """What :meth:`ReplayBuffer.submit` did, or (``held``) what the first sending of the same request did."""

    returns: list[StoredId | LeaseError]  # per group given, in order
    leased: list[LeasedPrompt]
    context: str  # the caller's part: as given now, or as the first sending gave it
    held: bool = False


def kept_outcome(kept: str | bytes, *, held: bool = True) -> Submitted:
    """The outcome :meth:`ReplayBuffer.submit` keeps under a verdict key (the caller's context, a newline, then the
    script's JSON), read back."""
    context, _, outcome = text(kept).partition("\n")
    results, leases = orjson.loads(outcome)
    return Submitted(returns=[returned(r) for r in results or []],
                     leased=[LeasedPrompt(lease_id=i, group_id=g, prompt=p) for i, g, p in leases or []],
                     context=context, held=held)
