"""The scheduler's reads and decisions (paper sections 3.3-3.4, 4.3, appendix C.2.1).

It turns the database and the heartbeat history into plain candidates and asks the pure cores
(``provisioning``, ``controller``) what to do. It writes nothing: a re-plan's decision (``Replan``) is carried
out by ``services.job_replan_apply`` (called from ``tasks``), which saves the hysteresis clocks on the job in
the same transaction as the activations and releases, so any Celery worker can run the next re-plan.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

from django.conf import settings

from dataplane import staleness_evidence
from dataplane.jobs import JobSpec
from dataplane.lora import LoraSpec

from ..core import activation
from ..core import controller as ctl
from ..core import matching as match
from ..core import provisioning as p
from ..infra import telemetry
from ..models import Activation, Job, Worker, WorkerCalibration
from . import matching, selectors


@dataclasses.dataclass(frozen=True)
class Pool:
    """Everyone a job could use right now, as the pure core sees them."""

    active: list[activation.Candidate]
    standby: list[activation.Candidate]
    unmeasured: list[Worker]  # standby workers with no figure for this job's model and task
    workers: dict[int, Worker]
    sources: dict[int, str]  # where each mu_i comes from: measured, calibration or last measured (never reported)
    matching: match.Matching | None = None  # the online workers against the job's requirements (None: not matched)
    needs: dict | None = None  # the requirements matched on, the memory's source named

    @property
    def capacity(self) -> float:
        return activation.pool_capacity(self.active)


def candidate_pool(*, model_dir: str, task_name: str, job: Job | None = None, now: float | None = None,
                   spec: JobSpec | None = None) -> Pool:
    """Everyone ``job`` (or a job not created yet, ``job=None``) could use: its own active workers and every
    online worker not busy in another job, each with the ``mu_i`` the scheduler plans with.

    ``mu_i`` is what the site saw, never what a worker says (docs/trust.md, "What the scheduler believes"). Most
    trusted first: ``measured``, the trajectories the site accepted from a worker active in this job per second over
    the window (``controller.accepted_rate``), and 0 once it has been active a whole window with none accepted;
    until then its ``calibration`` for this model and task (``echo2-agent bench --report``: the agent's own
    benchmark, so only a prior, capped by ``_prior_cap``); ``last measured``, what the site measured on whatever it
    ran before (``Worker.throughput``); else the worker is unmeasured and only the calibration phase uses it. The
    figure its heartbeats claim is never planned with. Availability ``a_i`` is the site's own count of heartbeats
    received; reliability ``r_i`` its long-run record (``matching.worker_reliability``). With ``spec`` (the job's
    settings) only the workers that meet its ``requirements`` are candidates (its active ones stay); ``matching``
    counts, over every online worker, who does and why the others do not.
    """
    now = time.time() if now is None else now
    started = dict(job.activations.filter(ended_at=None).values_list("worker_id", "started_at")) if job else {}
    busy = Activation.objects.filter(ended_at=None)
    busy = (busy.exclude(job=job) if job else busy).values("worker_id")
    refused = selectors.excluded_workers(job) if job else []
    workers = {w.pk: w for w in Worker.objects.exclude(status=Worker.Status.OFFLINE).exclude(pk__in=busy)
               .exclude(pk__in=refused)  # it refused this job's task, or failed its audits: not again
               .filter(suspended_at__isnull=True,  # suspended after failed audits: never planned
                       paused_at=None, removed_at=None)}  # nor one its provider paused or removed
    workers.update({w.pk: w for w in Worker.objects.filter(pk__in=list(started))})
    online = {w.pk: w for w in matching.online_workers()} | workers
    reliabilities = matching.worker_reliability(online.values())
    matched, needs = None, None
    if spec is not None:
        need, needs = matching.needs_of(spec)
        matched = matching.match_workers(need, [w for wid, w in online.items() if wid not in started],
                                         reliabilities=reliabilities)
        workers = {wid: w for wid, w in workers.items() if wid in started or wid not in matched.reasons}
    beats = telemetry.recent_heartbeats(list(workers))
    accepted = telemetry.recent_accepted(list(started), job_id=job.pk, now=now) if job else {}
    calibrated = dict(WorkerCalibration.objects.filter(worker_id__in=list(workers), model_dir=model_dir,
                                                       task_name=task_name).values_list("worker_id", "throughput"))
    measured = {wid: _measured(accepted[wid], since=started[wid].timestamp(), now=now) for wid in started}
    cap = _prior_cap(measured, workers)
    active, standby, unmeasured, sources = [], [], [], {}
    for wid, worker in workers.items():
        availability = _heartbeat_window(beats[wid]).availability(now) if beats[wid] else 1.0
        prior = calibrated.get(wid)
        figures = (("measured", measured.get(wid)), ("calibration", prior if cap is None or prior is None
                                                     else min(prior, cap)), ("last measured", worker.throughput))
        source, mu = next(((name, mu) for name, mu in figures if mu is not None), (None, None))
        candidate = activation.Candidate(wid, float(worker.price_per_hour), mu or None, availability,  # 0: adds nothing
                                         reliabilities[wid].value)
        if source:
            sources[wid] = source
        if wid in started:
            active.append(candidate)
        elif mu is None:
            unmeasured.append(worker)
        else:
            standby.append(candidate)
    return Pool(active=active, standby=standby, unmeasured=unmeasured, workers=workers, sources=sources,
                matching=matched, needs=needs)


def _measured(events: list[tuple[float, int]], *, since: float, now: float) -> float | None:
    """The site's ``mu_i`` of a worker active in the job since ``since``: its accepted rate; 0 once it has been active
    a whole window and none was accepted (a worker that returns nothing has no throughput, whatever it claims);
    None before (its prior stands in)."""
    rate = telemetry.measured_throughput(events, since=since, now=now)
    if rate is None and now - since >= telemetry.window_s():
        return 0.0
    return rate


def _prior_cap(measured: dict[int, float | None], workers: dict[int, Worker]) -> float | None:
    """The most a worker's calibration (its own benchmark) may claim: the median of what the site measured of this
    job's active workers, or, where none has been measured here yet, of what it last measured of the pool's
    workers anywhere (``Worker.throughput``); None (the claim stands, bounded by the API) when neither exists."""
    here = [mu for mu in measured.values() if mu]
    anywhere = [w.throughput for w in workers.values() if w.throughput]
    figures = here or anywhere
    return statistics.median(figures) if figures else None


def _heartbeat_window(beats: list[tuple[float, float | None]]) -> ctl.HeartbeatWindow:
    interval = telemetry.heartbeat_interval()
    window = ctl.HeartbeatWindow(window_s=telemetry.window_s(), interval_s=interval)
    for at, mu in beats:
        window.add(at, mu)
    return window


def job_pool(job: Job, *, now: float | None = None) -> Pool:
    """The pool of a saved job: its active workers and everyone available (``candidate_pool``)."""
    return candidate_pool(model_dir=job.model_dir, task_name=job.task.get("name", ""), job=job, now=now,
                          spec=job.settings)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A figure the plan rests on, and where it came from, so that a person can judge how far to trust it."""

    value: float | None
    source: str  # "learner", "snapshot", "given", "earlier job" or "none"
    note: str
    job: Job | None = None  # the earlier job it was measured in

    def as_dict(self) -> dict:
        return {"value": self.value, "source": self.source, "note": self.note,
                "job": None if self.job is None else {"id": self.job.pk, "name": self.job.name}}


