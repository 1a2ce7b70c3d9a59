"""Agent liveness kept in Redis (marketplace/infra/liveness.py): heartbeats without the database, folded into it; expiry
only of the truly silent; closes queued and recorded, leases returned at once; hellos coalescing provisioning;
no stall blamed on the learner while the site was down; a worker back after an outage rejoining its job."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from dataplane import replay
from dataplane.tasks import build_task
from learner.prompts import PromptFeeder
from marketplace import services, tasks
from marketplace.infra import liveness, stream, telemetry
from marketplace.models import Activation, Job, Worker, WorkerSession

from . import factories
from .test_agent_socket import connect, setup_job_and_worker, started_with
from .test_billing import age_leases

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 30.0, "HEARTBEAT_DB_SYNC_S": 10.0}
    return settings


def connected(**fields) -> Worker:
    worker, _ = factories.worker(factories.user())
    services.worker_connected(worker=worker, installed_version=None)
    if fields:
        Worker.objects.filter(pk=worker.pk).update(**fields)
    return Worker.objects.get(pk=worker.pk)


def activated(worker: Worker) -> Activation:
    job = factories.job(factories.user())
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    return services.worker_activate(worker=worker, job=Job.objects.get(pk=job.pk))


# ---- heartbeats stay in Redis and are folded -------------------------------------------------------------


def test_an_idle_workers_heartbeats_touch_no_database_and_the_fold_writes_them(eager, django_assert_num_queries):
    worker = connected()
    hello = Worker.objects.get(pk=worker.pk).last_heartbeat
    at = time.time() + 3
    with django_assert_num_queries(0):
        for i in range(3):
            beat = services.worker_heartbeat_record(worker_id=worker.pk, throughput=2.0, at=at + i)
            assert not beat.to_database
    assert Worker.objects.get(pk=worker.pk).last_heartbeat == hello  # the database has not heard yet
    assert liveness.last_seen([worker.pk])[worker.pk] == at + 2
    beats = telemetry.recent_heartbeats([worker.pk])[worker.pk]
    assert [t for t, _ in beats] == [at, at + 1, at + 2]  # the scheduler's availability still sees each one

    assert tasks.fold_worker_heartbeats() == 1
    assert Worker.objects.get(pk=worker.pk).last_heartbeat.timestamp() == pytest.approx(at + 2, abs=1e-3)
    services.worker_heartbeat_record(worker_id=worker.pk, throughput=2.0, at=at - 60)  # late, out of order
    tasks.fold_worker_heartbeats()
    assert Worker.objects.get(pk=worker.pk).last_heartbeat.timestamp() == pytest.approx(at + 2, abs=1e-3)


def test_a_heartbeat_goes_to_the_database_when_its_job_or_failure_changes_or_its_report_is_due(eager):
    worker = connected()
    activation = activated(worker)
    job_id = activation.job_id

    def beat(state: str) -> liveness.Beat:
        return services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, state=state, job_id=job_id)

    first = beat("loading")
    assert first.reason == "state changed"  # an activation makes the next heartbeat report (the bill's start)
    services.worker_heartbeat_apply(worker=worker, beat=first, throughput=1.0, state="loading", job_id=job_id)
    assert not beat("loading").to_database
    # billing takes only the job and "failed" from a report (the rest is what the site saw, folded every expiry
    # period): an agent between loading, generating and idle stays in Redis (1,000 agents on two processes sent
    # eleven such reports each in a 30 s window, most of the sockets' database work)
    assert [beat(state).to_database for state in ("generating", "idle", "generating")] == [False] * 3
    liveness.stream.client().delete(liveness._sync_key(worker.pk))  # the periodic report's clock ran out
    assert beat("generating").reason == "report due"
    assert beat("failed").reason == "state changed"
    assert beat("failed").reason == "failing"  # the release limit is checked
    assert beat("generating").reason == "state changed"  # recovered: billed again from now


def test_a_heartbeat_is_recorded_whole_after_redis_forgets_its_script(eager):
    """A heartbeat is one script called by its digest: a Redis that restarted (or flushed its scripts) gets the
    script's text again, and the heartbeat records everything and reads the worker's state as before."""
    worker = connected()
    at = time.time()
    assert services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, at=at).reason == ""  # idle, online
    stream.client().script_flush()
    beat = services.worker_heartbeat_record(worker_id=worker.pk, throughput=2.0, at=at + 1)
    assert beat.previous_at == pytest.approx(at) and beat.reason == ""  # online and idle, as the first one left it
    assert services.worker_heartbeat_record(worker_id=worker.pk, throughput=2.0, at=at + 2,
                                            state="failed").reason == "state changed"
    assert liveness.last_seen([worker.pk])[worker.pk] == pytest.approx(at + 2)
    assert [tuple(b) for b in telemetry.recent_heartbeats([worker.pk])[worker.pk]] == [
        (pytest.approx(at), 1.0), (pytest.approx(at + 1), 2.0), (pytest.approx(at + 2), 2.0)]


def test_heartbeats_written_together_each_get_their_own_beat(eager, redis_client):
    """A process's sockets hand their heartbeats over together (``liveness.heartbeats_async``: one round trip):
    each is recorded at its own time and judged on its own worker's state, as one at a time would be."""
    first = connected()
    at = time.time()
    liveness.mark_online(first.pk, at=at - 2, state="idle", job_id=None)
    beats = [{"worker_id": first.pk, "at": at, "throughput": 1.0, "state": "idle", "job_id": None},
             {"worker_id": 424242, "at": at + 0.5, "throughput": 2.0, "state": "idle", "job_id": None}]
    stream.client().script_flush()  # the script loaded again on the way
    found = asyncio.run(liveness.heartbeats_async(beats))
    assert [b.reason for b in found] == ["", liveness.NOT_ONLINE]  # the second: a worker the site never held online
    assert found[0].previous_at == pytest.approx(at - 2) and found[1].previous_at is None
    assert liveness.last_seen([first.pk, 424242]) == {first.pk: pytest.approx(at), 424242: pytest.approx(at + 0.5)}


