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


@pytest.mark.django_db(transaction=True)
async def test_live_socket_coalesces_bursts_and_sends_every_step_once(settings):
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator

    from echo2_site.asgi import application

    from .test_pages import session_headers

    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = await database_sync_to_async(factories.user)()
    job = await database_sync_to_async(factories.job)(owner)
    await database_sync_to_async(services.job_start)(job=job)
    record = database_sync_to_async(lambda step: services.metrics_record(
        job=Job.objects.get(pk=job.pk), step=step, values={"reward_mean": step / 10}))
    await record(1)  # before the page connects: it was rendered with step 1
    live = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/?since=1",
                                 headers=await database_sync_to_async(session_headers)(owner))
    assert (await live.connect())[0]

    await record(2)
    first = await live.receive_json_from(timeout=5)  # the first change goes out at once
    assert [m["step"] for m in first["metrics"]] == [2]
    for step in (3, 4, 5):  # a burst inside the interval: one more update, with all three steps
        await record(step)
    updates = [await live.receive_json_from(timeout=5)]
    while not await live.receive_nothing(timeout=1.2):
        updates.append(await live.receive_json_from(timeout=1))
    assert [m["step"] for u in updates for m in u["metrics"]] == [3, 4, 5]  # each step once, in order
    assert len(updates) < 3 and updates[-1]["summary"]["step"] == 5  # coalesced, ending on the current state
    await live.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_live_socket_refuses_what_a_browser_sends_and_a_bad_since_without_failing(redis_url):
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator

    from echo2_site.asgi import application

    from .test_pages import session_headers

    owner = await database_sync_to_async(factories.user)()
    job = await database_sync_to_async(factories.job)(owner)
    live = WebsocketCommunicator(application, f"/ws/jobs/{job.pk}/?since=%C2%B2",  # '²' passes str.isdigit
                                 headers=await database_sync_to_async(session_headers)(owner))
    assert (await live.connect())[0]
    await live.send_to(text_data="[" * 100_000 + "]" * 100_000)
    assert (await live.receive_json_from())["reason"] == "this socket only sends updates"
    await live.disconnect()


def test_the_owner_sees_the_model_download_and_nobody_else_does():
    owner = factories.user()
    job = factories.job(owner)
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    # a draft has published nothing: the form is there (job.js shows it once the learner serves a snapshot)
    assert f'<form class="hint" id="export" method="get" action="/api/jobs/{job.pk}/export/" hidden>' in page
    assert 'id="export-howto" data-key="export_line">Nothing to download yet' in page
    assert f'id="export-newest" href="/api/jobs/{job.pk}/export/"' in page
    staff = signed_in(factories.user(is_staff=True)).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="export"' not in staff  # staff see the job, but the weights are the owner's
