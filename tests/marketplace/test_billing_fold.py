"""The billing fold (``presence.activations_release_silent``, every expiry beat): a generating worker's bill is brought
up to date with many others' in a fixed number of statements per job, so its heartbeat stays in Redis when its
periodic report is due; the heartbeats report again once the fold stops. The fold bills what reports made one at a
time bill, to the last digit, each second once when it runs twice or fails midway, and it never deadlocks with a
job's finish."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from channels.db import database_sync_to_async
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from marketplace import services
from marketplace.infra import liveness, stream, telemetry
from marketplace.models import Activation, Job, LedgerEntry, Worker
from marketplace.services import billing as billing_service
from marketplace.services import presence

from ..statements import Statements
from . import factories
from .test_billing import age_leases
from .test_billing_leases import working

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 30.0, "HEARTBEAT_DB_SYNC_S": 10.0,
                      "LEASE_TIMEOUT_S": 60.0, "AGENT_STATE_MAX_AGE_S": 3600.0}  # a socket holds its job throughout
    return settings


def running_job() -> Job:
    job = factories.job(factories.user())
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    stream.replay(job.pk).ensure_groups()
    return Job.objects.get(pk=job.pk)


def generating(job: Job, count: int, *, held_s: float = 10.0, backwards: bool = False) -> list[Activation]:
    """``count`` workers active in ``job``, installed, each holding one lease taken ``held_s`` seconds ago, when
    their bills were last brought up to date (then generating); in worker id order, activated in it (or, with
    ``backwards``, the other way round)."""
    provider, now = factories.user(), time.time()
    workers = [factories.worker(provider)[0] for _ in range(count)]
    # online without a hello (which would offer them to the running job through the scheduler)
    Worker.objects.filter(pk__in=[w.pk for w in workers]).update(status=Worker.Status.IDLE,
                                                                 last_heartbeat=datetime.now(tz=UTC))
    activations = []
    for worker in reversed(workers) if backwards else workers:
        liveness.mark_online(worker.pk, at=now)
        activations.append(services.worker_activate(worker=worker, job=job))
    activations.sort(key=lambda a: a.worker_id)
    back = datetime.fromtimestamp(now - held_s, tz=UTC)
    Activation.objects.filter(pk__in=[a.pk for a in activations]).update(
        started_at=back - timedelta(seconds=50), reported_at=back, state="generating", state_since=back)
    replay = stream.replay(job.pk)
    replay.add_prompts([f"{i}+1=" for i in range(count)])
    for activation in activations:
        telemetry.record_observed(activation.worker_id, job_id=job.pk, what="installed", at=now - held_s - 40)
        replay.lease(worker_id=activation.worker_id, count=1, timeout_s=60)
    age_leases(job.pk, held_s)
    return [Activation.objects.get(pk=a.pk) for a in activations]


def assert_exact(activation_id: int) -> None:
    """The activation's running sums are its ledger's, and no two of its entries overlap (no second billed twice)."""
    row = Activation.objects.get(pk=activation_id)
    entries = list(LedgerEntry.objects.filter(activation_id=activation_id).order_by("started_at", "id"))
    assert sum(e.amount for e in entries) == row.billed_usd
    assert float(sum(e.seconds for e in entries)) == pytest.approx(row.billed_seconds, abs=1e-5)
    assert all(b.started_at >= a.at for a, b in zip(entries, entries[1:], strict=False))


def fold_statements(workers: int) -> tuple[list[Activation], int]:
    """A running job of ``workers`` generating workers (the only one running): the SQL statements of one fold."""
    Job.objects.filter(status=Job.Status.RUNNING).update(status=Job.Status.COMPLETED)
    activations = generating(running_job(), workers)
    with CaptureQueriesContext(connection) as queries:
        assert presence.activations_release_silent() == 0
    return activations, sum(q["sql"] not in ("BEGIN", "COMMIT") for q in queries.captured_queries)


def test_the_fold_bills_many_workers_in_as_many_statements_as_two(eager):
    _, two = fold_statements(2)
    activations, twelve = fold_statements(12)
    # one read of the open activations; per job: its row, the workers', the activations', one UPDATE, one INSERT
    assert twelve == two == 6
    for activation in activations:
        row = Activation.objects.get(pk=activation.pk)
        assert row.state == "generating" and row.billed_seconds == pytest.approx(10.0, abs=0.5)
        assert LedgerEntry.objects.filter(activation=activation).count() == 1
        assert_exact(row.pk)
    assert liveness.stream.client().exists(*[liveness._billed_key(a.worker_id) for a in activations]) == 12


def test_the_fold_bills_what_reports_one_at_a_time_bill_to_the_last_digit(eager):
    """Each case billed twice, on twin activations: report by report (``activation_observe``, what a release or a
    heartbeat does) and by the fold. Leases with waits between them, none held now, a socket closed, an install
    never reported, a failing rollout loop."""
    job = running_job()
    now = time.time()
    at = datetime.fromtimestamp(now, tz=UTC)
    spans = ((now - 9.876543, now - 7.1), (now - 5.5, now - 2.500001))
    cases = [
        dict(seen=telemetry.Observed(installed=now - 59, held_since=now - 1.234567, held_until=now - 2.500001,
                                     holds=spans)),
        dict(seen=telemetry.Observed(installed=now - 59, held_until=now - 2.500001, holds=spans)),
        dict(seen=telemetry.Observed(installed=now - 59, held_since=now - 1.2, holds=spans), connected=False),
        dict(seen=telemetry.Observed(held_since=now - 1.2, holds=spans)),
        dict(seen=telemetry.Observed(installed=now - 59, held_since=now - 1.2, holds=spans), reported="failed",
             reason="RuntimeError: CUDA error"),
    ]
    for case in cases:
        one, two = generating(job, 2)
        Worker.objects.filter(pk__in=[one.worker_id, two.worker_id]).update(price_per_hour="0.3712")
        Activation.objects.filter(pk__in=[one.pk, two.pk]).update(price_per_hour="0.3712")
        one.refresh_from_db()
        billing_service.activation_observe(activation=one, at=at, **case)
        bills = billing_service.activations_bill(job_id=job.pk, at=at, observations=[billing_service.Observation(
            activation_id=two.pk, worker_id=two.worker_id, **case)])
        fields = ("state", "state_since", "state_reason", "reported_at", "billed_seconds", "billed_usd")
        by_report, by_fold = (Activation.objects.filter(pk=pk).values(*fields).get() for pk in (one.pk, two.pk))
        assert by_report == by_fold, case
        assert bills[two.pk].billed_usd == by_fold["billed_usd"]
        entry = ("state", "started_at", "at", "seconds", "rate", "amount")
        assert (list(LedgerEntry.objects.filter(activation=one).order_by("id").values_list(*entry))
                == list(LedgerEntry.objects.filter(activation=two).order_by("id").values_list(*entry))), case
        assert_exact(two.pk)
    assert LedgerEntry.objects.filter(job=job, state="generating").count() > len(cases)  # the cases bill something


def test_a_fold_run_twice_or_cut_off_bills_each_second_once(eager):
    job = running_job()
    (activation,) = generating(job, 1)
    leased_at = time.time() - 10.0
    worker = Worker.objects.get(pk=activation.worker_id)
    beat = services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, state="generating", job_id=job.pk)
    assert beat.reason == "state changed"  # its first heartbeat in the job: the database hears of it
    services.worker_heartbeat_apply(worker=worker, beat=beat, throughput=1.0, state="generating", job_id=job.pk)
    billed = Activation.objects.get(pk=activation.pk).billed_seconds
    assert billed == pytest.approx(10.0, abs=0.5)
    eager.STREAMS_REDIS_URL = "redis://127.0.0.1:1/0"  # Redis unreachable: the fold fails before it writes anything
    stream.client.cache_clear()
    try:
        with pytest.raises(redis.ConnectionError):
            presence.activations_release_silent()
    finally:
        eager.STREAMS_REDIS_URL = ""
        stream.client.cache_clear()
    assert Activation.objects.get(pk=activation.pk).billed_seconds == billed
    assert LedgerEntry.objects.filter(activation=activation).count() == 1

    now = datetime.now(tz=UTC)
    presence.activations_release_silent(now=now)
    entries = LedgerEntry.objects.filter(activation=activation).count()
    presence.activations_release_silent(now=now)  # a task run again (acks late) bills nothing more
    assert LedgerEntry.objects.filter(activation=activation).count() == entries == 2
    assert Activation.objects.get(pk=activation.pk).billed_seconds == pytest.approx(now.timestamp() - leased_at,
                                                                                     abs=0.5)

    # Its mark never reached Redis (a crash after the commit): the worker's heartbeats report for themselves, from
    # where the fold's bill stopped.
    client = liveness.stream.client()
    client.delete(liveness._billed_key(activation.worker_id), liveness._sync_key(activation.worker_id))
    beat = services.worker_heartbeat_record(worker_id=worker.pk, throughput=1.0, state="generating", job_id=job.pk)
    assert beat.reason == "report due"
    services.worker_heartbeat_apply(worker=worker, beat=beat, throughput=1.0, state="generating", job_id=job.pk)
    presence.activations_release_silent()
    row = Activation.objects.get(pk=activation.pk)
    assert row.billed_seconds == pytest.approx(time.time() - leased_at, abs=0.5)
    assert_exact(row.pk)


async def test_a_report_due_heartbeat_reaches_no_database_while_the_fold_bills(eager, redis_client):
    job, comm, _, leased_at = await working(redis_client)
    worker_id = await database_sync_to_async(lambda: Activation.objects.get(job=job).worker_id)()
    fold = database_sync_to_async(presence.activations_release_silent)
    counted = Statements()
    await database_sync_to_async(counted.install)()
    beat = {"type": "heartbeat", "throughput": 1.0, "state": "generating", "job_id": job.pk}

    async def statements(*frames: dict) -> int:
        """Statements until the frames are handled: a lease request after them is answered once they are."""
        before = counted.count
        for frame in (*frames, {"type": "lease_request", "job_id": job.pk}):
            await comm.send_json_to(frame)
        assert (await comm.receive_json_from(timeout=10))["type"] == "no_work"
        return counted.count - before

    try:
        await statements(beat)  # its first heartbeat in the job: the state it reports is new, the database hears it
        await fold()  # the fold billed it just now
        lease_only = await statements()
        liveness.stream.client().delete(liveness._sync_key(worker_id))  # its report period ran out
        assert await statements(beat) - lease_only == 0  # a report due before: 7-8 statements on the socket's path
        await fold()
        row = await database_sync_to_async(Activation.objects.get)(job=job)
        assert row.state == "generating"
        assert row.billed_seconds == pytest.approx(time.time() - leased_at, abs=0.5)

        # The fold stopped (Celery away): its mark runs out, and the heartbeat reports itself again.
        liveness.stream.client().delete(liveness._billed_key(worker_id))
        assert await statements(beat) - lease_only >= 5
        row = await database_sync_to_async(Activation.objects.get)(job=job)
        assert row.billed_seconds == pytest.approx(time.time() - leased_at, abs=0.5)
        await database_sync_to_async(assert_exact)(row.pk)
    finally:
        await database_sync_to_async(counted.uninstall)()
        await comm.disconnect()


def test_the_fold_bills_beside_a_finish_that_holds_the_job_and_never_deadlocks(eager):
    """A cancel holds the job's row and its first worker's activation while it waits for that worker's row (held
    by someone else a moment); the fold comes meanwhile. Billing the other worker there (its activation updated,
    then its ledger entry waiting for the job's row) deadlocked with the cancel's next release when the cancel held
    the job's row ``FOR UPDATE``. Every lock of a job's row is ``FOR NO KEY UPDATE`` now, which a ledger entry's
    foreign key check does not wait for: the fold bills the other worker and ends while the cancel still waits."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    job = running_job()
    # The cancel releases in worker id order, the fold looked at activations in the order it read them: by id.
    first, later = generating(job, 2, held_s=12.0, backwards=True)
    assert first.worker_id < later.worker_id and first.pk > later.pk
    # the first was billed a moment ago (by its heartbeat): a fold that bills the due alone bills the later first
    Activation.objects.filter(pk=first.pk).update(reported_at=datetime.now(tz=UTC) - timedelta(seconds=1))
    held, go_on, outcome = threading.Event(), threading.Event(), {}

    def run(name: str, fn) -> threading.Thread:
        def body() -> None:
            try:
                fn()
                outcome[name] = "ok"
            except Exception as err:  # noqa: BLE001 - the test reports what each side met
                outcome[name] = err
            finally:
                connection.close()

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    def hold_worker() -> None:
        with transaction.atomic():
            Worker.objects.select_for_update().get(pk=first.worker_id)
            held.set()
            go_on.wait(60)

    def waiting() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock'")
            return cursor.fetchone()[0]

    def until(n: int) -> None:
        deadline = time.monotonic() + 60
        while waiting() < n:
            assert time.monotonic() < deadline, f"{waiting()} transactions waiting for a lock, not {n}"
            time.sleep(0.05)

    holder = run("holder", hold_worker)
    assert held.wait(30)
    cancel = run("cancel", lambda: services.job_finish(job=Job.objects.get(pk=job.pk), status=Job.Status.CANCELLED))
    until(1)  # the cancel holds the job's row and waits for the first worker's
    fold = run("fold", presence.activations_release_silent)
    fold.join(60)
    assert outcome.get("fold") == "ok" and waiting() == 1  # done, the cancel still waiting for the worker's row
    go_on.set()
    for thread in (holder, cancel):
        thread.join(60)
    assert outcome == {"holder": "ok", "cancel": "ok", "fold": "ok"}
    for activation, billed in ((first, 1.0), (later, 12.0)):
        row = Activation.objects.get(pk=activation.pk)
        assert row.ended_at is not None and row.billed_seconds >= billed - 0.5
        assert_exact(row.pk)
