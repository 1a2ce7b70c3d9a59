"""Hellos written together (``services.workers_connected``) against the same hellos written one by one
(``services.worker_connected``): the same replies and the same rows, in fewer statements."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dataplane.hardware import Hardware
from marketplace import services
from marketplace.infra import liveness
from marketplace.models import Activation, Job, Worker, WorkerSession

from . import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]
HOUR = timedelta(hours=1)


@pytest.fixture
def timeout(settings):
    """Provisioning is queued, not run: the scheduler placing the idle workers in the job is not the hellos' doing."""
    settings.ECHO2 = {**settings.ECHO2, "WORKER_TIMEOUT_S": 30.0}
    return settings


def fleet() -> tuple[list[services.Hello], dict[str, Worker], Job]:
    """Five workers as a reconnect finds them, and each one's hello: active in a running job; idle and new; with a
    session the site missed the end of; released for silence from the running job (it rejoins); idle and telling
    its hardware and user-code opt-in."""
    provider = factories.user()
    job = factories.job(factories.user())
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    job = Job.objects.get(pk=job.pk)
    workers = {kind: factories.worker(provider)[0] for kind in ("active", "idle", "stale", "lost", "hardware")}
    now = timezone.now()
    Worker.objects.filter(pk__in=[w.pk for w in workers.values()]).update(status=Worker.Status.IDLE, last_heartbeat=now)
    services.worker_activate(worker=workers["active"], job=job)
    WorkerSession.objects.create(worker=workers["stale"], started_at=now - HOUR)
    Worker.objects.filter(pk=workers["stale"].pk).update(last_heartbeat=now - timedelta(seconds=5))
    lost = services.worker_activate(worker=workers["lost"], job=job)
    Worker.objects.filter(pk=workers["lost"].pk).update(last_heartbeat=timezone.now() - timedelta(seconds=60))
    liveness.stream.client().zadd(liveness.SEEN_KEY, {str(workers["lost"].pk): time.time() - 60})
    services.expire_silent_workers()
    assert Activation.objects.get(pk=lost.pk).end_code == Activation.End.LOST
    hardware = Hardware(gpus=[{"name": "GPU 24 GB", "memory_gb": 24, "capability": "8.9"}], engines=["hf"],
                        cpu_count=8, ram_gb=64, disk_free_gb=500)
    at = timezone.now()
    fresh = {kind: Worker.objects.get(pk=w.pk) for kind, w in workers.items()}  # as each socket read its worker
    hellos = [services.Hello(worker=fresh[kind], installed_version=3 if kind == "active" else None, at=at,
                             hardware=hardware if kind == "hardware" else None,
                             allow_user_code=True if kind == "hardware" else None) for kind in workers]
    return hellos, fresh, job


def outcome(replies: list, workers: dict[str, Worker], job: Job, at) -> dict:
    """What the hellos (said at ``at``) did, by kind, with nothing that differs between two fleets (ids, times):
    each session as (open, begun by the hello, ended at the last heartbeat before it, 5 s earlier)."""
    ids = {w.pk: kind for kind, w in workers.items()}
    rows = {ids[w.pk]: w for w in Worker.objects.filter(pk__in=ids)}
    sessions = {kind: sorted((s.ended_at is None, s.started_at == at,
                              s.ended_at is not None and 4 < (at - s.ended_at).total_seconds() < 30)
                             for s in WorkerSession.objects.filter(worker=rows[kind])) for kind in rows}
    return {
        "replies": {ids[r[0].worker_id]: [(x.type, getattr(x, "job_id", None) == job.pk) for x in r] for r in replies},
        "workers": {kind: (w.status, w.installed_version, w.hardware, w.allow_user_code) for kind, w in rows.items()},
        "sessions": sessions,
        "active": sorted(ids[a.worker_id] for a in Activation.objects.filter(job=job, ended_at=None)),
    }


def test_hellos_together_give_what_each_alone_gives(timeout):
    alone, workers_alone, job_alone = fleet()
    with CaptureQueriesContext(connection) as alone_queries:
        replies_alone = [hello.alone() for hello in alone]
    together, workers_together, job_together = fleet()
    with CaptureQueriesContext(connection) as queries:
        replies_together = services.workers_connected(together)
    assert len(queries) < len(alone_queries)
    expected = outcome(replies_alone, workers_alone, job_alone, alone[0].at)
    assert outcome(replies_together, workers_together, job_together, together[0].at) == expected
    assert expected["active"] == ["active", "lost"]  # the one released for silence is back in its job
    assert expected["replies"]["active"] == [("welcome", False), ("assign", True)]
    assert expected["workers"]["hardware"][2]["gpus"][0]["memory_gb"] == 24
    assert expected["sessions"]["stale"] == [(False, False, True), (True, True, False)]  # ended then; a new one
    assert expected["sessions"]["idle"] == [(True, True, False)]
    assert not any(isinstance(r, BaseException) for r in replies_together)
    at = together[0].at
    assert {w.last_heartbeat for w in Worker.objects.filter(pk__in=[h.worker.pk for h in together])} == {at}


def test_a_rounds_statements_do_not_grow_with_its_hellos(timeout):
    def statements(count: int) -> int:
        provider = factories.user()
        hellos = [services.Hello(worker=factories.worker(provider)[0], installed_version=None, at=timezone.now())
                  for _ in range(count)]
        with CaptureQueriesContext(connection) as queries:
            outcomes = services.workers_connected(hellos)
        assert [[r.type for r in replies] for replies in outcomes] == [["welcome"]] * count
        return len(queries)

    assert statements(3) == statements(12)  # alone, each hello is a transaction of its own five or more


def test_one_bad_hello_costs_the_others_nothing(timeout):
    provider = factories.user()
    hellos = [services.Hello(worker=factories.worker(provider)[0], installed_version=None, at=timezone.now())
              for _ in range(3)]
    Worker.objects.filter(pk=hellos[1].worker.pk).delete()  # removed while its socket said hello
    outcomes = services.workers_connected(hellos)
    assert isinstance(outcomes[1], Exception)
    assert [r[0].type for i, r in enumerate(outcomes) if i != 1] == ["welcome", "welcome"]
    assert WorkerSession.objects.filter(worker_id__in=[hellos[0].worker.pk, hellos[2].worker.pk],
                                        ended_at=None).count() == 2
