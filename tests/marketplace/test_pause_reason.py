"""The learner pauses a job with a reason (learner/scoring.py: the owner's reward functions failing too often): the
job's status says it, prefixed so that the owner knows who paused it; a pause without one keeps its old wording."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from marketplace import services
from marketplace.models import Job

from . import factories


@pytest.mark.django_db
def test_a_pause_with_a_reason_shows_it_as_the_jobs_status() -> None:
    owner = factories.user()
    job = factories.job(owner)
    services.job_start(job=job)
    api = APIClient()
    api.force_authenticate(owner)

    reason = "reward functions failed on 62% of the last 200 records (above 50%); last: m:f: KeyError: 'answer'"
    answer = api.post(f"/api/jobs/{job.pk}/pause/", {"reason": reason}, format="json")

    assert answer.status_code == 200, answer.content
    assert Job.objects.get(pk=job.pk).status_reason == f"paused by the learner: {reason}"
    services.job_resume(job=Job.objects.get(pk=job.pk))
    api.post(f"/api/jobs/{job.pk}/pause/")
    assert Job.objects.get(pk=job.pk).status_reason == f"paused by {owner.get_username()}"
