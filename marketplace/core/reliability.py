"""A worker's long-run reliability ``r_i`` in [0, 1]: how likely the work the scheduler plans with it gets done.

The paper's availability ``a_i`` (section 4.3) is the share of the last heartbeat window the worker was there: it
says nothing of a worker that is there now and gone in ten minutes, as it was every hour of the last week. ``r_i``
reads the long-run record the site kept itself (never what the worker says) and is the product of four
probabilities, each a smoothed rate so that a new worker starts near 1 and one bad event does not sink a good
record (docs/scheduling.md "Reliability"):

    stay     = exp(-H * ended / (connected_s + PRIOR_S))         it is still connected H seconds from now: sessions
               ended over the window, per second connected (a Poisson rate; a day connected is assumed before any
               record, so one early disconnect does not sink a new worker), H the horizon (about a publication)
    audits   = (passed + 2) / (passed + failed + 2)              an audited group is right
    relays   = (ok + 2) / (ok + broken + 2)                      a snapshot relayed through it arrives
    delivery = (kept + 2) / (kept + silent + 2)                  an activation returns groups (not released silent)

    r = stay * audits * relays * delivery

The scheduler weighs each worker's throughput by it, ``a_i * r_i * mu_i`` (``activation.Candidate``), so a flaky
cheap worker's unit cost ``c_i / (a_i r_i mu_i)`` is what it delivers, not what it promises; owners filter on it
(``requirements.min_reliability``). Pure: no Django, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRIOR_S = 86_400.0
"""Connected time assumed before any record: the rate of leaving is ended sessions per (connected + a day)."""
HORIZON_S = 300.0
"""The default horizon ``H``: a few publication periods of a typical job (``kappa * T_train``); one figure for every
job, so that the pages, the API, the scheduler and the simulator show the same number."""
PRIOR_EVENTS = 2
"""Good events assumed before any record in the three rates: a new worker's audits, relays and deliveries are 1."""


@dataclass(frozen=True)
class Record:
    """What the site saw of one worker over the window (7 days, or its life if younger)."""

    connected_s: float  # seconds its agent was connected (uptime x the window)
    sessions_ended: int  # connections that ended (closed or went silent) in the window
    audits_passed: int = 0
    audits_failed: int = 0
    relays_ok: int = 0  # snapshots received over a relay link (Worker.relay_successes)
    relays_broken: int = 0  # relay links it broke as parent, confirmed by the site (Worker.relay_failures)
    activations_kept: int = 0  # activations in the window that did not end silent
    activations_silent: int = 0  # released for returning nothing (billing.silent_reason)
    uptime: float | None = None  # shown beside the figure; its product with the window is connected_s


@dataclass(frozen=True)
class Reliability:
    value: float
    stay: float
    audits: float
    relays: float
    delivery: float
    horizon_s: float
    uptime: float | None

    def as_dict(self) -> dict:
        return {"value": round(self.value, 4), "parts": {
            "stay": round(self.stay, 4), "audits": round(self.audits, 4), "relays": round(self.relays, 4),
            "delivery": round(self.delivery, 4)}, "horizon_s": self.horizon_s,
            "uptime": None if self.uptime is None else round(self.uptime, 4)}


def _rate(good: int, bad: int) -> float:
    return (good + PRIOR_EVENTS) / (good + bad + PRIOR_EVENTS)


def reliability(record: Record, *, horizon_s: float) -> Reliability:
    """``r_i`` of ``record`` over the next ``horizon_s`` seconds (module docstring)."""
    if not (math.isfinite(horizon_s) and horizon_s >= 0):
        raise ValueError(f"horizon_s: {horizon_s!r} must be a number of seconds >= 0")
    counts = (record.sessions_ended, record.audits_passed, record.audits_failed, record.relays_ok,
              record.relays_broken, record.activations_kept, record.activations_silent)
    if any(count < 0 for count in counts) or not (math.isfinite(record.connected_s) and record.connected_s >= 0):
        raise ValueError(f"record: counts and connected_s must be >= 0, got {record}")
    hazard = record.sessions_ended / (record.connected_s + PRIOR_S)
    stay = math.exp(-horizon_s * hazard)
    audits = _rate(record.audits_passed, record.audits_failed)
    relays = _rate(record.relays_ok, record.relays_broken)
    delivery = _rate(record.activations_kept, record.activations_silent)
    return Reliability(stay * audits * relays * delivery, stay, audits, relays, delivery, horizon_s, record.uptime)