def test_an_event_loops_client_closes_its_connections_when_the_loop_shuts_down(eager, redis_client):
    """Heartbeats run on the event loop's own client (``stream.async_client``); a loop that ends (a test's; daphne's
    at exit) takes its connections with it, so loops that come and go leave no connection behind."""

    async def beats() -> None:
        await asyncio.gather(*(liveness.heartbeats_async([{"worker_id": wid, "at": time.time(), "throughput": 1.0,
                                                           "state": "idle", "job_id": None}]) for wid in range(20)))

    asyncio.run(beats())
    held = redis_client.info("clients")["connected_clients"]
    for _ in range(3):
        asyncio.run(beats())
    assert redis_client.info("clients")["connected_clients"] <= held
    assert len(stream._ASYNC) <= 1


def test_a_heartbeat_never_waits_for_a_connection_behind_the_requests(eager, redis_client):
    """Heartbeats have the loop's Redis connections of their own: with every connection of the requests' pool held
    (a thousand sockets' submits on a saturated machine), a heartbeat is recorded at once. Sharing the pool, it
    waited for one (and past the pool's wait, was refused)."""

    async def run() -> bool:
        requests = stream.async_client()
        held = [asyncio.create_task(requests.blpop([f"echo2:test:held:{i}"], timeout=2))
                for i in range(stream.ASYNC_CONNECTIONS["requests"])]
        await asyncio.sleep(0.2)  # each holds its connection, blocked in Redis
        await liveness.heartbeats_async([{"worker_id": 7, "at": time.time(), "throughput": 1.0, "state": "idle",
                                          "job_id": None}])
        all_held = not any(task.done() for task in held)  # sharing the pool, it waited until one ended (2 s)
        await asyncio.gather(*held)
        return all_held

    assert asyncio.run(run())


