"""The owner's reward functions on the site's side (docs/rewards.md, docs/trust.md "User code on workers"): what they
did wrong on the workers is summed per job from the groups the site accepts and shown with the job; a worker that
refuses a job's user code is released at once with its reason and not planned for that job again."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from marketplace import services
from marketplace.models import Activation, Job
from marketplace.reads import scheduling, selectors

from . import factories
from .test_agent_socket import connect, group, record, started_with
from .test_billing import settings_eager
from .test_record_checks import leased_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]

__all__ = ["settings_eager"]  # the fixture, shared with test_billing

ERRORS = {"errors": 3, "non_finite": 1, "last_error": "rewards:judge: RuntimeError: the judge is down"}


async def summary(job_id: int) -> dict:
    return await database_sync_to_async(lambda: selectors.job_summary(Job.objects.get(pk=job_id)))()


async def test_reward_errors_of_accepted_groups_are_summed_per_job_and_shown_with_it(settings_eager, redis_client):
    job, comm, lease = await leased_job(redis_client)
    assert (await summary(job.pk))["reward_errors_line"] == "0"
    refused = group(job.pk, lease, [record(job.pk, lease, reward=5.0)] * 4)  # outside the task's range: refused
    refused["group"]["reward_errors"] = ERRORS
    await comm.send_json_to(refused)
    assert (await comm.receive_json_from())["accepted"] == 0
    assert (await summary(job.pk))["reward_errors"]["errors"] == 0  # a refused group counts nothing

    good = group(job.pk, lease, [record(job.pk, lease, reward=0.0)] * 4)
    good["group"]["reward_errors"] = ERRORS
    await comm.send_json_to(good)
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.send_json_to(good)  # the same group again (a resend): the stored group, its errors not counted twice
    assert (await comm.receive_json_from())["accepted"] == 4
    figures = await summary(job.pk)
    assert figures["reward_errors"] == {"errors": 3, "non_finite": 1, "last": ERRORS["last_error"]}
    assert figures["reward_errors_line"] == "4 (1 non-finite; last: rewards:judge: RuntimeError: the judge is down)"

    owner = await database_sync_to_async(lambda: Job.objects.get(pk=job.pk).owner)()
    client = APIClient()
    client.force_authenticate(owner)
    api = await database_sync_to_async(client.get)(f"/api/jobs/{job.pk}/summary/")
    assert api.status_code == 200
    assert api.json()["reward_errors_line"].startswith("4 (") and api.json()["counters"]["reward_errors"] == 3
    await database_sync_to_async(client.force_login)(owner)
    page = await database_sync_to_async(client.get)(f"/jobs/{job.pk}/")
    assert page.status_code == 200 and b"Reward function errors" in page.content
    assert b"4 (1 non-finite; last: rewards:judge: RuntimeError: the judge is down)" in page.content
    await comm.disconnect()


@pytest.mark.parametrize("bad", [{"errors": -1}, {"last_error": "x" * 201}, {"last_error": "a\x00b"}, {"colour": 1}])
async def test_a_malformed_reward_error_report_refuses_the_frame_with_a_reason(settings_eager, redis_client, bad):
    job, comm, lease = await leased_job(redis_client)
    message = group(job.pk, lease, [record(job.pk, lease, reward=0.0)] * 4)
    message["group"]["reward_errors"] = bad
    await comm.send_json_to(message)
    reply = await comm.receive_json_from()
    assert reply["type"] == "rejected" and "reward_errors" in reply["reason"], reply
    await comm.disconnect()


async def test_a_worker_refusing_the_jobs_user_code_is_released_at_once_and_not_planned_again(settings_eager):
    job, worker, key = await database_sync_to_async(_job_and_worker)()
    comm = await connect(key)
    await started_with(comm, job)
    why = ("refuses the job: reward: runs user code (rewards:judge) and this worker does not run user code (its "
           "provider did not start it with `echo2-agent run --allow-user-code`)")
    # The words alone decide nothing: a crash whose text happens to read so is a crash (restarted, not released).
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "failed", "reason": why})
    assert await comm.receive_nothing(timeout=1)
    await comm.send_json_to({"type": "heartbeat", "job_id": job.pk, "state": "failed", "reason": why,
                             "refused": True})
    release = await comm.receive_json_from(timeout=5)
    assert release["type"] == "release" and release["reason"] == why  # at once: no ROLLOUT_FAILED_RELEASE_S wait

    def planned() -> tuple:
        fresh = Job.objects.get(pk=job.pk)
        pool = scheduling.job_pool(fresh)
        services.job_activate_idle_workers(job=fresh)  # the calibration phase: every idle worker but this one
        return ([c.worker_id for c in pool.active + pool.standby] + [w.pk for w in pool.unmeasured],
                Activation.objects.filter(job=fresh, ended_at=None).count())

    in_pool, open_activations = await database_sync_to_async(planned)()
    assert worker.pk not in in_pool and open_activations == 0
    ended = await database_sync_to_async(Activation.objects.get)(job=job, worker=worker)
    assert ended.end_code == Activation.End.REFUSED  # kept as a code: the scheduler reads no reason's words
    line = (await summary(job.pk))["user_code_refusals_line"]
    assert line == f"1 (last: {worker.name}: {why.removeprefix('refuses the job: ')})"
    await comm.disconnect()


def _job_and_worker():
    owner, provider = factories.user(), factories.user()
    worker, key = factories.worker(provider)
    return factories.job(owner, batch_trajectories=8, group_size=4), worker, key
