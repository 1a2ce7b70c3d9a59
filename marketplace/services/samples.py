"""Samples a learner reported with a step (dataplane/samples.py): stored, the job's newest
``SAMPLES_KEPT_PER_JOB`` kept. Called by ``learner.metrics_record`` inside its transaction."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from dataplane.samples import SAMPLES_KEPT_PER_JOB

from ..models import Job, JobSample


@transaction.atomic
def samples_record(*, job: Job, step: int, rows: list[dict[str, Any]]) -> int:
    """Store ``rows`` for ``step`` (a report sent again replaces its step's rows) and drop the job's older ones past
    the newest ``SAMPLES_KEPT_PER_JOB``. Returns how many are kept."""
    if not rows:
        return JobSample.objects.filter(job=job).count()
    JobSample.objects.filter(job=job, step=step).delete()
    JobSample.objects.bulk_create([JobSample(job=job, step=step, version=row["version"], worker=row["worker"],
                                             reward=row["reward"], prompt=row["prompt"], completion=row["completion"])
                                   for row in rows])
    newest_first = JobSample.objects.filter(job=job).order_by("-step", "-id").values_list("id", flat=True)
    if older := list(newest_first[SAMPLES_KEPT_PER_JOB:]):
        JobSample.objects.filter(id__in=older).delete()
    return JobSample.objects.filter(job=job).count()
