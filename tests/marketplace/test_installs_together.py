"""Install reports of many workers written together (marketplace/services/installs.py ``snapshots_installed``), as
the agent sockets of a process hand them over at a publication (marketplace/realtime/batches.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from marketplace import services
from marketplace.infra import telemetry
from marketplace.models import Job, Worker
from marketplace.realtime import consumers

from . import factories
from .test_agent_socket import connect
from .test_broadcast import make_workers, publish, pushes, running_job  # noqa: F401 - pushes: a fixture

pytestmark = [pytest.mark.usefixtures("redis_url")]


def reports(job, workers, *, version: int = 1, at: float, source: str = "http", at_work=None):
    return [services.InstallReport(worker=w, job_id=job.pk, version=version, seconds=0.5, source=source,
                                   at_work=at_work, at=at + i) for i, w in enumerate(workers)]


@pytest.mark.django_db
def test_a_fleets_reports_cost_one_transaction_of_a_few_statements_and_each_is_judged_alone(
        pushes, django_capture_on_commit_callbacks):  # noqa: F811
    workers = make_workers(8)
    job = running_job(workers, b0=1000)
    job.spec = {**job.spec, "gamma": 2.0}  # T_bcast once ceil(8 / 2) = 4 workers installed
    job.save()
    publish(job, 1)
    published = job.snapshots.get(version=1).published_at.timestamp()
    at_work = services.job_at_work(job_id=job.pk)
    batch = reports(job, workers, at=published + 10, at_work=at_work)
    never = services.InstallReport(worker=workers[0], job_id=job.pk, version=7, seconds=0.5, at_work=at_work,
                                   at=published + 20)
    again = batch[1]._replace(at=published + 30)  # a report sent again
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        outcomes = services.snapshots_installed([*batch[:4], never, again, *batch[4:]])
    assert [str(o) if o else None for o in outcomes] == [None] * 4 + [
        f"version: snapshot 7 of job {job.pk} was never published"] + [None] * 5
    snap = job.snapshots.get(version=1)
    assert (snap.installs, snap.install_reports.count()) == (8, 8)
    assert snap.t_bcast == pytest.approx(13.0, abs=1e-3)  # the 4th by arrival, whatever the batch's size
    assert set(Worker.objects.filter(pk__in=[w.pk for w in workers]).values_list("installed_version", flat=True)) \
        == {1}
    # the snapshots read, the workers locked in id order and updated, the installs, the snapshot's counters (and
    # the savepoint and its release: a test runs in a transaction); one report at a time took four each
    assert len(queries) == 7
    locked = next(q["sql"] for q in queries.captured_queries if "FOR NO KEY UPDATE" in q["sql"])
    assert "marketplace_worker" in locked and "ORDER BY" in locked
    seen = telemetry.observed([workers[5].pk], job_id=job.pk)[workers[5].pk]
    assert seen.installed == pytest.approx(published + 15, abs=1e-3)  # as the site received it


@pytest.mark.django_db
def test_reports_the_sockets_read_cannot_vouch_for_are_checked_one_by_one_beside_the_rest(pushes):  # noqa: F811
    workers = make_workers(3)
    job = running_job(workers, b0=1000)
    publish(job, 1)
    stranger = make_workers(1)[0]  # never active in the job
    at_work = services.job_at_work(job_id=job.pk)
    now = time.time()
    batch = [*reports(job, workers[:2], at=now, at_work=at_work),
             *reports(job, [workers[2], stranger], at=now)]  # no shared read: the database says
    outcomes = services.snapshots_installed(batch)
    assert outcomes[:3] == [None] * 3 and f"not active in job {job.pk}" in str(outcomes[3])
    assert job.snapshots.get(version=1).installs == 3


@pytest.mark.django_db
def test_children_and_their_relay_parents_reported_together_credit_each_parent_reading_the_manifest_once(
        pushes):  # noqa: F811
    workers = make_workers(3)
    job = running_job(workers, b0=1000)  # one chain of three: seed -> middle -> tail
    publish(job, 1)
    seed, middle, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    at_work = services.job_at_work(job_id=job.pk)
    by_pk = {w.pk: w for w in workers}
    now = time.time()
    batch = [*reports(job, [by_pk[tail], by_pk[middle]], at=now + 1, source="parent", at_work=at_work),
             *reports(job, [by_pk[seed]], at=now, source="parent", at_work=at_work)]
    with CaptureQueriesContext(connection) as queries:
        assert services.snapshots_installed(batch) == [None] * 3
    snap = job.snapshots.get(version=1)
    assert (snap.installs, snap.installs_via_parent) == (3, 3)
    assert [Worker.objects.get(pk=pk).relay_successes for pk in (seed, middle, tail)] == [1, 1, 0]
    # the snapshot's size, for both parents' measured rates, read once
    assert sum('"manifest"' in q["sql"] for q in queries.captured_queries) == 1


@pytest.mark.django_db(transaction=True)
async def test_the_sockets_of_a_process_hand_their_reports_over_together(settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    n = 6

    @database_sync_to_async
    def setup():
        owner, provider = factories.user(), factories.user()
        job = factories.job(owner, batch_trajectories=8, group_size=4)
        return job, [factories.worker(provider) for _ in range(n)]

    job, workers = await setup()
    comms = [await connect(key) for _, key in workers]
    for comm in comms:
        await comm.send_json_to({"type": "hello", "agent_version": "test"})
        assert (await comm.receive_json_from(timeout=10))["type"] == "welcome"
    fresh = database_sync_to_async(lambda: Job.objects.get(pk=job.pk))
    await database_sync_to_async(services.job_start)(job=await fresh())
    await database_sync_to_async(services.snapshot_publish)(job=await fresh(), version=1, url="http://l/v1/",
                                                            manifest=factories.manifest(job, 1))
    for comm in comms:
        while (await comm.receive_json_from(timeout=10))["type"] != "snapshot":
            pass
    batches, release = [], threading.Event()
    written = services.snapshots_installed

    def held(items):  # the first write waits until every socket's report is handed over
        batches.append(len(items))
        if len(batches) == 1:
            assert release.wait(timeout=10)
        return written(items)

    monkeypatch.setattr(services, "snapshots_installed", held)
    for comm in comms:
        await comm.send_json_to({"type": "snapshot_installed", "job_id": job.pk, "version": 1, "seconds": 0.5})
    async with asyncio.timeout(10):  # every report handed over: in the held first write, or queued behind it
        while not batches or batches[0] + consumers.INSTALLS.waiting() < n:
            await asyncio.sleep(0.01)
    release.set()
    for comm in comms:  # answered once its report is written
        await comm.send_json_to({"type": "lease_request", "job_id": job.pk})
        assert (await comm.receive_json_from(timeout=10))["type"] in ("no_work", "lease")
    assert sum(batches) == n and len(batches) <= 2  # what waited behind the first write went in one more
    assert await database_sync_to_async(lambda: job.snapshots.get(version=1).installs)() == n
    for comm in comms:
        await comm.disconnect()
