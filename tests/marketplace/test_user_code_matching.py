"""The user-code opt-in as a capability (docs/trust.md, "User code on workers"): the agent declares it in its hello,
the site stores it on the worker, and matching leaves a worker whose provider did not opt in out of a job that names
user code, before it is assigned: the plan preview counts it, the calibration phase and the scheduler skip it, an
activation of it is refused. A worker whose agent never said (older) is matched as before (it refuses itself)."""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from dataplane import messages as m
from dataplane.tasks import build_task
from echo2_site.asgi import application
from marketplace import services
from marketplace.core.matching import Needs, Offer, match, unmet
from marketplace.models import Activation, Worker, WorkerCalibration
from marketplace.reads import matching, scheduling
from marketplace.services.base import ServiceError

from . import factories

MODEL = factories.checkpoint_dir()
USER_TASK = {"name": "verifiers", "env": "owner_envs:load_environment", "size": 8}  # the owner's environment
USER_REWARD = {"name": "dataset", "data": {"digest": "a" * 64, "format": "jsonl"},  # shipped to the workers
               "reward": ["exact_match", {"function": "owner_judge:score", "scored_on": "worker"}]}


def test_the_core_leaves_out_only_workers_that_declared_no():
    needs = Needs(user_code=("owner_judge:score",))
    assert unmet(Offer(1, 1.0, 1.0, allow_user_code=False), needs) == "user code"
    assert unmet(Offer(1, 1.0, 1.0, allow_user_code=True), needs) is None
    assert unmet(Offer(1, 1.0, 1.0), needs) is None, "an older agent (never said) is matched as before"
    assert unmet(Offer(1, 1.0, 1.0, allow_user_code=False), Needs()) is None, "built-ins need no opt-in"
    matched = match([Offer(1, 1.0, 1.0, allow_user_code=False), Offer(2, 9.0, 1.0, allow_user_code=False),
                     Offer(3, 1.0, 1.0, allow_user_code=True)], Needs(user_code=("x:y",), max_price_per_hour=5.0))
    assert matched.line() == "1 of 3 match (user code 2)", "the first reason that applies: user code"


def test_a_task_says_which_of_its_code_is_the_owners_without_importing_it():
    assert build_task(USER_TASK).user_code() == ["owner_envs:load_environment"]
    assert build_task(USER_REWARD).user_code() == ["owner_judge:score"]
    assert build_task({"name": "arithmetic"}).user_code() == []
    assert build_task({**USER_REWARD, "reward": "exact_match"}).user_code() == []
    # scored on the learner (a user function's default): no worker runs it, every worker qualifies
    assert build_task({**USER_REWARD, "reward": ["exact_match", "owner_judge:score"]}).user_code() == []


def test_the_hello_carries_the_opt_in_and_an_older_hello_parses():
    hello = m.parse_agent_json('{"type": "hello", "agent_version": "1", "allow_user_code": true}')
    assert hello.allow_user_code is True
    assert m.parse_agent_json('{"type": "hello", "agent_version": "0.9"}').allow_user_code is None


pytestmark = [pytest.mark.usefixtures("redis_url")]


def online(provider, *, allow_user_code: bool | None, price: str = "1.0") -> Worker:
    worker, _ = factories.worker(provider, price=price)
    services.worker_connected(worker=worker, installed_version=None, allow_user_code=allow_user_code)
    WorkerCalibration.objects.create(worker=worker, model_dir=MODEL, task_name=USER_TASK["name"], throughput=5.0)
    worker.refresh_from_db()
    return worker


@pytest.mark.django_db
def test_a_later_hello_changes_it_and_one_without_it_keeps_it():
    worker = online(factories.user(), allow_user_code=True)
    services.worker_connected(worker=worker, installed_version=None)  # an older agent's hello: keeps it
    assert Worker.objects.get(pk=worker.pk).allow_user_code is True
    services.worker_connected(worker=worker, installed_version=None, allow_user_code=False)  # restarted without
    assert Worker.objects.get(pk=worker.pk).allow_user_code is False


@pytest.mark.django_db
def test_the_preview_counts_them_and_neither_calibration_nor_the_scheduler_assigns_them(
        settings, django_capture_on_commit_callbacks):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    provider, owner = factories.user(), factories.user()
    no = online(provider, allow_user_code=False, price="0.1")  # the cheapest: would be planned first
    yes = online(provider, allow_user_code=True, price="2.0")
    older = online(provider, allow_user_code=None, price="1.0")
    body = {"name": "own env", "model_dir": MODEL, "task": USER_TASK, "batch_trajectories": 8, "group_size": 4}
    spec = factories.parse_job_spec(body)
    req = scheduling.spec_plan(spec, user=owner, t_train=10.0)["requirements"]
    assert req["user_code"] == ["owner_envs:load_environment"]
    assert (req["qualify"], req["total"], req["excluded"]) == (2, 3, {"user code": 1})
    assert req["line"] == "2 of 3 match (user code 1)"

    job = factories.job(owner, task=USER_TASK)
    with django_capture_on_commit_callbacks(execute=True):
        services.job_start(job=job)  # calibration phase: every idle worker that qualifies
    assert sorted(job.activations.values_list("worker_id", flat=True)) == sorted([yes.pk, older.pk])
    job.learner_t_train = 1.0
    job.save()
    scheduling.job_replan(job, now=time.time())
    assert no.pk not in scheduling.job_pool(job).workers
    assert scheduling.job_plan(job)["requirements"]["excluded"] == {"user code": 1}
    assert not Activation.objects.filter(worker=no).exists()
    with pytest.raises(ServiceError, match="does not run job owners' code"):
        services.worker_activate(worker=no, job=job)  # the last check before an assignment is pushed
    assert matching.user_code_of(factories.job(owner).task) == ()
    services.worker_activate(worker=no, job=factories.job(owner))  # a built-in task: no opt-in needed


@pytest.mark.django_db
def test_the_launch_page_names_the_code_and_the_count():
    from ..frontend.test_pages import LAUNCH, signed_in

    provider = factories.user()
    online(provider, allow_user_code=False)
    online(provider, allow_user_code=True)
    body = {**LAUNCH, "task_name": "verifiers", "task_options": '{"env": "owner_envs:load_environment", "size": 8}',
            "t_train_s": 10, "preview": "1"}
    html = signed_in(factories.user()).post("/jobs/new/", body).content.decode()
    requirements = " ".join(html.split('id="plan-requirements"', 1)[1].split("</p>", 1)[0].split())
    assert "2 match (user code 1)" in requirements, requirements
    assert "runs your code (owner_envs:load_environment)" in requirements, requirements


@pytest.mark.django_db(transaction=True)
async def test_the_hello_over_the_socket_stores_it():
    """Async, so that the consumer's database thread closes its connection after it (tests/conftest.py)."""
    worker, key = await database_sync_to_async(factories.worker)(await database_sync_to_async(factories.user)())
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {key}".encode())])
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "agent_version": "test", "allow_user_code": False})
    assert (await comm.receive_json_from(timeout=5))["type"] == "welcome"
    await comm.disconnect()
    stored = await database_sync_to_async(lambda: Worker.objects.get(pk=worker.pk).allow_user_code)()
    assert stored is False


@pytest.mark.django_db
def test_the_provider_sees_what_the_site_believes():
    from rest_framework.test import APIClient

    provider = factories.user()
    worker = online(provider, allow_user_code=False)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(provider)}")
    assert api.get(f"/api/workers/{worker.pk}/").json()["allow_user_code"] is False
    never, _ = factories.worker(provider)
    assert api.get(f"/api/workers/{never.pk}/").json()["allow_user_code"] is None
