"""A learner whose disk is full says so (learner/diskroom.py): its step reports carry "snapshot store full: N MB
needed", which the job page and ``echo2 job status`` show until a report without it comes."""

from __future__ import annotations

import pytest

from echo2_cli.render import summary_rows
from marketplace import services
from marketplace.models import Job
from marketplace.reads import selectors

from ..marketplace import factories
from .test_pages import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]
FULL = "snapshot store full: 840 MB needed, 12 MB free in /var/echo2/snapshots/job3"


def test_the_job_page_and_the_cli_say_the_learners_disk_is_full_until_it_is_not():
    owner = factories.user()
    job = factories.job(owner)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    services.metrics_record(job=Job.objects.get(pk=job.pk), step=1, values={"reward_mean": 0.5,
                                                                           "extra": {"storage": FULL}})
    summary = selectors.job_summary(Job.objects.get(pk=job.pk))
    assert summary["learner_storage_line"] == FULL
    assert ("learner storage", FULL) in summary_rows(summary)
    assert FULL in signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()

    services.metrics_record(job=Job.objects.get(pk=job.pk), step=2, values={"reward_mean": 0.5})  # room again
    summary = selectors.job_summary(Job.objects.get(pk=job.pk))
    assert summary["learner_storage_line"] == "ok"
    assert all(label != "learner storage" for label, _ in summary_rows(summary))
    assert FULL not in signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