def _t_bcast(job: Job) -> float:
    snap = selectors.last_broadcast(job)
    return snap.t_bcast if snap else 0.0


def job_plan(job: Job) -> dict:
    """What ``GET /api/jobs/{id}/plan/`` shows: the feasibility report, the exact plan and the greedy's."""
    t_train = Estimate(None, "none", "the learner has not measured T_train yet")
    if job.learner_t_train:
        t_train = Estimate(job.learner_t_train, "learner", "measured by this job's learner")
    t_bcast = Estimate(0.0, "none", "no broadcast measured yet: 0 assumed")
    if snap := selectors.last_broadcast(job):
        t_bcast = Estimate(snap.t_bcast, "snapshot", f"measured on snapshot v{snap.version}")
    return capacity_plan(job.settings, t_train=t_train, t_bcast=t_bcast, pool=job_pool(job))


def _earlier_job(spec: JobSpec, user) -> Job | None:
    """The newest job of ``user``'s (all jobs for staff) with the same model, task and adapter whose learner
    measured ``T_train``: the best guess for a new job's, since ``T_train`` depends on the model, R and the learner,
    and ``T_bcast`` on what a publication ships (a LoRA job's adapter is a few MB, a full job's the whole model:
    docs/lora.md)."""
    candidates = (selectors.jobs_visible_to(user).filter(model_dir=spec.model_dir, task__name=spec.task.get("name"),
                                                         learner_t_train__gt=0).order_by("-pk"))[:EARLIER_JOBS_READ]
    return next((job for job in candidates if _ships_alike(job.settings.lora, spec)), None)  # none: rank 0


EARLIER_JOBS_READ = 20  # of the same model and task, newest first: one with the same adapter is among them or none


