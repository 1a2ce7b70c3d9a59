"""What the agent is doing, as its heartbeats report it: the site bills ``installing`` and ``generating`` only.

The state is derived from facts the session holds (an assignment, installs running, the rollout loop's
progress, its last crash), never set by hand in many places, so no code path can leave a stale state behind.
A change is reported at once, but no more often than ``MIN_REPORT_GAP_S``, so a flapping state cannot flood
the site (which rate-limits agents' messages); entering a billed state is the exception, reported at once always
(and before the work it bills goes out, ``AgentSession.report_state``): the site bills from the report on, so a
burst of work shorter than the gap would otherwise go unpaid. Leaving one still waits for the gap, which bounds
the reports of a flapping state to two per gap.
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.messages import BILLED_STATES, WorkerState

MIN_REPORT_GAP_S = 1.0
"""Least time between two heartbeats: a state change waits this long after the previous report, at most."""

MAX_REASON_CHARS = 200  # the Heartbeat's ``reason`` limit


@dataclass(frozen=True)
class Facts:
    """What the session knows about its work at one instant."""

    assigned: bool  # it holds an assignment (is active in a job)
    failure: str | None  # why the rollout loop last crashed, until it works again; None: healthy
    producing: bool  # the rollout loop holds leases or is generating/returning them (between lease requests too)
    loading: bool  # the job's engine is being built from its base snapshot (version 0)
    installing: bool  # a later snapshot of the job is being downloaded or loaded


def derive_state(facts: Facts) -> WorkerState:
    """The one state to report, by precedence: a crashed loop is ``failed`` until it works again, whatever else
    runs; producing rollouts beats a background install (both are billed); building the engine from the base
    is ``loading`` (not billed: the worker is not serving the job yet); anything else with an
    assignment is ``idle`` (no work from the site, waiting for a version it has asked for)."""
    if not facts.assigned:
        return "idle"
    if facts.failure is not None:
        return "failed"
    if facts.producing:
        return "generating"
    if facts.loading:
        return "loading"
    if facts.installing:
        return "installing"
    return "idle"


def crash_reason(err: BaseException) -> str:
    """A crash as one short line for the site: the exception's type and the start of its message."""
    text = f"{type(err).__name__}: {err}".strip().rstrip(":")
    first = text.splitlines()[0] if text else type(err).__name__
    return first if len(first) <= MAX_REASON_CHARS else first[: MAX_REASON_CHARS - 3] + "..."


def heartbeat_due(*, state: WorkerState, last_state: WorkerState | None, last_sent: float | None, now: float,
                  interval: float, min_gap: float = MIN_REPORT_GAP_S) -> bool:
    """Whether to send a heartbeat at ``now``: the first one at once, then every ``interval`` seconds, and
    sooner when the state changed, but never within ``min_gap`` of the previous one, unless the change enters a
    billed state (from one that is not)."""
    if last_sent is None:
        return True
    elapsed = now - last_sent
    if elapsed >= interval:
        return True
    if state != last_state and state in BILLED_STATES and last_state not in BILLED_STATES:
        return True
    return state != last_state and elapsed >= min_gap
