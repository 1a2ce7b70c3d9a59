"""The job page's controls: each shows only in the states it applies to, and a verb the state does not
allow comes back as a message instead of an error page."""

from __future__ import annotations

import pytest

from marketplace import services
from marketplace.models import Job

from ..marketplace import factories
from .test_pages import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def visible_controls(page: str) -> set[str]:
    """Verbs whose form is rendered without the ``hidden`` attribute."""
    out = set()
    for verb in ("start", "pause", "resume", "cancel"):
        tag = page.split(f'id="{verb}-button"')[0].rsplit("<form", 1)[1]
        if " hidden" not in tag:
            out.add(verb)
    return out


def test_controls_follow_the_status_and_a_refused_verb_says_why(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    job = factories.job(owner)
    client = signed_in(owner)
    assert visible_controls(client.get(f"/jobs/{job.pk}/").content.decode()) == {"start", "cancel"}

    client.post(f"/jobs/{job.pk}/start/")
    assert visible_controls(client.get(f"/jobs/{job.pk}/").content.decode()) == {"pause", "cancel"}
    page = client.post(f"/jobs/{job.pk}/pause/", follow=True).content.decode()
    assert Job.objects.get(pk=job.pk).status == "paused"
    assert visible_controls(page) == {"resume", "cancel"} and f"paused by {owner.username}" in page

    page = client.post(f"/jobs/{job.pk}/pause/", follow=True).content.decode()
    assert "Cannot pause: job is paused; only a running job can be paused" in page
    client.post(f"/jobs/{job.pk}/resume/")
    assert Job.objects.get(pk=job.pk).status == "running"
    services.job_finish(job=Job.objects.get(pk=job.pk), status="cancelled")
    assert visible_controls(client.get(f"/jobs/{job.pk}/").content.decode()) == set()
    assert signed_in(factories.user()).post(f"/jobs/{job.pk}/pause/").status_code == 404
