"""The cap on the audits a learner may report of a worker is the site's own count of the groups it accepted
(``Activation.groups_accepted``, marketplace/infra/delivered.py), never the stream's Redis counter: a learner that
writes that counter (one handed the streams' URL without its own Redis user could) raises no pass count."""

from __future__ import annotations

import pytest

from dataplane.records import TrajectoryGroup
from dataplane.replay import delivered_key
from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services
from marketplace.infra import delivered, stream
from marketplace.models import Activation, Job, Worker

from . import factories
from .test_audits import deliver, learner_api, report

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    delivered.take()  # counts another test's process state left unflushed
    owner = factories.user()
    worker, _ = factories.worker(factories.user(), name="rig")
    Worker.objects.update(status=Worker.Status.IDLE)
    job = factories.job(owner)
    services.job_start(job=job)
    job = Job.objects.get(pk=job.pk)
    services.job_activate_idle_workers(job=job)
    deliver(job, worker, 3)
    return {"api": learner_api(owner, job), "job": job, "worker": worker}


def test_pass_counts_come_from_the_sites_own_count(served):
    api, job, worker = served["api"], served["job"], served["worker"]
    stream.client().hset(delivered_key(job.pk), str(worker.pk), 1000)  # what a learner could write in Redis
    assert report(api, job, 1, [{"worker_id": worker.pk, "passed": 1000, "failed": 0}]).status_code == 201
    worker.refresh_from_db()
    assert worker.audits_passed == 3  # the three groups the site accepted, not the counter's 1000
    assert Activation.objects.get(job=job, worker=worker).groups_accepted == 3


def test_a_resent_group_is_counted_once(served):
    """An agent that sends a group again (its reply was lost) finds it stored: one group delivered, not two."""
    job, worker = served["job"], served["worker"]
    PromptFeeder(stream.client(), job_id=job.pk, task=build_task(job.spec["task"]), seed=1,
                 backlog=stream.replay(job.pk).outstanding() + 1).top_up()
    [leased] = services.prompts_lease(worker=worker, job_id=job.pk, groups=1).leases
    record = {"job_id": job.pk, "lease_id": leased.lease_id, "group_id": leased.group_id, "prompt": leased.prompt,
              "prompt_ids": [1, 5, 6], "completion": "7", "completion_ids": [12, 2], "logprobs": [-1.5, -0.2],
              "reward": 0.0, "version": 0}
    group = TrajectoryGroup.model_validate({"job_id": job.pk, "lease_id": leased.lease_id, "version": 0,
                                            "group_id": leased.group_id, "records": [record] * job.settings.group_size})
    for _ in range(2):
        assert services.trajectories_submit(worker=worker, group=group).accepted == job.settings.group_size
    services.groups_accepted_flush()
    assert Activation.objects.get(job=job, worker=worker).groups_accepted == 4  # the first three and this one


def test_a_flush_writes_every_workers_count_to_its_newest_activation_in_a_few_statements(redis_url):
    """Each (job, worker)'s count goes to its newest activation (an earlier one ended keeps its own), whatever the
    number of workers in a few statements: one per worker made 2,000 a flush at 1,000 workers."""
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    delivered.take()
    owner, provider = factories.user(), factories.user()
    job = factories.job(owner)
    now = timezone.now()
    workers = [factories.worker(provider, name=f"rig{i}")[0] for i in range(12)]
    older = Activation.objects.create(job=job, worker=workers[0], price_per_hour=0.3, ended_at=now,
                                      started_at=now - timedelta(hours=1))
    newest = {w.pk: Activation.objects.create(job=job, worker=w, price_per_hour=0.3, started_at=now).pk
              for w in workers}
    for i, w in enumerate(workers):
        delivered.add(job_id=job.pk, worker_id=w.pk, groups=1 + i % 3)
    with CaptureQueriesContext(connection) as queries:
        services.groups_accepted_flush()
    assert len(queries) <= 2 + 3 + 2  # the read, the lock, an update per distinct count; the savepoint's two
    got = dict(Activation.objects.filter(pk__in=newest.values()).values_list("worker_id", "groups_accepted"))
    assert got == {w.pk: 1 + i % 3 for i, w in enumerate(workers)}
    assert Activation.objects.get(pk=older.pk).groups_accepted == 0
    assert delivered.take() == {}
