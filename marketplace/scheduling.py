"""The scheduler's service layer (paper sections 3.3-3.4, 4.3, appendix C.2.1).

It turns the database and the heartbeat history into plain candidates, asks the pure core
(``provisioning``) what to do, and applies the answer through ``services`` (activations, releases and
their pushes to agents). The hysteresis clock of each job lives in Redis, so any Celery worker can run
the next re-plan.
"""

from __future__ import annotations

import dataclasses
import time

from django.conf import settings
from django.db import transaction

from . import controller as ctl
from . import provisioning as p
from . import services, stream, telemetry
from .models import Activation, Job, Worker, WorkerCalibration

WINDOW_S = 60.0


def _hysteresis_key(job_id: int) -> str:
    return f"echo2:job:{job_id}:hysteresis"


@dataclasses.dataclass(frozen=True)
class Pool:
    """Everyone a job could use right now, as the pure core sees them."""

    active: list[p.Candidate]
    standby: list[p.Candidate]
    unmeasured: list[Worker]  # standby workers with no figure for this job's model and task
    workers: dict[int, Worker]

    @property
    def capacity(self) -> float:
        return p.pool_capacity(self.active)


def job_pool(job: Job, *, now: float | None = None) -> Pool:
    """Active workers carry their live ``a_i mu_i`` (heartbeat windows); standby ones their calibration."""
    now = time.time() if now is None else now
    active_ids = set(job.activations.filter(ended_at=None).values_list("worker_id", flat=True))
    busy = Activation.objects.filter(ended_at=None).exclude(job=job).values("worker_id")
    workers = {w.pk: w for w in Worker.objects.exclude(status=Worker.Status.OFFLINE).exclude(pk__in=busy)}
    workers.update({w.pk: w for w in Worker.objects.filter(pk__in=active_ids)})
    beats = telemetry.recent_heartbeats(list(workers))
    calibrated = dict(WorkerCalibration.objects.filter(worker_id__in=list(workers), model_dir=job.model_dir,
                                                       task_name=job.task.get("name", "")).values_list("worker_id",
                                                                                                      "throughput"))
    active, standby, unmeasured = [], [], []
    for wid, worker in workers.items():
        interval = telemetry.heartbeat_interval()
        window = ctl.HeartbeatWindow(window_s=max(WINDOW_S, 3 * interval), interval_s=interval)
        for at, mu in beats[wid]:
            window.add(at, mu)
        availability = window.availability(now) if beats[wid] else 1.0
        live = window.throughput(now) if wid in active_ids else None
        mu = live or calibrated.get(wid)
        candidate = p.Candidate(wid, float(worker.price_per_hour), mu, availability)
        if wid in active_ids:
            active.append(candidate)
        elif mu is None:
            unmeasured.append(worker)
        else:
            standby.append(candidate)
    return Pool(active=active, standby=standby, unmeasured=unmeasured, workers=workers)


def _t_bcast(job: Job) -> float:
    snap = job.snapshots.exclude(t_bcast=None).order_by("-version").first()
    return snap.t_bcast if snap else 0.0


def job_plan(job: Job) -> dict:
    """What ``GET /api/jobs/{id}/plan/`` shows: the feasibility report, the exact plan and the greedy's."""
    pool = job_pool(job)
    t_train, t_bcast = job.learner_t_train, _t_bcast(job)
    out: dict = {
        "measurements": {"t_train": t_train, "t_bcast": t_bcast, "mu_pool": pool.capacity},
        "active": sorted(c.worker_id for c in pool.active),
        "unmeasured": [{"id": w.pk, "name": w.name} for w in pool.unmeasured],
    }
    if not t_train:
        out["report"] = {"feasible": None, "reason": "calibrating: the learner has not measured T_train yet; "
                                                     "every available worker is used meanwhile"}
        out["plan"] = out["greedy"] = None
        return out
    args = {"staleness": job.staleness, "kappa": job.kappa, "t_train": t_train, "t_bcast": t_bcast,
            "batch": job.batch_trajectories, "gamma": job.gamma}
    report = p.feasibility(**args)
    out["report"] = dataclasses.asdict(report)
    if report.target is None:
        out["plan"] = out["greedy"] = None
        return out
    measured = [c for c in pool.active + pool.standby if c.throughput]
    exact = p.exact_min_cost(measured, report.target)
    # The lag to expect is that of the planned pool (B.3 under overlap, B.2 when it falls short).
    out["report"] = dataclasses.asdict(p.feasibility(**args, mu_pool=exact.throughput))
    out["plan"] = _selection(exact, pool)
    out["greedy"] = _selection(p.greedy_by_unit_cost(measured, report.target), pool)
    return out


