"""The site checks every returned group against its job's model and task (docs/trust.md, "Record checks").

Each attack here was accepted before the checks: a token id no model has, a reward no task gives, a
completion longer than the job samples. A refused group costs nothing: its lease stays open.
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from dataplane import replay
from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.models import Job

from . import factories
from .test_agent_socket import connect, group, record, setup_job_and_worker, started_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]

VOCAB = 16  # the model the learner of these jobs reports


@pytest.fixture
def settings_eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    return settings


async def leased_job(redis_client, *, vocab_size: int | None = VOCAB):
    """A started job whose learner announced ``vocab_size``, a connected worker, and one leased prompt."""
    job, _, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    fresh = await database_sync_to_async(Job.objects.get)(pk=job.pk)
    await database_sync_to_async(services.learner_announce)(job=fresh, t_train=None, vocab_size=vocab_size)
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=1).top_up()
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk})
    lease = (await comm.receive_json_from())["leases"][0]
    return job, comm, lease


async def refused(comm, job_id: int, lease: dict, **bad) -> list[str]:
    """Send a group whose last record carries ``bad`` (every record, for a prompt: a group shares it); return
    the reasons of the (refused) reply."""
    shared = {k: v for k, v in bad.items() if k.startswith("prompt")}
    records = [record(job_id, lease, **shared) for _ in range(3)] + [record(job_id, lease, **bad)]
    await comm.send_json_to(group(job_id, lease, records))
    reply = await comm.receive_json_from()
    assert reply["type"] == "accepted" and reply["accepted"] == 0 and reply["rejected"] == 4, reply
    return reply["reasons"]


@pytest.mark.parametrize(("bad", "reason"), [
    ({"completion_ids": [10**15, 2]}, "records.3.completion_ids: token id 1000000000000000 is not in the model's "
                                      f"vocabulary of {VOCAB}"),
    ({"prompt_ids": [1, VOCAB, 6]}, f"records.0.prompt_ids: token id {VOCAB} is not in the model's vocabulary"),
    ({"reward": 1e308}, "records.3.reward: 1e+308 is outside the task's range [0, 1]"),
    ({"reward": 2.0}, "records.3.reward: 2.0 is outside the task's range [0, 1]"),
    ({"reward": -0.5}, "records.3.reward: -0.5 is outside the task's range [0, 1]"),
    ({"completion_ids": [3] * 9, "logprobs": [-0.1] * 9}, "records.3.completion_ids: 9 tokens, the job allows at "
                                                          "most 8"),
    ({"prompt_ids": [1] * 200}, "records.0.prompt_ids: 200 tokens for a prompt of"),
    ({"logprobs": [-1e300, -0.2]}, "records.3.logprobs: must be finite and within [-10000, 0]"),
    # issue 26: 7 MB of padding in one frame, where a legal group of this job is under 2 KB
    ({"metadata": {"pad": "x" * 7_000_000}}, "records.3.metadata: 7000010 bytes of JSON, a record's metadata may "
                                             "take at most 1024"),
])
async def test_a_group_outside_the_jobs_limits_is_refused_with_its_reason_and_the_lease_stays_open(
        settings_eager, redis_client, bad, reason):
    job, comm, lease = await leased_job(redis_client)
    reasons = await refused(comm, job.pk, lease, **bad)
    assert len(reasons) == 1 and reasons[0].startswith(reason), reasons
    assert redis_client.xlen(replay.trajectories_key(job.pk)) == 0
    assert replay.ReplayBuffer(redis_client, job.pk).counters()["rejected_records"] == 4
    # Nothing is lost: the same lease, answered within the limits, is taken.
    await comm.send_json_to(group(job.pk, lease, [record(job.pk, lease, completion_ids=[VOCAB - 1, 2])] * 4))
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.disconnect()


async def test_until_the_learner_reports_its_vocabulary_token_ids_are_left_to_the_learner(settings_eager,
                                                                                           redis_client):
    # The site has no model; before the learner's announcement it cannot know the vocabulary, so it takes the
    # group and the learner quarantines it (tests/learner/test_quarantine.py). Every other limit still holds.
    job, comm, lease = await leased_job(redis_client, vocab_size=None)
    assert "outside the task's range" in (await refused(comm, job.pk, lease, reward=1e308))[0]
    await comm.send_json_to(group(job.pk, lease, [record(job.pk, lease, completion_ids=[10**15, 2])] * 4))
    assert (await comm.receive_json_from())["accepted"] == 4
    await comm.disconnect()


def test_the_learner_reports_its_vocabulary_with_its_announcement(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    job = factories.job(owner)
    assert api.get(f"/api/jobs/{job.pk}/").json()["vocab_size"] is None
    assert api.post(f"/api/jobs/{job.pk}/learner/", {"t_train": 1.0, "vocab_size": 32000},
                    format="json").status_code == 200
    assert api.post(f"/api/jobs/{job.pk}/learner/", {"t_train": None}, format="json").status_code == 200  # a beat
    assert api.get(f"/api/jobs/{job.pk}/").json()["vocab_size"] == 32000
    bad = api.post(f"/api/jobs/{job.pk}/learner/", {"vocab_size": 0}, format="json")
    assert bad.status_code == 400 and bad.json()["detail"].startswith("vocab_size: ")
