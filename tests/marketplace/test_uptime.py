"""Worker uptime (connection sessions), utilization and the relay score, as the pages and the API show them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from dataplane.broadcast import chains
from echo2_site.asgi import application
from marketplace import services
from marketplace.models import Activation, Worker, WorkerSession
from marketplace.reads import selectors

from . import factories

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


def registered(days_ago: float, **fields) -> Worker:
    """A worker registered ``days_ago`` (``created_at`` is set on insert, so it is moved back after)."""
    worker, _ = factories.worker(factories.user())
    Worker.objects.filter(pk=worker.pk).update(created_at=timezone.now() - days_ago * DAY, **fields)
    return Worker.objects.get(pk=worker.pk)


# ---- the arithmetic ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_uptime_clips_sessions_to_the_window_and_counts_the_open_one_until_now():
    now = timezone.now()
    worker = registered(30)
    for started, ended in [
        (now - 9 * DAY, now - 8 * DAY),  # before the window: not counted
        (now - 7.5 * DAY, now - 6 * DAY),  # straddles the window's start: 1 day inside
        (now - 3 * DAY, now - 3 * DAY + 12 * HOUR),  # half a day
        (now - DAY, None),  # open: connected for the last day
    ]:
        WorkerSession.objects.create(worker=worker, started_at=started, ended_at=ended)
    figures = selectors.worker_uptime([worker], now=now)[worker.pk]
    assert figures["uptime"] == pytest.approx(2.5 / 7)
    assert figures["online_since"] == now - DAY


@pytest.mark.django_db
def test_overlapping_sessions_count_once():
    now = timezone.now()
    worker = registered(30)
    WorkerSession.objects.create(worker=worker, started_at=now - 4 * DAY, ended_at=now - 2 * DAY)
    WorkerSession.objects.create(worker=worker, started_at=now - 3 * DAY, ended_at=now - 1 * DAY)
    figures = selectors.worker_uptime([worker], now=now)[worker.pk]
    assert figures["uptime"] == pytest.approx(3 / 7) and figures["online_since"] is None


@pytest.mark.django_db
def test_a_worker_younger_than_the_window_is_measured_since_it_was_registered():
    now = timezone.now()
    young, newborn = registered(2), registered(0)
    WorkerSession.objects.create(worker=young, started_at=now - DAY, ended_at=now - 12 * HOUR)
    uptime = selectors.worker_uptime([young, newborn], now=newborn.created_at)
    assert uptime[young.pk]["uptime"] == pytest.approx(0.5 / 2, rel=1e-4)
    assert uptime[newborn.pk] == {"uptime": None, "online_since": None}  # registered this instant: no span yet


@pytest.mark.django_db
def test_utilization_is_the_share_of_the_window_in_jobs():
    now = timezone.now()
    worker = registered(30)
    job = factories.job(factories.user())
    Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                              started_at=now - 8 * DAY, ended_at=now - 6 * DAY)  # 1 day inside the window
    Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour, started_at=now - DAY)
    assert selectors.worker_utilization([worker], now=now)[worker.pk] == pytest.approx(2 / 7)


# ---- sessions opened and closed by the services ------------------------------------------------------


@pytest.mark.django_db
def test_expiry_ends_the_session_at_the_last_heartbeat_and_a_heartbeat_reopens_it(settings):
    worker = registered(1)
    services.worker_connected(worker=worker, installed_version=None)
    WorkerSession.objects.update(started_at=timezone.now() - HOUR)  # connected an hour ago
    silent_since = timezone.now() - timedelta(seconds=settings.ECHO2["WORKER_TIMEOUT_S"] + 60)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat=silent_since)
    assert services.expire_silent_workers() == 1
    session = WorkerSession.objects.get(worker=worker)
    assert session.ended_at == silent_since  # it went silent then, not when expiry noticed

    # The agent resumes on the same socket; its consumer's copy of the worker still says "idle".
    services.worker_heartbeat(worker=worker, throughput=1.5)
    assert Worker.objects.get(pk=worker.pk).status == Worker.Status.IDLE
    assert WorkerSession.objects.filter(worker=worker, ended_at=None).count() == 1


@pytest.mark.django_db
def test_a_second_hello_closes_the_stale_session_at_the_last_heartbeat():
    worker = registered(1)
    services.worker_connected(worker=worker, installed_version=None)
    WorkerSession.objects.update(started_at=timezone.now() - HOUR)
    last_seen = timezone.now() - timedelta(seconds=5)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat=last_seen)
    services.worker_connected(worker=Worker.objects.get(pk=worker.pk), installed_version=None)
    stale, current = WorkerSession.objects.filter(worker=worker).order_by("started_at")
    assert stale.ended_at == last_seen and current.ended_at is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url")
async def test_agent_socket_opens_a_session_on_hello_and_closes_it_on_disconnect(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # hello schedules provisioning of waiting jobs
    worker, key = await database_sync_to_async(factories.worker)(await database_sync_to_async(factories.user)())
    open_sessions = database_sync_to_async(lambda: list(WorkerSession.objects.filter(worker=worker, ended_at=None)))

    comm = WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Bearer {key}".encode())])
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["type"] == "welcome"
    [session] = await open_sessions()
    uptime = await database_sync_to_async(selectors.worker_uptime)([worker])
    assert uptime[worker.pk]["online_since"] == session.started_at and uptime[worker.pk]["uptime"] > 0

    await comm.disconnect()
    assert await open_sessions() == []
    closed = await database_sync_to_async(WorkerSession.objects.get)(worker=worker)
    assert closed.ended_at >= closed.started_at
    assert (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).status == Worker.Status.OFFLINE


# ---- the relay score ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_score_is_the_chain_score_against_the_fleets_best_relay():
    now = timezone.now()
    fast = registered(1, relay_address="10.0.0.1:7000", bandwidth_bps=20_000_000, last_heartbeat=now)
    slow = registered(1, relay_address="10.0.0.2:7000", bandwidth_bps=10_000_000, last_heartbeat=now,
                      relay_successes=10)
    plain = registered(1, last_heartbeat=now)
    # 0.5 * (10/20 of the best bandwidth) + 0.35 * (10 of 10 successes) + 0.15 * (no failures) = 0.75,
    # whether or not the faster relay is among the workers asked about.
    assert selectors.worker_scores([slow], now=now) == {slow.pk: pytest.approx(0.75)}
    scores = selectors.worker_scores([fast, slow, plain], now=now)
    assert scores == {fast.pk: pytest.approx(0.65), slow.pk: pytest.approx(0.75), plain.pk: None}
    # The broadcast planner ranks by the same numbers: the higher score seeds the single chain.
    stats = selectors.chain_stats([fast, slow], now=now.timestamp())
    assert chains.assemble_chains(stats, n_ch=1, now=now.timestamp()).chains == ((slow.pk, fast.pk),)


# ---- the API ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_worker_api_shows_score_and_uptime_without_a_query_per_worker():
    provider = factories.user()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(provider)}")
    worker, _ = factories.worker(provider)
    Worker.objects.filter(pk=worker.pk).update(relay_address="10.0.0.1:7000", last_heartbeat=timezone.now(),
                                               created_at=timezone.now() - 2 * DAY)
    WorkerSession.objects.create(worker=worker, started_at=timezone.now() - DAY)

    with CaptureQueriesContext(connection) as one:
        [row] = api.get("/api/workers/").json()["results"]
    assert row["score"] == pytest.approx(0.65, abs=0.01) and row["uptime"] == pytest.approx(0.5, abs=0.01)
    assert row["online_since"] is not None
    assert api.get(f"/api/workers/{worker.pk}/").json()["uptime"] == pytest.approx(0.5, abs=0.01)

    for _ in range(4):
        factories.worker(provider)
    with CaptureQueriesContext(connection) as five:
        assert len(api.get("/api/workers/").json()["results"]) == 5
    assert len(five) == len(one)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_url")
async def test_the_close_of_an_old_socket_does_not_end_the_newer_one(settings):
    # The agent reconnected (new socket, hello) before the site saw its old socket close.
    settings.CELERY_TASK_ALWAYS_EAGER = True
    worker, key = await database_sync_to_async(factories.worker)(await database_sync_to_async(factories.user)())
    headers = [(b"authorization", f"Bearer {key}".encode())]
    old, new = (WebsocketCommunicator(application, "/ws/agent/", headers=headers) for _ in range(2))
    for comm in (old, new):
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "hello", "agent_version": "test"})
        assert (await comm.receive_json_from())["type"] == "welcome"

    await old.disconnect()
    fresh = await database_sync_to_async(Worker.objects.get)(pk=worker.pk)
    open_sessions = await database_sync_to_async(lambda: WorkerSession.objects.filter(worker=worker,
                                                                                      ended_at=None).count())()
    assert fresh.status == Worker.Status.IDLE and open_sessions == 1
    await new.disconnect()
    assert (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).status == Worker.Status.OFFLINE
