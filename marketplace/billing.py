"""Billing only useful work: which of an activation's time is paid for (docs/faults.md, "Billing only useful work").

An agent reports its state in every heartbeat (``dataplane.messages.WorkerState``). A state holds from the report
that carried it until the next report; the site bills the interval between two reports when the earlier one was
``installing`` or ``generating``. The paper's cost model pays a worker while it serves the job (section 3.4);
issue 13 narrows "serves" to installing snapshots and generating rollouts, so ``loading`` (building the engine
from the job's base, version 0, which happens once per activation), ``idle`` (waiting for work or a version) and
``failed`` (a crashed rollout loop, being restarted) are free. An interval longer than the worker timeout is
not billed at all: the site does not know what the worker did while it was silent.

Plain functions over plain values; the database side is ``services.billing``.
"""

from __future__ import annotations

from dataplane.messages import BILLED_STATES as BILLABLE_STATES


def billable_seconds(*, state: str, since: float, until: float, gap_limit_s: float) -> float:
    """Seconds of ``[since, until]`` (Unix times) to bill, the worker having reported ``state`` at ``since`` and
    nothing since: all of it in a billable state, nothing otherwise, nothing for a gap beyond ``gap_limit_s``
    (nor for a report older than the previous one: time never runs backwards on the bill)."""
    span = until - since
    if state not in BILLABLE_STATES or span <= 0 or span > gap_limit_s:
        return 0.0
    return span


def effective_state(*, reported: str, reported_job_id: int | None, job_id: int) -> str:
    """The state the activation of ``job_id`` is in, from a heartbeat about ``reported_job_id``: an agent that
    has not yet taken the assignment (or still speaks of another job) is not working for this job: ``idle``."""
    return reported if reported_job_id == job_id else "idle"


def failing_too_long(*, state: str, since: float, now: float, limit_s: float) -> bool:
    """Whether an activation has been ``failed`` (its rollout loop crashing, restarted, crashing again) since
    ``since`` for ``limit_s`` or longer: then the site releases the worker so the scheduler can pick another."""
    return state == "failed" and now - since >= limit_s


def cost_usd(*, price_per_hour: float, billed_seconds: float) -> float:
    """USD for ``billed_seconds`` at ``price_per_hour`` (the activation's frozen price ``c_i``)."""
    return price_per_hour * max(0.0, billed_seconds) / 3600.0