def test_billing_is_exact_when_reports_are_sparser_than_heartbeats(eager):
    eager.ECHO2 = {**eager.ECHO2, "LEASE_TIMEOUT_S": 60.0}  # one lease outstanding over the whole 37 s
    worker = connected()
    activation = activated(worker)
    # The site saw it install 59 s ago and lease a second ago: it is generating (what its heartbeats say is not read).
    Activation.objects.filter(pk=activation.pk).update(started_at=timezone.now() - timedelta(seconds=60))
    activation.refresh_from_db()
    telemetry.record_observed(worker.pk, job_id=activation.job_id, what="installed", at=time.time() - 59)
    stream.replay(activation.job_id).ensure_groups()
    stream.replay(activation.job_id).add_prompts(["1+1="])
    stream.replay(activation.job_id).lease(worker_id=worker.pk, count=1, timeout_s=30)  # a lease outstanding
    beat = services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, state="generating",
                                            job_id=activation.job_id)
    services.worker_heartbeat_apply(worker=worker, beat=beat, throughput=1.0, state="generating",
                                    job_id=activation.job_id)
    # Its last report came 37 s ago, its heartbeats since stayed in Redis until 25 s ago, and now it beats again:
    # reports at each heartbeat would have billed all 37 s (a silence shorter than the 30 s gap limit is billed),
    # one report over the whole span (longer than the limit) would bill nothing.
    now = time.time()
    Activation.objects.filter(pk=activation.pk).update(reported_at=timezone.now() - timedelta(seconds=37),
                                                       billed_seconds=0.0)
    age_leases(activation.job_id, 37.0)  # the lease (unexpired: eager's timeout) spans the 37 s
    liveness.stream.client().zadd(liveness.SEEN_KEY, {str(worker.pk): now - 37})
    services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, state="generating",
                                     job_id=activation.job_id, at=now - 25)
    liveness.stream.client().delete(liveness._sync_key(worker.pk))
    beat = services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, state="generating",
                                            job_id=activation.job_id, at=now)
    assert beat.reason == "report due" and beat.previous_at == pytest.approx(now - 25)
    services.worker_heartbeat_apply(worker=worker, beat=beat, throughput=1.0, state="generating",
                                    job_id=activation.job_id)
    assert Activation.objects.get(pk=activation.pk).billed_seconds == pytest.approx(37.0, abs=0.5)

    # Then it goes silent: expiry bills up to its last heartbeat (15 s after the last report), not the silence.
    Activation.objects.filter(pk=activation.pk).update(reported_at=timezone.now() - timedelta(seconds=50),
                                                       billed_seconds=0.0)
    age_leases(activation.job_id, 13.0)  # held since 50 s ago
    liveness.stream.client().zadd(liveness.SEEN_KEY, {str(worker.pk): now - 35})
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=35))
    assert services.expire_silent_workers() == 1
    row = Activation.objects.get(pk=activation.pk)
    assert row.ended_at is not None and row.billed_seconds == pytest.approx(15.0, abs=0.5)


def test_a_worker_is_expired_only_when_truly_silent(eager):
    worker = connected()
    long_ago = timezone.now() - timedelta(seconds=120)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat=long_ago)  # what the database last heard
    services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0)  # ... but it beats on, in Redis
    liveness.set_folded_at(time.time() + 3600)  # and the fold lags (it would read nothing)
    assert services.expire_silent_workers() == 0
    assert Worker.objects.get(pk=worker.pk).status == Worker.Status.IDLE

    liveness.stream.client().zadd(liveness.SEEN_KEY, {str(worker.pk): long_ago.timestamp()})  # truly silent
    assert services.expire_silent_workers() == 1
    assert Worker.objects.get(pk=worker.pk).status == Worker.Status.OFFLINE
    # Its next heartbeat goes to the database, which brings it back and opens a session.
    beat = services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0)
    assert beat.reason == "not online"
    services.worker_heartbeat_apply(worker=worker, beat=beat, throughput=1.0)
    assert Worker.objects.get(pk=worker.pk).status == Worker.Status.IDLE
    assert WorkerSession.objects.filter(worker=worker, ended_at=None).count() == 1
    assert not services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0).to_database


