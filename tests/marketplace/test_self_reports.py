"""Believe no self-report in scheduling or billing: an agent that never leases and heartbeats
``{"state": "generating", "throughput": 999999}`` is not planned with that figure, is released once it has returned
nothing past the silence bound, and is billed nothing for the silence; one child's ``relay_failed`` neither marks its
parent failed nor promotes the child toward the seeds."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from dataplane.broadcast import chains
from marketplace import services, tasks
from marketplace.core import billing
from marketplace.infra import liveness, stream, telemetry
from marketplace.models import Activation, Job, Worker, WorkerCalibration
from marketplace.reads import scheduling
from marketplace.services import fanout

from . import factories
from .test_billing import age_leases
from .test_broadcast import make_workers, publish, pushes, running_job  # noqa: F401 (pushes: a fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

LIE = 999_999.0

# ---- the rules, with explicit times ---------------------------------------------------------------------------


def test_the_state_billed_is_what_the_site_saw():
    rule = {"started": 100.0, "held_since": None, "held_until": None}
    assert billing.observed_state(reported="generating", installed=None, now=150.0, **rule) == \
        ("loading", 150.0)  # no install reported: free, whatever it says
    assert billing.observed_state(reported="generating", installed=110.0, now=150.0, **rule) == \
        ("idle", 150.0)  # installed, never leased
    held = {**rule, "held_since": 140.0}
    assert billing.observed_state(reported="idle", installed=110.0, now=150.0, **held) == \
        ("generating", 140.0)  # a lease outstanding since 140: working from then, whatever it says
    assert billing.observed_state(reported="idle", installed=110.0, now=150.0, connected=False, **held) == \
        ("idle", 150.0)  # its socket closed: nothing it holds can be delivered
    ended = {**rule, "held_until": 145.0}
    assert billing.observed_state(reported="generating", installed=110.0, now=150.0, **ended) == \
        ("idle", 145.0)  # billed until its last lease ended (its group accepted, or its timeout), not a hold after
    assert billing.observed_state(reported="failed", installed=110.0, now=150.0, **held) == \
        ("failed", 150.0)  # its own word against itself is believed
    assert billing.observed_state(reported="idle", installed=90.0, now=150.0, **rule) == \
        ("loading", 150.0)  # what it did in an earlier activation does not count


def test_a_lease_is_held_from_its_delivery_until_its_group_is_accepted_or_its_timeout():
    assert telemetry.lease_hold([], accepted=None, now=100.0, timeout_s=30.0) == (None, None)
    assert telemetry.lease_hold([4.0, 9.0], accepted=80.0, now=100.0, timeout_s=30.0) == (91.0, 80.0)
    assert telemetry.lease_hold([], accepted=97.5, now=100.0, timeout_s=30.0) == (None, 97.5)  # answered at 97.5
    assert telemetry.lease_hold([45.0], accepted=60.0, now=100.0, timeout_s=30.0) == (None, 85.0)  # expired at 85


def test_the_silence_bound_and_its_reasons():
    assert billing.silence_bound_s(min_s=180.0, groups=5, group_size=8, throughput=None) == 180.0
    assert billing.silence_bound_s(min_s=180.0, groups=5, group_size=8, throughput=0.1) == pytest.approx(400.0)
    rule = {"started": 0.0, "bound_s": 180.0, "loading_bound_s": 900.0}
    assert billing.silent_reason(installed=None, accepted=None, now=899.0, **rule) == ""
    assert billing.silent_reason(installed=None, accepted=None, now=901.0, **rule) == \
        "silent: no install reported in 900 s"
    assert billing.silent_reason(installed=10.0, accepted=None, now=189.0, **rule) == ""
    assert billing.silent_reason(installed=10.0, accepted=None, now=191.0, **rule) == \
        "silent: no group accepted for 180 s"
    assert billing.silent_reason(installed=10.0, accepted=100.0, now=279.0, **rule) == ""
    assert billing.silent_reason(installed=10.0, accepted=None, starved=100.0, now=279.0, **rule) == ""  # no work


# ---- the scheduler ---------------------------------------------------------------------------------------------


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "REPLAN_INTERVAL_S": 30.0, "RELEASE_MARGIN": 0.25,
                      "HEARTBEAT_INTERVAL_S": 2.0, "WORKER_TIMEOUT_S": 30.0, "LEASE_TIMEOUT_S": 30.0,
                      "SILENT_RELEASE_S": 180.0, "SILENT_RELEASE_GROUPS": 5.0, "LOADING_RELEASE_S": 900.0}
    return settings


def active_for(worker: Worker, job: Job, seconds: float) -> Activation:
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.ACTIVE)
    return Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour,
                                     started_at=timezone.now() - timedelta(seconds=seconds))


def lies(worker: Worker, *, now: float, seconds: float = 60.0) -> None:
    """Heartbeats every 2 s claiming LIE trajectories/s; nothing else."""
    for t in range(int(seconds), -1, -2):
        telemetry.record_heartbeat(worker.pk, at=now - t, throughput=LIE)


def delivers(worker: Worker, job: Job, rate: float, *, now: float, seconds: float = 60.0) -> None:
    """Heartbeats every 2 s, and the site accepts ``rate`` trajectories/s from the worker."""
    for t in range(int(seconds), -1, -2):
        telemetry.record_heartbeat(worker.pk, at=now - t, throughput=rate)
        telemetry.record_accepted(worker.pk, job_id=job.pk, at=now - t, records=round(2 * rate))


def test_a_liar_is_not_preferred_over_an_honest_worker(eager):
    owner, provider = factories.user(), factories.user()
    # kappa = 2, R = 64, T_train = 10 s: mu_min = 6.4, target = 7.04 traj/s; release above 8.8.
    job = factories.job(owner, staleness=3, batch_trajectories=64, group_size=8)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, learner_t_train=10.0)
    job.refresh_from_db()
    honest, _ = factories.worker(provider, price="1.0")
    liar, _ = factories.worker(provider, price="0.5")
    WorkerCalibration.objects.create(worker=liar, model_dir=job.model_dir, task_name="arithmetic", throughput=LIE)
    active_for(honest, job, 120)
    active_for(liar, job, 120)
    now = time.time()
    delivers(honest, job, 8.0, now=now)
    lies(liar, now=now)

    pool = scheduling.job_pool(job, now=now)
    mu = {c.worker_id: c.throughput for c in pool.active}
    assert mu[liar.pk] is None and pool.sources[liar.pk] == "measured"  # a window active, nothing accepted
    assert mu[honest.pk] == pytest.approx(8.0, rel=0.1)
    assert tasks.replan(job, now=now).release == ()
    delivers(honest, job, 8.0, now=now + 31, seconds=31)
    lies(liar, now=now + 31, seconds=31)
    decision = tasks.replan(job, now=now + 31)
    assert honest.pk not in decision.release  # the plan keeps the worker that delivers
    assert Activation.objects.filter(worker=honest, ended_at=None).exists()

    # A new worker's benchmark is a prior, capped by what the site measured of this job's workers.
    newcomer, _ = factories.worker(provider, price="0.4")
    Worker.objects.filter(pk=newcomer.pk).update(status=Worker.Status.IDLE)
    WorkerCalibration.objects.create(worker=newcomer, model_dir=job.model_dir, task_name="arithmetic",
                                     throughput=LIE)
    pool = scheduling.job_pool(job, now=now + 31)
    prior = next(c for c in pool.standby if c.worker_id == newcomer.pk)
    assert pool.sources[newcomer.pk] == "calibration" and prior.throughput == pytest.approx(8.0, rel=0.1)


# ---- the silence bound and the bill -----------------------------------------------------------------------------


def lying_worker(job: Job, *, started_s: float, installed_s: float | None) -> tuple[Worker, Activation]:
    """A connected worker active in ``job`` for ``started_s``, whose install (if any) the site saw ``installed_s``
    ago; it never leases."""
    worker, _ = factories.worker(factories.user())
    services.worker_connected(worker=worker, installed_version=None)
    activation = active_for(worker, job, started_s)
    Activation.objects.filter(pk=activation.pk).update(reported_at=activation.started_at)
    if installed_s is not None:
        telemetry.record_observed(worker.pk, job_id=job.pk, what="installed", at=time.time() - installed_s)
    return worker, Activation.objects.get(pk=activation.pk)


def beat(worker: Worker, job: Job, state: str = "generating", *, since_report_s: float = 10.0) -> Activation:
    """A heartbeat claiming ``state`` and LIE, its last report ``since_report_s`` ago (the gap billing bills)."""
    Activation.objects.filter(worker=worker, ended_at=None).update(
        reported_at=timezone.now() - timedelta(seconds=since_report_s))
    services.worker_heartbeat(worker=Worker.objects.get(pk=worker.pk), throughput=LIE, state=state, job_id=job.pk)
    return Activation.objects.filter(worker=worker, job=job).order_by("-pk").first()


def running() -> Job:
    job = factories.job(factories.user())
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    return Job.objects.get(pk=job.pk)


def test_a_liar_that_never_installs_is_billed_nothing_and_released(eager):
    job = running()
    liar, _ = lying_worker(job, started_s=100, installed_s=None)
    for _ in range(3):
        row = beat(liar, job)
        assert row.ended_at is None and row.billed_seconds == 0.0 and row.state == "loading"
    Activation.objects.filter(pk=row.pk).update(started_at=timezone.now() - timedelta(seconds=901))
    row = beat(liar, job)
    assert row.ended_at is not None and row.end_reason == "silent: no install reported in 900 s"
    assert row.billed_seconds == 0.0


def test_a_silent_worker_is_billed_nothing_and_released_after_the_bound(eager):
    job = running()
    liar, _ = lying_worker(job, started_s=100, installed_s=99)
    for _ in range(3):
        row = beat(liar, job)
        assert row.ended_at is None and row.billed_seconds == 0.0 and row.state == "idle"

    telemetry.record_observed(liar.pk, job_id=job.pk, what="installed", at=time.time() - 181)
    Activation.objects.filter(pk=row.pk).update(started_at=timezone.now() - timedelta(seconds=190))
    row = beat(liar, job)
    assert row.ended_at is not None and row.end_reason == "silent: no group accepted for 180 s"
    assert row.billed_seconds == 0.0


def test_the_honest_worker_beside_it_is_billed_and_kept(eager):
    job = running()
    honest, _ = lying_worker(job, started_s=190, installed_s=181)
    stream.replay(job.pk).ensure_groups()
    stream.replay(job.pk).add_prompts(["1+1="])
    assert services.prompts_lease(worker=honest, job_id=job.pk, groups=1).leases  # a lease outstanding
    telemetry.record_accepted(honest.pk, job_id=job.pk, at=time.time() - 2, records=job.settings.group_size)
    row = beat(honest, job, "idle")  # it says idle; the site saw it work
    assert row.ended_at is None and row.state == "generating"
    age_leases(job.pk, 10.0)  # the lease spans the 10 s since the last report
    row = beat(honest, job, "idle")
    assert row.billed_seconds == pytest.approx(10.0, abs=0.5)


def test_expiry_releases_the_silent_whatever_their_heartbeats_say(eager):
    job = running()
    quiet, _ = lying_worker(job, started_s=200, installed_s=199)  # installed, then nothing
    never, _ = lying_worker(job, started_s=901, installed_s=None)  # never installed
    fresh, _ = lying_worker(job, started_s=100, installed_s=99)  # within the bound
    starving, _ = lying_worker(job, started_s=200, installed_s=199)  # installed, and asks for work the job lacks
    services.prompts_lease(worker=starving, job_id=job.pk, groups=1)
    for worker in (quiet, never, fresh, starving):
        liveness.mark_online(worker.pk, at=time.time())
        Worker.objects.filter(pk=worker.pk).update(last_heartbeat=timezone.now())
    assert services.expire_silent_workers() == 0  # nobody went offline
    ended = dict(Activation.objects.filter(job=job).values_list("worker_id", "end_reason"))
    assert ended == {quiet.pk: "silent: no group accepted for 180 s", never.pk: "silent: no install reported in 900 s",
                     fresh.pk: "", starving.pk: ""}
    assert set(Activation.objects.filter(job=job).values_list("billed_seconds", flat=True)) == {0.0}


# ---- relay failures --------------------------------------------------------------------------------------------


def live(*workers: Worker) -> None:
    """Each worker heartbeats now: not silent."""
    for worker in workers:
        liveness.mark_online(worker.pk, at=time.time())
        Worker.objects.filter(pk=worker.pk).update(last_heartbeat=timezone.now())


def report(child: int, parent: int, job: Job) -> None:
    services.relay_failed(worker=Worker.objects.get(pk=child), job_id=job.pk, version=1, culprit_worker_id=parent,
                          reason="stalled")


def test_one_childs_word_neither_marks_its_parent_nor_takes_its_place(pushes):  # noqa: F811
    workers = make_workers(2)
    job = running_job(workers, b0=1000)  # one chain of two
    live(*workers)
    publish(job, 1)
    seed, child = telemetry.load_chain_plan(job.pk, 1).chains[0]
    report(child, seed, job)
    plan = telemetry.load_chain_plan(job.pk, 1)
    # The seed stays; the reporter pulls from the learner's spare relay slot (the learner's HTTP fallback otherwise:
    # the same learner either way), heading a chain of its own.
    assert plan.chains == ((seed,), (child,)) and not plan.rollout_only
    assert pushes[child][-1].parent == job.learner_relay and pushes[child][-1].parent_worker_id is None
    assert pushes[seed][-1].children == []  # told its child is gone
    assert Worker.objects.get(pk=seed).relay_failures == 0


def test_two_children_confirm_a_failure(pushes):  # noqa: F811
    workers = make_workers(4)
    job = running_job(workers, b0=1000)
    live(*workers)
    publish(job, 1)
    seed, middle, tail, last = telemetry.load_chain_plan(job.pk, 1).chains[0]
    # No relay can take the reporter (one chain, and an announcement too old to say the learner's fan-out): it goes
    # to HTTP, and its own child to the accused.
    stream.client().delete(fanout._record_key(job.pk, 1))
    report(tail, middle, job)
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((seed, middle, last),)
    assert Worker.objects.get(pk=middle).relay_failures == 0
    report(last, middle, job)  # a second child of the same parent says so too
    plan = telemetry.load_chain_plan(job.pk, 1)
    assert plan.chains == ((seed, last),) and Worker.objects.get(pk=middle).relay_failures == 1


def test_a_silent_parent_is_confirmed_by_one_child(pushes, settings):  # noqa: F811
    settings.ECHO2 = {**settings.ECHO2, "RELAY_PARENT_SILENT_S": 60.0}
    workers = make_workers(3)
    job = running_job(workers, b0=1000)
    live(*workers)
    publish(job, 1)
    seed, middle, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    liveness.stream.client().zadd(liveness.SEEN_KEY, {str(middle): time.time() - 120})
    Worker.objects.filter(pk=middle).update(last_heartbeat=timezone.now() - timedelta(seconds=120))
    report(tail, middle, job)
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((seed, tail),)
    assert Worker.objects.get(pk=middle).relay_failures == 1
    assert pushes[tail][-1].parent_worker_id == seed


def test_detach_moves_the_reporter_out_and_its_child_up():
    plan = chains.ChainPlan(chains=((1, 2, 3),), rollout_only=(9,))
    new, moves = chains.detach(plan, 2)
    assert new == chains.ChainPlan(chains=((1, 3),), rollout_only=(9, 2)) and moves == [(3, 1)]
