"""A job's live view shows its own state only: a finished job's chain picture shows the versions of that
job its workers installed, not the version they hold now in another job; a job whose learner never started shows
no throughput and no installed version of workers that came from another job."""

from __future__ import annotations

import pytest

from marketplace import services
from marketplace.models import Job, Worker
from marketplace.reads import selectors

from . import factories
from .test_pause import online

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


@pytest.fixture(autouse=True)
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True


def test_per_job_views_never_show_another_jobs_versions_or_throughput() -> None:
    owner, provider = factories.user(), factories.user()
    relays = [online(provider, f"{i + 1}.0", relay=f"127.0.0.1:{7100 + i}") for i in range(2)]
    first = factories.job(owner, learner_uplink_bps=12_500_000)
    services.job_start(job=first)
    services.learner_announce(job=first, t_train=None, relay_address="127.0.0.1:7099")
    services.snapshot_publish(job=first, version=1, url="http://x/v1/", manifest=factories.manifest(first, 1))
    services.snapshot_installed(worker=relays[0], job_id=first.pk, version=1, seconds=0.1)
    Worker.objects.filter(pk=relays[0].pk).update(throughput=40.0)
    running = selectors.job_live(Job.objects.get(pk=first.pk))
    assert {w["id"]: (w["installed_version"], w["throughput"]) for w in running["workers"]} == {
        relays[0].pk: (1, 40.0), relays[1].pk: (None, None)}  # the second measured nothing on this job's model
    assert running["summary"]["pool_throughput"] == 40.0

    services.job_finish(job=Job.objects.get(pk=first.pk), status="completed", reason="max_steps")
    # The workers move on: another job's learner publishes far more versions, and they measure its model.
    Worker.objects.filter(pk__in=[w.pk for w in relays]).update(installed_version=2000, throughput=305.5,
                                                                 status=Worker.Status.IDLE)
    finished = selectors.job_live(Job.objects.get(pk=first.pk))
    nodes = {n["id"]: n["installed_version"] for chain in finished["broadcast"]["chains"] for n in chain}
    assert nodes == {relays[0].pk: 1, relays[1].pk: None}
    assert finished["workers"] == [] and finished["summary"]["pool_throughput"] == 0

    waiting = factories.job(owner, learner_uplink_bps=12_500_000)
    services.job_start(job=waiting)  # its learner never starts
    live = selectors.job_live(Job.objects.get(pk=waiting.pk))
    assert live["workers"], "the scheduler activated the idle workers"
    assert {(w["installed_version"], w["throughput"]) for w in live["workers"]} == {(None, None)}
    assert live["summary"]["pool_throughput"] == 0 and live["summary"]["published_version"] == 0