async def test_socket_heartbeats_stay_in_redis_and_the_fold_catches_the_database_up(eager):
    _, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await comm.send_json_to({"type": "hello", "agent_version": "test"})
    assert (await comm.receive_json_from())["type"] == "welcome"
    hello = (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).last_heartbeat
    for _ in range(3):
        await comm.send_json_to({"type": "heartbeat", "throughput": 1.0})
    await comm.send_json_to({"type": "lease_request", "job_id": 1})  # answered once the heartbeats are handled
    assert (await comm.receive_json_from())["type"] == "rejected"
    assert (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).last_heartbeat == hello
    seen = liveness.last_seen([worker.pk])[worker.pk]
    assert seen > hello.timestamp()
    await database_sync_to_async(tasks.fold_worker_heartbeats)()
    folded = (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).last_heartbeat
    assert folded.timestamp() == pytest.approx(seen, abs=1e-3)
    await comm.disconnect()


# ---- closes -------------------------------------------------------------------------------------------


async def test_a_closed_socket_ends_its_session_and_returns_its_leases_at_once(eager, redis_client):
    job, worker, key = await setup_job_and_worker()
    comm = await connect(key)
    await started_with(comm, job)
    PromptFeeder(redis_client, job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0, backlog=2).top_up()
    await comm.send_json_to({"type": "lease_request", "job_id": job.pk, "groups": 2})
    held = {x["lease_id"] for x in (await comm.receive_json_from())["leases"]}
    assert len(held) == 2

    await comm.disconnect()
    # the lease timeout is 30 s, yet another worker gets both prompts now
    other, _ = await database_sync_to_async(factories.worker)(await database_sync_to_async(factories.user)())
    again = await database_sync_to_async(lambda: replay.ReplayBuffer(redis_client, job.pk).lease(
        worker_id=other.pk, count=2, timeout_s=30.0))()
    assert {x.lease_id for x in again} == held
    assert (await database_sync_to_async(Worker.objects.get)(pk=worker.pk)).status == Worker.Status.OFFLINE
    sessions = await database_sync_to_async(lambda: list(WorkerSession.objects.filter(worker=worker)))()
    assert [s.ended_at is not None for s in sessions] == [True]
    assert not liveness.pending_closes()


def test_closes_are_queued_without_a_query_and_recorded_at_the_time_they_happened(settings,
                                                                                  django_assert_num_queries):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    sent = []
    from celery import current_app

    original = current_app.send_task
    current_app.send_task = lambda name, **kw: sent.append((name, kw.get("countdown")))
    try:
        workers = [connected() for _ in range(5)]
        WorkerSession.objects.update(started_at=timezone.now() - timedelta(hours=1))
        hellos = {w.pk: WorkerSession.objects.get(worker=w, ended_at=None).started_at for w in workers}
        closed_at = timezone.now() - timedelta(seconds=3)
        with django_assert_num_queries(0):
            for w in workers:
                services.worker_socket_closed(worker_id=w.pk, since=hellos[w.pk], at=closed_at)
    finally:
        current_app.send_task = original
    assert [name for name, _ in sent].count("marketplace.tasks.record_worker_closes") == 1  # coalesced
    assert liveness.pending_closes() == 5
    assert tasks.record_worker_closes() == 5
    for w in workers:
        session = WorkerSession.objects.get(worker=w)
        assert session.ended_at == closed_at
        assert Worker.objects.get(pk=w.pk).status == Worker.Status.OFFLINE
    assert liveness.pending_closes() == 0


def test_a_close_older_than_the_workers_new_socket_changes_nothing(eager):
    worker = connected()
    old_hello = WorkerSession.objects.get(worker=worker, ended_at=None).started_at
    services.worker_connected(worker=worker, installed_version=None)  # reconnected before the old close landed
    services.worker_socket_closed(worker_id=worker.pk, since=old_hello)
    tasks.fold_worker_heartbeats()  # the fold drains closes too
    assert Worker.objects.get(pk=worker.pk).status == Worker.Status.IDLE
    assert WorkerSession.objects.filter(worker=worker, ended_at=None).count() == 1


# ---- hellos ----------------------------------------------------------------------------------------------