def _ships_alike(lora: LoraSpec, spec: JobSpec) -> bool:
    """Whether a job with adapter settings ``lora`` publishes versions of the size ``spec``'s would: the same rank
    on the same layers (both 0: the whole model)."""
    return lora.rank == spec.lora.rank and (lora.rank == 0 or sorted(lora.target_modules)
                                            == sorted(spec.lora.target_modules))


def spec_plan(spec: JobSpec, *, user, t_train: float | None = None, t_bcast: float | None = None) -> dict:
    """The plan of a job not created yet (``POST /api/jobs/plan/``, the launch form's preview).

    ``T_train`` is the one given, else the one an earlier job of the same model and task measured (which
    job is named), else unknown: the job would start in the calibration phase, with every available
    worker. ``T_bcast`` is the one given, else that earlier job's last measured broadcast, else 0 (the
    broadcast is then assumed free, which makes ``mu_min`` and the lag a lower bound).
    """
    earlier = _earlier_job(spec, user)
    snap = selectors.last_broadcast(earlier) if earlier else None
    if t_train is not None:
        train = Estimate(t_train, "given", "given by you")
    elif earlier is not None:
        # An update's cost grows about linearly with the trajectories it trains on.
        scale = spec.batch_trajectories / earlier.settings.batch_trajectories
        scaled = f", scaled to R = {spec.batch_trajectories}" if scale != 1 else ""
        why = (f"measured by job #{earlier.pk} \"{earlier.name}\" (same model and task, "
               f"R = {earlier.settings.batch_trajectories}{scaled})")
        train = Estimate(earlier.learner_t_train * scale, "earlier job", why, earlier)
    else:
        train = Estimate(None, "none", "no T_train entered, and no earlier job with this model and task measured one")
    if t_bcast is not None:
        bcast = Estimate(t_bcast, "given", "given by you")
    elif snap is not None:
        bcast = Estimate(snap.t_bcast, "earlier job", f"measured on snapshot v{snap.version} of job #{earlier.pk} "
                         f"\"{earlier.name}\"", earlier)
    else:
        bcast = Estimate(0.0, "none", "no T_bcast entered or measured before: 0 assumed, so the target and the lag "
                         "are lower bounds")
    pool = candidate_pool(model_dir=spec.model_dir, task_name=spec.task.get("name", ""), spec=spec)
    return capacity_plan(spec, t_train=train, t_bcast=bcast, pool=pool)


def capacity_plan(config: JobSpec, *, t_train: Estimate, t_bcast: Estimate, pool: Pool) -> dict:
    """The feasibility report of ``config``'s (S, kappa, R, gamma) for these estimates, the cheapest worker set
    of ``pool`` meeting the target (exact solver) and the set the paper's greedy by unit cost would take.

    Without ``T_train`` there is no target: the plan is the calibration phase, every available worker
    (``services.job_activate_idle_workers``), listed under ``calibration``.
    """
    out: dict = {
        "measurements": {"t_train": t_train.value, "t_bcast": t_bcast.value, "mu_pool": pool.capacity,
                         "sources": {"t_train": t_train.as_dict(), "t_bcast": t_bcast.as_dict()}},
        "active": sorted(c.worker_id for c in pool.active),
        "unmeasured": [{"id": w.pk, "name": w.name, "price_per_hour": float(w.price_per_hour)}
                       for w in pool.unmeasured],
        "calibration": None,
        # who meets the job's requirements, of every online worker, and why the others do not
        "requirements": None if pool.matching is None else pool.needs | pool.matching.as_dict(),
        # what was measured for this S and correction, and a warning where that was unstable
        "staleness_guidance": staleness_evidence.guidance(staleness=config.staleness, correction=_correction(config)),
    }
    if not t_train.value:
        out["report"] = {"feasible": None, "reason": "calibrating: T_train is not known yet (the learner measures it "
                                                     "in its first steps); every available worker is used meanwhile"}
        out["plan"] = out["greedy"] = None
        out["calibration"] = _calibration(pool)
        return out
    args = {"staleness": config.staleness, "kappa": config.kappa, "t_train": t_train.value,
            "t_bcast": t_bcast.value, "batch": config.batch_trajectories, "gamma": config.gamma}
    report = p.feasibility(**args)
    out["report"] = dataclasses.asdict(report)
    if report.target is None:
        out["plan"] = out["greedy"] = None
        return out
    measured = [c for c in pool.active + pool.standby if c.throughput]
    exact = activation.exact_min_cost(measured, report.target)
    # The lag to expect is that of the planned pool (B.3 under overlap, B.2 when it falls short).
    out["report"] = dataclasses.asdict(p.feasibility(**args, mu_pool=exact.throughput))
    out["plan"] = _selection(exact, pool)
    out["greedy"] = _selection(activation.greedy_by_unit_cost(measured, report.target), pool)
    return out


