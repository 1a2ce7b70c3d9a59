"""A job's budget (``JobSpec.budget_usd``; the rules: ``marketplace.core.budget``; docs/ledger.md "Budgets"):
checked after every learner step and at every scheduler beat (workers are billed whether the learner steps or not),
paused at the cap with the reason, changed by the owner (a lower one applies at once)."""

from __future__ import annotations

import logging

from django.db import transaction

from dataplane.jobs import JobSpecError, parse_job_spec

from ..models import Job
from ..reads import ledger
from .base import ServiceError, push_job_update
from .jobs import job_pause, job_resume

log = logging.getLogger(__name__)

@transaction.atomic
def job_budget_check(*, job: Job) -> str:
    """Pause a running job that its next step would take past its budget; returns the reason ("" when it runs on).
    Called after each learner step (``learner.metrics_record``), at each scheduler beat before the job's re-plan
    (``tasks.replan_running_jobs``: a learner that does not step, stalled or not started, must not let its workers'
    bill run past the budget) and when the owner changes the budget."""
    if job.status != Job.Status.RUNNING or job.settings.budget_usd is None:
        return ""
    reason = ledger.budget_problem(job)
    if reason:
        log.info("job %s: %s", job.pk, reason)
        job_pause(job=job, reason=reason, code=Job.Reason.OVER_BUDGET)
    return reason


@transaction.atomic
def job_budget_set(*, job: Job, budget_usd: float | None) -> Job:
    """Change the job's budget (None: no cap). A job paused at its budget runs again when the new one leaves room
    for its next step; any other paused job stays paused."""
    job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
    if job.is_terminal:
        raise ServiceError(f"budget_usd: job is {job.status}; its budget no longer matters")
    try:
        spec = parse_job_spec(job.settings.model_dump(mode="json") | {"budget_usd": budget_usd})
    except JobSpecError as err:
        raise ServiceError(str(err)) from None
    job.spec = job.spec | {"budget_usd": spec.budget_usd}
    job.save(update_fields=["spec"])
    if job.status == Job.Status.RUNNING and job_budget_check(job=job):  # lowered below its spend: paused now
        return Job.objects.get(pk=job.pk)
    if job.status == Job.Status.PAUSED and job.reason_code == Job.Reason.OVER_BUDGET:
        problem = ledger.budget_problem(job)
        if not problem:
            return job_resume(job=job)
        job.status_reason = problem[:500]  # still short: the reason says so with the new budget's figures
        job.save(update_fields=["status_reason"])
    push_job_update(job)
    return job
