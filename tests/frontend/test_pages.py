"""Dashboard pages and the live job socket: same permissions as the API, updates without reload."""

from __future__ import annotations

import re

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from echo2_site.asgi import application
from marketplace import services
from marketplace.models import Job

from ..marketplace import factories


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_pages_need_sign_in_and_show_only_own_jobs():
    owner, other = factories.user("owner"), factories.user("other")
    job = factories.job(owner, name="visible-to-owner")
    assert Client().get("/").status_code == 302
    assert b"visible-to-owner" in signed_in(owner).get("/").content
    assert b"visible-to-owner" not in signed_in(other).get("/").content
    assert signed_in(other).get(f"/jobs/{job.pk}/").status_code == 404
    page = signed_in(owner).get(f"/jobs/{job.pk}/")
    assert page.status_code == 200 and b'id="reward-curve"' in page.content


@pytest.mark.django_db
def test_provider_page_lists_own_workers_and_the_register_command():
    provider = factories.user("prov")
    factories.worker(provider, name="my-rig")
    factories.worker(factories.user(), name="their-rig")
    page = signed_in(provider).get("/provider/").content.decode()
    assert "my-rig" in page and "their-rig" not in page
    assert "echo2-agent register --server http://testserver/" in page


def session_headers(user) -> list[tuple[bytes, bytes]]:
    """Headers of a signed-in browser on this site: its Origin and its session cookie."""
    client = Client()
    client.force_login(user)
    return [(b"origin", b"http://localhost"), (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url")
async def test_job_page_socket_pushes_each_learner_step(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner, other = await database_sync_to_async(factories.user)(), await database_sync_to_async(factories.user)()
    job = await database_sync_to_async(factories.job)(owner)
    await database_sync_to_async(services.job_start)(job=job)
    path = f"/ws/jobs/{job.pk}/"

    for headers in ([(b"origin", b"http://localhost")], await database_sync_to_async(session_headers)(other)):
        refused = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await refused.connect()
        assert not connected and code == 4403  # anonymous, then someone else's job

    foreign = WebsocketCommunicator(application, path, headers=[(b"origin", b"http://evil.example")])
    assert (await foreign.connect())[0] is False  # origin not in ALLOWED_HOSTS

    live = WebsocketCommunicator(application, path, headers=await database_sync_to_async(session_headers)(owner))
    assert (await live.connect())[0]
    fresh = await database_sync_to_async(Job.objects.get)(pk=job.pk)
    await database_sync_to_async(services.metrics_record)(job=fresh, step=1, values={"reward_mean": 0.25})
    update = await live.receive_json_from(timeout=5)
    assert update["type"] == "update" and update["summary"]["step"] == 1 and update["summary"]["reward_mean"] == 0.25
    await live.disconnect()


LAUNCH = {"name": "from the form", "model_dir": factories.checkpoint_dir(), "task_name": "arithmetic",
          "task_options": '{"max_operand": 4}', "staleness": 3, "batch_trajectories": 16, "group_size": 4,
          "gamma": 1.1, "learner_uplink_mbps": 100, "learning_rate": 0.001, "clip_eps": 0.2, "max_steps": 10,
          "max_new_tokens": 2, "temperature": 1.0, "top_p": 1.0, "seed": 0}


@pytest.mark.django_db
def test_launch_form_creates_a_job_with_every_setting():
    owner = factories.user()
    page = signed_in(owner).get("/jobs/new/").content.decode()
    assert 'name="staleness"' in page and 'value="3"' in page and "Capacity plan" in page
    reply = signed_in(owner).post("/jobs/new/", LAUNCH)
    job = Job.objects.get()
    assert reply.status_code == 302 and reply["Location"] == f"/jobs/{job.pk}/"
    assert (job.status, job.settings.kappa, job.task, job.settings.learner_uplink_bps) == (
        "draft", 2, {"name": "arithmetic", "max_operand": 4, "ops": "+", "modulus": 10}, 12_500_000)
    assert job.settings.prompt_format.model_dump() == {"chat": False, "system_prompt": None}  # the default: plain


@pytest.mark.django_db
def test_launch_form_sets_the_prompt_format():
    owner = factories.user()
    assert 'name="prompt_format_system_prompt"' in signed_in(owner).get("/jobs/new/").content.decode()
    signed_in(owner).post("/jobs/new/", {**LAUNCH, "prompt_format_chat": "on",
                                         "prompt_format_system_prompt": "Answer with the number only."})
    assert Job.objects.get().settings.prompt_format.model_dump() == {"chat": True,
                                                                     "system_prompt": "Answer with the number only."}


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "field", "message"), [
    ({"staleness": 1}, "staleness", "greater than or equal to 2"),
    ({"staleness": 3, "kappa": 3}, "kappa", "must be &lt; staleness"),
    ({"task_name": "nope"}, "task_name", "Select a valid choice"),
    ({"task_options": '{"max_operand": -1}'}, "task_options", "max_operand"),
    ({"task_options": "{oops"}, "task_options", "not valid JSON"),
    ({"batch_trajectories": 10}, "batch_trajectories", "multiple of group_size"),
    ({"model_dir": "meta-llama/Llama-3-8B"}, "model_dir", "is not an absolute path"),
    ({"model_dir": "/no/such/checkpoint"}, "model_dir", "no directory /no/such/checkpoint"),
    ({"prompt_format_system_prompt": "be brief"}, "prompt_format_system_prompt", "needs chat: true"),
])
def test_launch_form_shows_the_error_next_to_the_field(change, field, message):
    reply = signed_in(factories.user()).post("/jobs/new/", {**LAUNCH, **change})
    assert reply.status_code == 200 and Job.objects.count() == 0
    html = reply.content.decode()
    assert f'id="error-{field}"' in html and message in html.split(f'id="error-{field}"')[1].split("</span>")[0]


@pytest.mark.django_db
def test_marketplace_view_is_staff_only_and_sorted_by_unit_cost():
    provider = factories.user()
    cheap, _ = factories.worker(provider, price="0.30", name="cheap-per-unit")
    dear, _ = factories.worker(provider, price="0.20", name="dear-per-unit")
    from marketplace.models import Worker

    Worker.objects.filter(pk=cheap.pk).update(throughput=10.0)  # rho 0.03
    Worker.objects.filter(pk=dear.pk).update(throughput=1.0)  # rho 0.2
    assert signed_in(provider).get("/marketplace/").status_code == 403
    page = signed_in(factories.user(is_staff=True)).get("/marketplace/").content.decode()
    assert page.index("cheap-per-unit") < page.index("dear-per-unit")


@pytest.mark.django_db
def test_launch_form_shows_every_error_at_once_and_focuses_the_first():
    """A blank name no longer hides the spec's errors; the first field in error has the focus; every
    aria-describedby names ids the page has."""
    reply = signed_in(factories.user()).post("/jobs/new/", {**LAUNCH, "name": "", "staleness": 1,
                                                             "model_dir": "relative/dir"})
    html = reply.content.decode()
    assert reply.status_code == 200 and Job.objects.count() == 0
    assert {"error-name", "error-staleness", "error-model_dir"} <= set(re.findall(r'id="(error-[\w]+)"', html))
    focused = re.findall(r'<(?:input|select|textarea)[^>]*\bautofocus\b[^>]*>', html)
    assert len(focused) == 1 and 'name="name"' in focused[0]
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    described = {i for refs in re.findall(r'aria-describedby="([^"]+)"', html) for i in refs.split()}
    assert described and described <= ids, described - ids