def test_a_thousand_hellos_queue_one_provisioning_task_per_window(settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    # A window longer than the hellos take on any machine (20 of them took over a second on a loaded CI run); the
    # window's end is the key's deletion below, not the clock.
    monkeypatch.setattr(services.presence, "PROVISION_WINDOW_S", 600.0)
    sent = []
    from celery import current_app

    original = current_app.send_task
    current_app.send_task = lambda name, **kw: sent.append((name, kw.get("countdown")))
    try:
        workers = [factories.worker(factories.user())[0] for _ in range(20)]
        for w in workers:
            services.worker_connected(worker=w, installed_version=None)
        assert sent == [("marketplace.tasks.provision_waiting_jobs", 600.0)]
        liveness.stream.client().delete("echo2:coalesce:provision_waiting_jobs")  # the window ended
        services.worker_connected(worker=workers[0], installed_version=None)
        assert len(sent) == 2
    finally:
        current_app.send_task = original


# ---- site outages -----------------------------------------------------------------------------------------


def test_a_job_is_not_stalled_because_the_site_was_down(eager):
    eager.ECHO2 = {**eager.ECHO2, "LEARNER_TIMEOUT_S": 60.0}
    job = factories.job(factories.user())
    services.job_start(job=job)
    Job.objects.filter(pk=job.pk).update(learner_seen_at=timezone.now() - timedelta(seconds=90))
    client, now = liveness.stream.client(), time.time()
    worker = connected()
    # The site handled heartbeats until 100 s ago, then was down 99 s: the learner could not report either.
    services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, at=now - 200)
    services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, at=now - 100)
    assert tasks.stall_silent_learners() == 0  # down now: nothing is judged
    services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, at=now - 1)  # back
    assert float(client.get(liveness.SITE_UP_SINCE_KEY)) == pytest.approx(now - 1)
    assert tasks.stall_silent_learners() == 0  # up for 1 s: the learner's silence is not judged yet
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING

    client.set(liveness.SITE_UP_SINCE_KEY, now - 61)  # the site has been up a whole timeout, the learner silent
    assert tasks.stall_silent_learners() == 1
    assert Job.objects.get(pk=job.pk).status == Job.Status.STALLED


def test_a_worker_back_after_an_outage_rejoins_its_job_at_once(eager):
    worker = connected()
    activation = activated(worker)
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=60))
    liveness.stream.client().zadd(liveness.SEEN_KEY, {str(worker.pk): time.time() - 60})
    assert services.expire_silent_workers() == 1  # the site (or the link) was down a minute
    assert not Activation.objects.filter(worker=worker, ended_at=None).exists()
    assert Activation.objects.get(pk=activation.pk).end_code == Activation.End.LOST  # what lets it rejoin

    services.worker_connected(worker=Worker.objects.get(pk=worker.pk), installed_version=None)
    back = Activation.objects.get(worker=worker, ended_at=None)
    assert back.job_id == activation.job_id and back.pk != activation.pk
    assert Worker.objects.get(pk=worker.pk).status == Worker.Status.ACTIVE

    # Released by the scheduler (not by silence), it waits for the scheduler like anyone else.
    services.worker_release(activation=back, reason="capacity above the target")
    assert services.presence._rejoin(worker, at=timezone.now()) is None


def test_the_fold_never_waits_on_a_row_a_request_holds(eager):
    """A job's finish holding one worker's row while the fold runs (two site processes, a cancel during heartbeats)
    deadlocked against the fold's one UPDATE: the fold now writes the rows it can lock at once and leaves the held
    one to the next fold, which writes it."""
    import threading

    from django.db import connection, transaction

    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    held, free = connected(), connected()
    at = time.time() + 5
    for worker in (held, free):
        services.worker_heartbeat_record(worker_id=worker.pk, throughput=None, at=at)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            Worker.objects.select_for_update().get(pk=held.pk)
            locked.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(10)
    started = time.monotonic()
    services.worker_heartbeats_fold()
    assert time.monotonic() - started < 5  # did not wait for the lock
    assert Worker.objects.get(pk=free.pk).last_heartbeat.timestamp() == pytest.approx(at)
    assert Worker.objects.get(pk=held.pk).last_heartbeat.timestamp() < at
    release.set()
    holder.join(10)
    services.worker_heartbeat_record(worker_id=held.pk, throughput=None, at=at + 1)
    services.worker_heartbeats_fold()
    assert Worker.objects.get(pk=held.pk).last_heartbeat.timestamp() == pytest.approx(at + 1)
