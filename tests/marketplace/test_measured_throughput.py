"""mu_i is measured by the site from the trajectories it accepted, not taken from the worker's word.

Pure core (``controller.accepted_rate``), the scheduler's pool on a real database and Redis, and the agent
websocket refusing impossible figures without any page or API view of any job failing afterwards.
"""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone
from rest_framework.test import APIClient

from echo2_site.asgi import application
from marketplace import services
from marketplace.core import controller
from marketplace.infra import telemetry
from marketplace.models import Activation, Worker
from marketplace.reads import scheduling

from . import factories


def test_accepted_rate_counts_what_the_site_accepted_over_the_window() -> None:
    events = [(10.0, 8), (40.0, 8), (70.0, 8), (95.0, 8)]
    # window (40, 100]: 70 and 95 count; 16 records over 60 s
    assert controller.accepted_rate(events, now=100.0, window_s=60.0, since=0.0, min_span_s=10.0) == 16 / 60
    # started on the job at t = 80: only the 95 group, over 20 s
    assert controller.accepted_rate(events, now=100.0, window_s=60.0, since=80.0, min_span_s=10.0) == 8 / 20


def test_accepted_rate_waits_for_a_span_and_for_evidence() -> None:
    assert controller.accepted_rate([(99.0, 8)], now=100.0, window_s=60.0, since=95.0, min_span_s=10.0) is None
    assert controller.accepted_rate([], now=100.0, window_s=60.0, since=0.0, min_span_s=10.0) is None
    assert controller.accepted_rate([(10.0, 8)], now=100.0, window_s=60.0, since=0.0, min_span_s=10.0) is None


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_url")
def test_the_pool_plans_with_the_measured_figure_not_the_claimed_one(settings) -> None:
    settings.ECHO2 = {**settings.ECHO2, "HEARTBEAT_INTERVAL_S": 2.0}
    owner, provider = factories.user(), factories.user()
    job = factories.job(owner)
    worker, _ = factories.worker(provider)
    now = time.time()
    Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                              started_at=timezone.now() - timezone.timedelta(seconds=120))
    for t in range(60, 0, -2):  # it claims 900 000 trajectories/s in every heartbeat
        telemetry.record_heartbeat(worker.pk, at=now - t, throughput=9e5)

    pool = scheduling.job_pool(job, now=now)
    assert pool.sources[worker.pk] == "measured"  # active a whole window, nothing accepted: it adds nothing
    assert pool.active[0].throughput is None and pool.capacity == 0.0

    for t in (50, 35, 20, 5):  # the site accepted 4 groups of 8 over the last minute
        telemetry.record_accepted(worker.pk, job_id=job.pk, at=now - t, records=8)
    telemetry.record_accepted(worker.pk, job_id=job.pk + 1, at=now - 1, records=800)  # another job's: not counted
    pool = scheduling.job_pool(job, now=now)
    assert pool.sources[worker.pk] == "measured"
    assert pool.active[0].throughput == pytest.approx(32 / telemetry.window_s())


@pytest.mark.django_db(transaction=True)
async def test_impossible_heartbeats_are_refused_and_no_view_fails_afterwards(settings, redis_url) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner, provider, worker, key, job = await database_sync_to_async(_setup)()
    comm = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {key}".encode())])
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["type"] == "welcome"
    assert (await comm.receive_json_from(timeout=5))["type"] == "assign"  # the running job takes the idle worker
    for figure in ("Infinity", "NaN", "1e300", "-1"):
        await comm.send_to(text_data='{"type": "heartbeat", "throughput": ' + figure + "}")
        reply = await comm.receive_json_from()
        assert reply["type"] == "rejected" and reply["ref"] == "heartbeat"
        assert reply["reason"].startswith("heartbeat.throughput: "), reply
    await comm.send_json_to({"type": "heartbeat", "throughput": 3.0})  # a sane one still lands
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["type"] == "welcome"
    statuses = await database_sync_to_async(_every_view)(owner, provider, job)
    assert all(code == 200 for code in statuses.values()), statuses
    await comm.disconnect()


def _setup():
    owner, provider = factories.user(), factories.user()
    worker, key = factories.worker(provider)
    job = factories.job(owner)
    services.job_start(job=job)
    return owner, provider, worker, key, job


def _every_view(owner, provider, job) -> dict[str, int]:
    out = {}
    for user, paths in ((owner, [f"/api/jobs/{job.pk}/", f"/api/jobs/{job.pk}/summary/", f"/api/jobs/{job.pk}/live/",
                                 f"/api/jobs/{job.pk}/plan/", "/api/jobs/", f"/jobs/{job.pk}/", "/"]),
                        (provider, ["/api/workers/", "/provider/"])):
        client = APIClient()
        client.force_login(user)
        for path in paths:
            out[path] = client.get(path).status_code
    return out


def test_worker_throughput_is_the_measured_figure(db, redis_url, settings) -> None:
    settings.ECHO2 = {**settings.ECHO2, "HEARTBEAT_INTERVAL_S": 2.0}
    owner, provider = factories.user(), factories.user()
    job = factories.job(owner)
    worker, _ = factories.worker(provider)
    Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                              started_at=timezone.now() - timezone.timedelta(seconds=30))
    services.worker_heartbeat(worker=worker, throughput=500.0)
    assert Worker.objects.get(pk=worker.pk).throughput is None  # claimed, not measured
    telemetry.record_accepted(worker.pk, job_id=job.pk, at=time.time() - 1, records=60)
    services.worker_heartbeat(worker=worker, throughput=500.0)
    assert Worker.objects.get(pk=worker.pk).throughput == pytest.approx(60 / 30, rel=0.05)
