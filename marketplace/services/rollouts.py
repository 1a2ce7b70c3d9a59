"""The rollout loop: an active worker leases prompt groups and returns each as one ``TrajectoryGroup``,
which goes to the learner's stream whole or not at all (``dataplane.replay``)."""

from __future__ import annotations

import time

from django.conf import settings

from dataplane import messages as m
from dataplane.records import RecordError, TrajectoryGroup
from dataplane.replay import LeaseError

from .. import selectors, stream, telemetry
from ..models import Worker
from .base import running_activation


def prompts_lease(*, worker: Worker, job_id: int, groups: int) -> m.Lease | m.NoWork:
    running_activation(worker, job_id)
    timeout = settings.ECHO2["LEASE_TIMEOUT_S"]
    leased = stream.replay(job_id).lease(worker_id=worker.pk, count=groups, timeout_s=timeout)
    if not leased:
        return m.NoWork(job_id=job_id, retry_after=0.2)
    return m.Lease(job_id=job_id, timeout=timeout, leases=[
        m.LeasedPrompt(lease_id=g.lease_id, group_id=g.group_id, prompt=g.prompt) for g in leased
    ])


def trajectories_submit(*, worker: Worker, group: TrajectoryGroup) -> m.Accepted:
    """Check a returned group against its job and lease and append it to the learner's stream, all or nothing.

    The group's schema and group rules were checked when its message was parsed (``TrajectoryGroup``).
    A group that does not fit is refused whole (GRPO needs whole groups); its lease stays open, so the
    prompt is re-leased after the timeout and nothing is lost.
    """
    job = running_activation(worker, group.job_id).job
    buffer = stream.replay(group.job_id)
    n = len(group.records)
    try:
        group.check_for_job(job_id=job.pk, group_size=job.group_size, max_version=job.published_version)
        buffer.return_group(worker_id=worker.pk, group=group)
    except (RecordError, LeaseError) as err:
        buffer.count("rejected_records", n)
        return m.Accepted(job_id=group.job_id, lease_id=group.lease_id, accepted=0, rejected=n, reasons=[str(err)])
    telemetry.record_accepted(worker.pk, job_id=job.pk, at=time.time(), records=n)  # the measured mu_i
    return m.Accepted(job_id=group.job_id, lease_id=group.lease_id, accepted=n, rejected=0)


def trajectories_malformed(*, worker: Worker, job_id: object, records: object) -> None:
    """Count the records of a ``trajectories`` message whose group failed its schema, when it names a job
    this worker is active in (the reply is the parse error)."""
    if not isinstance(job_id, int) or selectors.active_activation(worker=worker, job_id=job_id) is None:
        return
    stream.replay(job_id).count("rejected_records", len(records) if isinstance(records, list) else 1)