def _selection(sel: p.Selection, pool: Pool) -> dict:
    candidates = {c.worker_id: c for c in pool.active + pool.standby}
    return {
        "method": sel.method, "optimal": sel.optimal, "note": sel.note, "target": sel.target,
        "price_per_hour": sel.price_per_hour, "throughput": sel.throughput, "shortfall": sel.shortfall,
        "workers": [{"id": wid, "name": pool.workers[wid].name, "price_per_hour": candidates[wid].price_per_hour,
                     "throughput": candidates[wid].throughput, "availability": candidates[wid].availability,
                     "unit_cost": candidates[wid].price_per_hour / candidates[wid].effective_throughput}
                    for wid in sel.worker_ids],
    }


def job_replan(job: Job, *, now: float | None = None) -> ctl.Decision | None:
    """One low-frequency adjustment (C.2.1) for a running job; returns what was decided.

    Before the learner has measured ``T_train``, or when no pool can keep up, every available worker is
    used (``services.job_provision``). Otherwise the hysteresis controller activates the cheapest
    standby capacity after a sustained deficit and releases the priciest after a sustained surplus.
    """
    if job.status != Job.Status.RUNNING:
        return None
    now = time.time() if now is None else now
    t_train = job.learner_t_train
    target = None
    if t_train:
        try:
            target = p.mu_target(kappa=job.kappa, batch=job.batch_trajectories, t_train=t_train,
                                 t_bcast=_t_bcast(job), gamma=job.gamma)
        except p.InfeasibleError:
            target = None
    if target is None:
        services.job_provision(job=job)
        return None
    pool = job_pool(job, now=now)
    controller = _load_controller(job.pk)
    if not pool.active:
        # An empty active set is not noise to wait out (the job was resumed, or every worker left): take
        # the cheapest cover of the target now, or everyone available when nobody is measured yet.
        pick = p.exact_min_cost([c for c in pool.standby if c.throughput], target)
        if not pick.worker_ids:
            services.job_provision(job=job)
            return None
        controller.restore(below_since=None, above_since=None)
        decision = ctl.Decision(pick.worker_ids, (), f"no active worker: activating the cheapest cover of "
                                                     f"{target:.4g} traj/s ({len(pick.worker_ids)} workers)")
    else:
        decision = controller.decide(now, pool.capacity, target, pool.standby, pool.active)
    _save_controller(job.pk, controller)
    with transaction.atomic():
        for wid in decision.activate:
            services.worker_activate(worker=pool.workers[wid], job=job)
        for activation in job.activations.filter(ended_at=None, worker_id__in=decision.release):
            services.worker_release(activation=activation, reason=f"capacity above target: {decision.reason}")
    return decision


def _controller_settings() -> tuple[float, float]:
    return float(settings.ECHO2["REPLAN_INTERVAL_S"]), float(settings.ECHO2["RELEASE_MARGIN"])


def _load_controller(job_id: int) -> ctl.HysteresisController:
    interval, margin = _controller_settings()
    controller = ctl.HysteresisController(interval, margin)
    saved = stream.client().hgetall(_hysteresis_key(job_id))
    controller.restore(below_since=_float(saved.get("below_since")), above_since=_float(saved.get("above_since")))
    return controller


def _save_controller(job_id: int, controller: ctl.HysteresisController) -> None:
    state = controller.state()
    key = _hysteresis_key(job_id)
    pipe = stream.client().pipeline()
    pipe.delete(key)
    values = {k: v for k, v in state.items() if v is not None}
    if values:
        pipe.hset(key, mapping=values)
        pipe.expire(key, 24 * 3600)
    pipe.execute()


def _float(value: str | None) -> float | None:
    return None if value is None else float(value)