def _correction(config: JobSpec) -> str:
    """The job's off-policy correction (``loss.off_policy``)."""
    return config.loss.off_policy


def available_workers() -> dict:
    """Everyone a new job could start on, before its model is known (so with the throughput each last
    measured on anything), cheapest first: the launch page's panel until a plan is previewed."""
    return _calibration(candidate_pool(model_dir="", task_name=""))


def _calibration(pool: Pool) -> dict:
    """Everyone the calibration phase activates, cheapest first, and what that costs while ``T_train`` is measured."""
    rows = [(c.price_per_hour, c.worker_id, c.throughput) for c in pool.active + pool.standby]
    rows += [(float(w.price_per_hour), w.pk, None) for w in pool.unmeasured]
    workers = [{"id": wid, "name": pool.workers[wid].name, "price_per_hour": price, "throughput": mu,
                "source": pool.sources.get(wid)} for price, wid, mu in sorted(rows)]
    return {"workers": workers, "price_per_hour": math.fsum(w["price_per_hour"] for w in workers),
            "throughput": math.fsum(c.effective_throughput for c in pool.active + pool.standby)}


def _selection(sel: activation.Selection, pool: Pool) -> dict:
    candidates = {c.worker_id: c for c in pool.active + pool.standby}
    return {
        "method": sel.method, "optimal": sel.optimal, "note": sel.note, "target": sel.target,
        "price_per_hour": sel.price_per_hour, "throughput": sel.throughput, "shortfall": sel.shortfall,
        "workers": [{"id": wid, "name": pool.workers[wid].name, "price_per_hour": candidates[wid].price_per_hour,
                     "throughput": candidates[wid].throughput, "availability": candidates[wid].availability,
                     "reliability": candidates[wid].reliability,
                     "unit_cost": candidates[wid].price_per_hour / candidates[wid].effective_throughput,
                     "source": pool.sources[wid]}
                    for wid in sel.worker_ids],
    }


@dataclasses.dataclass(frozen=True)
class Replan:
    """What one re-plan of a job decided, for ``services.job_replan_apply`` to carry out in one transaction."""

    activate: tuple[int, ...] = ()
    release: tuple[int, ...] = ()
    reason: str = ""
    calibrate: bool = False
    """No target yet, or nobody measured covers it: every idle worker (``services.job_activate_idle_workers``)."""
    hysteresis: tuple[float | None, float | None] | None = None
    """The controller's clocks ``(below_since, above_since)`` after deciding; None leaves the saved ones."""


def job_replan(job: Job, *, now: float | None = None) -> Replan | None:
    """One low-frequency adjustment (C.2.1) for a running job: what to do, not done yet (None: not running).

    Before the learner has measured ``T_train``, or when no pool can keep up, every available worker is
    used (``calibrate``). Otherwise the hysteresis controller activates the cheapest standby capacity after a
    sustained deficit and releases the priciest after a sustained surplus.
    """
    if job.status != Job.Status.RUNNING:
        return None
    now = time.time() if now is None else now
    target = selectors.throughput_target(job, _t_bcast(job))
    if target is None:
        return Replan(calibrate=True, reason="no throughput target yet: every idle worker")
    pool = job_pool(job, now=now)
    controller = _load_controller(job.pk)
    if not pool.active:
        # An empty active set is not noise to wait out (the job was resumed, or every worker left): take
        # the cheapest cover of the target now, or everyone available when nobody is measured yet.
        pick = activation.exact_min_cost([c for c in pool.standby if c.throughput], target)
        if not pick.worker_ids:
            return Replan(calibrate=True, reason="no active worker and nobody measured: every idle worker")
        controller.restore(below_since=None, above_since=None)
        decision = ctl.Decision(pick.worker_ids, (), f"no active worker: activating the cheapest cover of "
                                                     f"{target:.4g} traj/s ({len(pick.worker_ids)} workers)")
    else:
        decision = controller.decide(now, pool.capacity, target, pool.standby, pool.active)
    state = controller.state()
    return Replan(activate=tuple(decision.activate), release=tuple(decision.release), reason=decision.reason,
                  hysteresis=(state["below_since"], state["above_since"]))


def _load_controller(job_id: int) -> ctl.HysteresisController:
    """The job's controller with the clocks the last applied re-plan saved (read afresh: the caller's ``Job``
    may be older than that re-plan)."""
    controller = ctl.HysteresisController(float(settings.ECHO2["REPLAN_INTERVAL_S"]),
                                          float(settings.ECHO2["RELEASE_MARGIN"]))
    below, above = Job.objects.filter(pk=job_id).values_list("hysteresis_below_since", "hysteresis_above_since").get()
    controller.restore(below_since=below, above_since=above)
    return controller
