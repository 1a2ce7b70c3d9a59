"""Writes, by sub-domain, and every push to agents and dashboards (sent after the transaction commits).

Every public service that writes runs in its own transaction (``transaction.atomic``; inside a caller's
transaction it joins it), and its pushes and enqueued tasks leave only once that commits.

- ``base``: ``ServiceError``, channel groups, the push helpers, tasks enqueued by name, shared checks.
- ``workers``: register, calibrate, activate, release.
- ``presence``: the agent's connection: hello, heartbeat (kept in Redis, folded), close (queued, recorded), expire
  the silent.
- ``hellos``: many agents' hellos in one transaction (a fleet's reconnect), each answered as ``presence``'s alone.
- ``billing``: billed time of activations from the states agents report (``marketplace.core.billing``: the rules).
- ``jobs``: create, start, pause, resume, finish; the calibration phase and the scheduler's decisions applied.
- ``rollouts``: prompt leases (and their early return) and trajectory submissions, whole or in parts, checked
  against the worker's running job read once (``RunningJob``, held by the agent socket).
- ``broadcast``: snapshot publication, chain plans and each worker's place in them.
- ``installs``: install reports, many workers' in one transaction, and the relay bandwidth they measure.
- ``repair``: relay failures reported by children, and the chain plan repaired around them (and workers gone).
- ``learner``: the learner's announcement, heartbeat and step metrics; jobs whose learner went silent.
- ``audits``: the learner's audits of workers' records, reported with its steps; repeat failures suspended.
  ``audit_verify`` checks each failure against the group the site stored; ``audit_texts`` decodes text failures
  with the job's tokenizer, in a Celery task after the report.
- ``accounts``: people's API tokens (stored hashed, shown once).
- ``budgets``: a job's budget checked after each learner step (paused at the cap) and raised by its owner.
- ``controls``: a worker's price (from now on), pause, resume, removal; a job archived or deleted (docs/ledger.md).

Siblings import one way only: ``base`` imports none of them; ``broadcast`` and ``rollouts`` import ``base``;
``installs`` imports ``rollouts`` (the shared read of a running job);
``billing`` imports none; ``repair`` imports ``broadcast`` (its messages); ``workers`` imports ``broadcast``
(assignments) and ``billing``; ``presence`` imports ``workers``, ``broadcast``, ``repair`` and ``billing``;
``hellos`` imports ``presence`` and ``broadcast``; ``jobs``,
``audits`` (suspensions) and ``learner`` (stalled jobs) import ``workers``; ``audits`` imports ``billing``
(credits for failed work); ``audit_texts`` imports ``audits``; ``learner`` imports ``audits`` and
``budgets``, which imports ``jobs``; ``controls`` imports ``workers`` and ``billing``.
None imports ``marketplace.tasks``: tasks call services,
services enqueue tasks by name (``base.enqueue_task``).
The public names are re-exported here, so callers write ``services.job_start(...)``.
"""

from .accounts import api_token_issue
from .audit_texts import audit_texts_decode
from .audits import groups_accepted_flush
from .base import ServiceError, job_group, worker_group
from .broadcast import broadcast_plan, snapshot_publish, snapshot_request
from .budgets import job_budget_check, job_budget_set
from .controls import job_archive, job_delete, worker_pause, worker_price_set, worker_remove, worker_resume
from .hellos import Hello, workers_connected
from .installs import InstallReport, snapshot_installed, snapshots_installed
from .jobs import (
    job_activate_idle_workers,
    job_create,
    job_finish,
    job_pause,
    job_replan_apply,
    job_resume,
    job_start,
)
from .learner import jobs_stall_silent_learners, learner_announce, learner_streams_open, metrics_record
from .presence import (
    expire_silent_workers,
    worker_closes_record,
    worker_connected,
    worker_disconnected,
    worker_heartbeat,
    worker_heartbeat_apply,
    worker_heartbeat_record,
    worker_heartbeats_fold,
    worker_heartbeats_record_async,
    worker_socket_closed,
)
from .repair import relay_failed
from .rollouts import (
    JobAtWork,
    RunningJob,
    groups_submit,
    job_at_work,
    lease_return,
    prompts_lease,
    rollout_async,
    running_job,
    submitted_again,
    trajectories_malformed,
    trajectories_part_submit,
    trajectories_submit,
    worker_earned_usd,
    worker_earned_usd_held,
    worker_earned_usd_known,
    workers_earned_usd,
)
from .workers import (
    worker_activate,
    worker_calibrate,
    worker_register,
    worker_release,
    workers_activate,
    workers_release,
)

__all__ = [
    "ServiceError", "api_token_issue", "audit_texts_decode",
    "broadcast_plan", "expire_silent_workers", "job_activate_idle_workers", "job_create",
    "groups_accepted_flush", "groups_submit", "job_finish", "job_group", "job_pause", "lease_return",
    "job_replan_apply", "job_resume", "job_start",
    "jobs_stall_silent_learners", "learner_announce", "learner_streams_open", "metrics_record", "prompts_lease",
    "relay_failed", "rollout_async",
    "JobAtWork", "RunningJob", "running_job", "submitted_again", "job_at_work",
    "Hello", "workers_connected", "InstallReport", "snapshot_installed", "snapshots_installed",
    "snapshot_publish", "snapshot_request", "trajectories_malformed", "trajectories_part_submit",
    "trajectories_submit",
    "worker_activate", "worker_calibrate", "worker_connected", "worker_disconnected", "worker_group",
    "worker_heartbeat", "worker_register", "worker_release", "workers_activate", "workers_release",
    "worker_closes_record", "worker_heartbeat_apply", "worker_heartbeat_record", "worker_heartbeats_record_async",
    "worker_heartbeats_fold",
    "worker_socket_closed",
    "job_archive", "job_budget_check", "job_budget_set", "job_delete", "worker_pause", "worker_price_set",
    "worker_remove", "worker_resume", "worker_earned_usd", "worker_earned_usd_held", "worker_earned_usd_known",
    "workers_earned_usd",
]
