"""The scheduler against a real database and Redis: plans, and activation/release with hysteresis."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from marketplace import services, tasks
from marketplace.infra import telemetry
from marketplace.models import Activation, Job, Worker, WorkerCalibration
from marketplace.reads import scheduling

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "REPLAN_INTERVAL_S": 30.0, "RELEASE_MARGIN": 0.25,
                      "HEARTBEAT_INTERVAL_S": 2.0}
    return settings


def idle_worker(provider, price: str, *, calibrated: float | None, model_dir: str | None = None) -> Worker:
    worker, _ = factories.worker(provider, price=price)
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.IDLE)
    if calibrated is not None:
        WorkerCalibration.objects.create(worker=worker, model_dir=model_dir or factories.checkpoint_dir(),
                                         task_name="arithmetic",
                                         throughput=calibrated)
    worker.refresh_from_db()
    return worker


def beat(worker: Worker, throughput: float, *, until: float, seconds: float = 60.0, interval: float = 2.0,
         job: Job | None = None) -> None:
    """Heartbeats claiming ``throughput``; with ``job``, the site also accepts that many trajectories per second
    from the worker (what the scheduler believes)."""
    t = until - seconds
    while t <= until:
        telemetry.record_heartbeat(worker.pk, at=t, throughput=throughput)
        if job is not None:
            telemetry.record_accepted(worker.pk, job_id=job.pk, at=t, records=round(throughput * interval))
        t += interval


def test_plan_before_calibration_says_so(eager):
    owner = factories.user()
    job = factories.job(owner)
    plan = scheduling.job_plan(job)
    assert plan["report"]["feasible"] is None and "calibrating" in plan["report"]["reason"]


def test_plan_offers_the_cheapest_set_and_the_greedy_alternative(eager):
    owner, provider = factories.user(), factories.user()
    job = factories.job(owner, staleness=3, batch_trajectories=64, group_size=8)
    # kappa = 2, R = 64, T_train = 10 s, T_bcast = 4 s: mu_min = 2*64/(2*10-4) = 8, target = 1.1*8 = 8.8 traj/s.
    job.learner_t_train = 10.0
    job.save()
    # Greedy by unit cost takes the 5/h worker at rho=0.5 first (mu 10 covers it alone); exact agrees here.
    a = idle_worker(provider, "5.0", calibrated=10.0)
    b = idle_worker(provider, "4.0", calibrated=6.0)
    c = idle_worker(provider, "1.2", calibrated=3.0)
    idle_worker(provider, "0.1", calibrated=None)  # unmeasured: reported, not planned
    services.job_start(job=job)
    Activation.objects.filter(job=job).update(ended_at=job.started_at)  # plan from a clean slate
    job.snapshots.create(version=1, url="http://x/v1/", manifest={}, t_bcast=4.0)

    reply = APIClient()
    reply.force_authenticate(owner)
    plan = reply.get(f"/api/jobs/{job.pk}/plan/").json()
    assert plan["report"]["mu_min"] == pytest.approx(8.0) and plan["report"]["target"] == pytest.approx(8.8)
    assert plan["report"]["max_lag"] == 3 and plan["report"]["feasible"] is True  # 2 + ceil(0.5 * 0.4) = 3 <= S
    assert [w["name"] for w in plan["unmeasured"]] == [Worker.objects.order_by("-pk").first().name]
    greedy = {w["id"] for w in plan["greedy"]["workers"]}
    exact = {w["id"] for w in plan["plan"]["workers"]}
    assert plan["plan"]["price_per_hour"] <= plan["greedy"]["price_per_hour"]
    assert sum(w["throughput"] for w in plan["plan"]["workers"]) >= 8.8
    assert greedy == {a.pk} or greedy <= {a.pk, b.pk, c.pk}
    assert exact <= {a.pk, b.pk, c.pk}
    other = APIClient()
    other.force_authenticate(factories.user())
    assert other.get(f"/api/jobs/{job.pk}/plan/").status_code == 404


def test_replan_acts_only_on_a_sustained_deficit_then_releases_surplus(eager, django_capture_on_commit_callbacks):
    owner, provider = factories.user(), factories.user()
    job = factories.job(owner, staleness=3, batch_trajectories=64, group_size=8)
    active = idle_worker(provider, "1.0", calibrated=None)
    with django_capture_on_commit_callbacks(execute=True):
        services.job_start(job=job)  # calibration phase: every idle worker joins
    assert list(job.activations.values_list("worker_id", flat=True)) == [active.pk]
    cheap = idle_worker(provider, "0.5", calibrated=5.0)
    pricey = idle_worker(provider, "3.0", calibrated=5.0)
    job.learner_t_train = 10.0  # no T_bcast yet (0): mu_min = 2*64/(2*10) = 6.4, target = 1.1*6.4 = 7.04
    job.save()
    now = time.time()

    beat(active, 4.0, until=now, job=job)  # live capacity 4 < target 7.04
    assert tasks.replan(job, now=now).activate == ()  # the deficit has to last
    beat(active, 4.0, until=now + 20, seconds=20, job=job)
    assert tasks.replan(job, now=now + 20).activate == ()
    beat(active, 4.0, until=now + 31, seconds=11, job=job)
    decision = tasks.replan(job, now=now + 31)
    assert decision.activate == (cheap.pk,)  # cheapest unit cost covering the deficit of 3.04
    assert Activation.objects.get(worker=cheap, ended_at=None).job_id == job.pk

    # Now everyone delivers far more than needed: after the interval the priciest per unit goes.
    services.worker_activate(worker=pricey, job=job)
    for worker in (active, cheap, pricey):
        beat(worker, 20.0, until=now + 100, seconds=60, job=job)
    assert tasks.replan(job, now=now + 100).release == ()
    for worker in (active, cheap, pricey):
        beat(worker, 20.0, until=now + 131, seconds=31, job=job)
    decision = tasks.replan(job, now=now + 131)
    assert pricey.pk in decision.release and cheap.pk not in decision.release
    ended = Activation.objects.get(worker=pricey)
    assert ended.ended_at is not None and ended.end_reason.startswith("capacity above target: "), ended.end_reason
    assert Worker.objects.get(pk=pricey.pk).status == Worker.Status.IDLE


def test_the_clocks_are_saved_on_the_job_with_the_changes_they_led_to(eager, django_capture_on_commit_callbacks,
                                                                       redis_client):
    owner, provider = factories.user(), factories.user()
    job = factories.job(owner, staleness=3, batch_trajectories=64, group_size=8)
    active = idle_worker(provider, "1.0", calibrated=None)
    with django_capture_on_commit_callbacks(execute=True):
        services.job_start(job=job)
    cheap = idle_worker(provider, "0.5", calibrated=5.0)
    Job.objects.filter(pk=job.pk).update(learner_t_train=10.0)  # target 7.04 traj/s
    job.refresh_from_db()
    clocks = Job.objects.filter(pk=job.pk).values_list("hysteresis_below_since", "hysteresis_above_since")
    now = time.time()
    beat(active, 4.0, until=now)
    tasks.replan(job, now=now)  # below the target: the deficit's clock starts, kept on the job
    assert clocks.get() == (now, None) and not redis_client.keys("*hysteresis*")

    # A decision read before the job was paused is not carried out, and its clocks are not saved either.
    beat(active, 4.0, until=now + 31, seconds=31)
    decision = scheduling.job_replan(job, now=now + 31)
    assert decision.activate == (cheap.pk,) and decision.hysteresis == (now + 31, None)
    services.job_pause(job=job)
    services.job_replan_apply(job=job, activate=decision.activate, reason=decision.reason,
                              hysteresis=decision.hysteresis)
    assert not Activation.objects.filter(worker=cheap).exists() and clocks.get() == (now, None)

    # Resumed, a decision naming a worker another job took meanwhile skips it.
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    other = factories.job(owner)
    Job.objects.filter(pk=other.pk).update(status=Job.Status.RUNNING)
    services.worker_activate(worker=cheap, job=other)
    services.job_replan_apply(job=job, activate=decision.activate, reason=decision.reason,
                              hysteresis=decision.hysteresis)
    assert Activation.objects.get(worker=cheap, ended_at=None).job_id == other.pk
    assert clocks.get() == (now + 31, None)


def test_infeasible_configuration_uses_every_worker(eager, django_capture_on_commit_callbacks):
    owner, provider = factories.user(), factories.user()
    job = factories.job(owner, staleness=3)
    with django_capture_on_commit_callbacks(execute=True):
        services.job_start(job=job)
    job.learner_t_train = 0.05  # kappa*T_train = 0.1 s <= T_bcast = 0.2 s: no pool keeps up
    job.save()
    job.snapshots.create(version=1, url="http://x/v1/", manifest={}, t_bcast=0.2)
    late = idle_worker(provider, "9.0", calibrated=1.0)
    assert tasks.replan(job).calibrate
    assert Activation.objects.filter(worker=late, job=job, ended_at=None).exists()
    assert "no pool can keep up" in scheduling.job_plan(job)["report"]["reason"]
