"""The rollout loop: an active worker leases prompt groups and returns its trajectories, which go to the
learner's stream (all or nothing per group)."""

from __future__ import annotations

from django.conf import settings

from dataplane import messages as m
from dataplane.records import RecordError, validate_record

from .. import stream
from ..models import Worker
from .base import running_activation as _running_activation


def prompts_lease(*, worker: Worker, job_id: int, groups: int) -> m.Lease | m.NoWork:
    _running_activation(worker, job_id)
    timeout = settings.ECHO2["LEASE_TIMEOUT_S"]
    leased = stream.lease_groups(job_id=job_id, worker_id=worker.pk, count=groups, timeout_s=timeout)
    if not leased:
        return m.NoWork(job_id=job_id, retry_after=0.2)
    return m.Lease(job_id=job_id, timeout=timeout, leases=[
        m.LeasedPrompt(lease_id=g.lease_id, group_id=g.group_id, prompt=g.prompt) for g in leased
    ])


def trajectories_submit(*, worker: Worker, job_id: int, lease_id: str, records: list[dict]) -> m.Accepted:
    """Validate a returned group and append it to the learner's stream, all or nothing.

    A group with any malformed record is refused whole (GRPO needs whole groups); its lease stays
    open, so the prompt is re-leased after the timeout and nothing is lost.
    """
    activation = _running_activation(worker, job_id)
    job = activation.job
    reasons: list[str] = []
    valid = []
    for i, raw in enumerate(records):
        try:
            rec = validate_record(raw, job_id=job_id, max_version=job.published_version)
        except RecordError as err:
            reasons.append(f"record {i}: {err}")
            continue
        if rec.lease_id != lease_id:
            reasons.append(f"record {i}: lease_id {rec.lease_id!r} differs from the batch's {lease_id!r}")
        elif valid and rec.group_id != valid[0].group_id:
            reasons.append(f"record {i}: group_id differs from the rest of the group")
        else:
            valid.append(rec)
    if not reasons and len(valid) != job.group_size:
        reasons.append(f"records: a group needs {job.group_size} records, got {len(valid)}")
    if not reasons:
        try:
            stream.submit_group(job_id=job_id, worker_id=worker.pk, lease_id=lease_id, group_id=valid[0].group_id,
                                records=[r.model_dump(mode="json") for r in valid])
        except stream.LeaseError as err:
            reasons.append(str(err))
    if reasons:
        stream.count(job_id, "rejected_records", len(records))
        return m.Accepted(job_id=job_id, lease_id=lease_id, accepted=0, rejected=len(records), reasons=reasons[:10])
    stream.count(job_id, "accepted_records", len(valid))
    return m.Accepted(job_id=job_id, lease_id=lease_id, accepted=len(valid), rejected=0)
