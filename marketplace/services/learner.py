"""What the learner reports to the site: its announcement (``T_train``, relay address) and each step's metrics.
Its snapshot publications are broadcast's (``broadcast.snapshot_publish``)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from ..models import Job, JobMetric
from .base import learner_may_report, push_job_update


@transaction.atomic
def learner_announce(*, job: Job, t_train: float | None, relay_address: str | None = None) -> Job:
    job.learner_seen_at = timezone.now()
    fields = ["learner_seen_at"]
    if t_train is not None:
        job.learner_t_train = t_train
        fields.append("learner_t_train")
    if relay_address is not None:
        job.learner_relay = relay_address
        fields.append("learner_relay")
    job.save(update_fields=fields)
    return job


@transaction.atomic
def metrics_record(*, job: Job, step: int, values: dict[str, Any]) -> JobMetric:
    learner_may_report(job)
    known = {f.name for f in JobMetric._meta.get_fields()} - {"id", "job", "step", "created_at", "extra"}
    values = dict(values)
    extra = {**values.pop("extra", {}), **{k: v for k, v in values.items() if k not in known}}
    metric, _ = JobMetric.objects.update_or_create(
        job=job, step=step, defaults={**{k: v for k, v in values.items() if k in known}, "extra": extra},
    )
    Job.objects.filter(pk=job.pk).update(learner_step=step, learner_seen_at=timezone.now())
    job.refresh_from_db()
    push_job_update(job)
    return metric
