"""Reads: what a user may see, and derived figures (cost, progress)."""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import FloatField, Max, Q, QuerySet
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone
from knox.models import AuthToken

from dataplane.broadcast import chains
from dataplane.rewards import REFUSED
from dataplane.timing import split_line

from ..core import provisioning
from ..infra import refusals, reward_errors, telemetry
from ..models import Activation, Job, JobMetric, JobSample, Snapshot, SnapshotInstall, Worker, WorkerSession
from . import figures, ledger, matching
from .reward_functions import job_reward_functions

UPTIME_WINDOW = timedelta(days=7)
"""The window the pages and the API measure uptime and utilization over."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def worker_by_key(key: str) -> Worker | None:
    if not key:
        return None
    return Worker.objects.select_related("provider__user").filter(key_hash=hash_key(key)).first()


def user_has_api_token(user) -> bool:
    return AuthToken.objects.filter(user=user).exists()


def job_spec(job: Job) -> dict:
    """The job's resolved settings (every default filled in, as the learner trains with them) as a JobSpec
    mapping: what ``echo2 job submit`` takes back. A setting added to JobSpec after the job was created has its
    default."""
    return job.settings.model_dump(mode="json")


def jobs_visible_to(user) -> QuerySet[Job]:
    qs = Job.objects.all()
    return qs if user.is_staff else qs.filter(owner=user)


def workers_visible_to(user) -> QuerySet[Worker]:
    qs = Worker.objects.select_related("provider__user")
    return qs if user.is_staff else qs.filter(provider__user=user)


def active_activation(*, worker: Worker, job_id: int | None = None) -> Activation | None:
    qs = Activation.objects.select_related("job").filter(worker=worker, ended_at=None)
    if job_id is not None:
        qs = qs.filter(job_id=job_id)
    return qs.first()


def job_cost_usd(job: Job) -> float:
    """What the job's owner pays: the sum of its ledger (billed installing and generating time, each interval at
    the rate then in force), up to each worker's last state report."""
    return ledger.job_spent_usd(job)


def latest_snapshot(job: Job) -> Snapshot | None:
    return job.snapshots.order_by("-version").first()


def base_snapshot(job: Job) -> Snapshot | None:
    """Version 0: the job's base checkpoint, as the learner published it before training."""
    return job.snapshots.filter(version=0).first()


def last_broadcast(job: Job) -> Snapshot | None:
    """The newest snapshot after the base whose T_bcast is known (enough workers installed it). The base's time
    is left out: it carries config and tokenizer too and includes building each worker's engine, so it says
    nothing of how long the broadcast of one policy update takes."""
    return job.snapshots.exclude(t_bcast=None).filter(version__gt=0).order_by("-version").first()


def throughput_target(job: Job, t_bcast: float) -> float | None:
    """gamma * mu_min once the learner has measured T_train; None before, or when (S, kappa) is infeasible."""
    if not job.learner_t_train:
        return None
    try:
        spec = job.settings
        return provisioning.mu_target(kappa=spec.kappa, batch=spec.batch_trajectories, t_train=job.learner_t_train,
                                      t_bcast=t_bcast, gamma=spec.gamma)
    except provisioning.InfeasibleError:
        return None


def _open_activations(job: Job) -> list[Activation]:
    return list(job.activations.filter(ended_at=None).select_related("worker").order_by("worker_id"))


def _behind(published: int, installed: int | None) -> int:
    """Versions a worker lags the newest published snapshot (base weights count as version 0)."""
    return published - (installed or 0) if published else 0


def refused_workers(job: Job) -> QuerySet:
    """The workers that refused ``job``'s task (it runs user code their providers did not allow: docs/trust.md, "User
    code on workers"), as a ``worker_id`` values query: the scheduler plans them no more for this job."""
    return job.activations.filter(end_code=Activation.End.REFUSED).values("worker_id")


AUDIT_RELEASED = "failed its owner's audit: "
"""How an activation ended by failed audits begins its ``end_reason``."""


def excluded_workers(job: Job) -> QuerySet:
    """The workers never planned for ``job`` again, as a ``pk`` values query: those that refused its task (above),
    and those whose groups failed its learner's audits. The owner's word suffices for his own job; it costs the
    worker nothing elsewhere (docs/trust.md "Failed work")."""
    return (Worker.objects.filter(Q(activations__job=job, activations__end_code=Activation.End.REFUSED)
                                  | Q(audits__job=job, audits__failed__gt=0)).values("pk"))


def refusals_line(job: Job) -> str:
    """The job page's line for the workers that refused its user code: ``0``, or ``2 (last: rig-7: reward: runs user
    code (...) ...)``: how its owner learns why workers come and go (their providers did not opt in)."""
    last = (job.activations.filter(end_code=Activation.End.REFUSED).select_related("worker").order_by("-ended_at")
            .first())
    if last is None:
        return "0"
    count = refused_workers(job).distinct().count()
    return f"{count} (last: {last.worker.name}: {last.end_reason.removeprefix(REFUSED)})"


def job_summary(job: Job, *, active: list[Activation] | None = None) -> dict:
    """The figures the dashboard and the demo show for a job (``active``: its open activations, if the
    caller has them already)."""
    last = JobMetric.objects.filter(job=job).order_by("-step").first()
    snap = last_broadcast(job)
    active = _open_activations(job) if active is None else active
    installed = installed_in_job(job, [a.worker_id for a in active])
    cost = job_cost_usd(job)
    # measured on this job's model: workers that installed none of its versions yet count for nothing
    pool = sum(a.worker.throughput or 0.0 for a in active if a.worker_id in installed)
    return {
        "id": job.pk,
        "status": job.status,
        "status_reason": job.status_reason,
        "reason_code": job.reason_code,
        "step": job.learner_step,
        "max_steps": job.settings.max_steps,
        "published_version": job.published_version,
        "reward_mean": last.reward_mean if last else None,
        # the largest lag trained on over the whole run (a step's own is in its metrics)
        "max_staleness": JobMetric.objects.filter(job=job).aggregate(m=Max("max_staleness"))["m"],
        "dropped_stale": last.dropped_stale if last else 0,
        # the job's T_train (dataplane/timing.py: the median of the learner's last 10 steps, as it announced it):
        # the figure the plan, the target and its formula use; the last step's own train time is apart
        "t_train": job.learner_t_train,
        "step_train_s": last.t_train if last else None,
        "wait_s": last.wait_s if last else None,
        "t_bcast": snap.t_bcast if snap else None,
        "active_workers": len(active),
        "pool_throughput": pool,
        "throughput_target": throughput_target(job, snap.t_bcast if snap else 0.0),
        # Share of the last step the learner spent waiting for data (the bubble of section 3).
        "bubble_ratio": last.wait_s / (last.wait_s + last.t_train) if last and last.wait_s + last.t_train > 0 else None,
        # Where the last step's whole wall time went (dataplane/timing.py): train, wait, checkpoint, publish, ...
        "step_time": (last.extra or {}).get("timing") if last else None,
        "step_time_line": ((split_line(timing) if (timing := (last.extra or {}).get("timing")) else
                            "not reported by this job's learner") if last else "no step yet"),
        "cost_usd": round(cost, 6),
        # a finished job's is its spend; a running one's the pool's cost per step times the steps left (ledger.py)
        # why a running job has no worker (or no learner) now; "" when it runs (matching.job_waiting_reason)
        "waiting_reason": matching.job_waiting_reason(job),
        "projected_cost_usd": None if (projected := ledger.projected_cost_usd(job, cost)) is None else round(
            projected, 6),
        "budget_usd": job.settings.budget_usd,
        # what the owner's reward functions did wrong on the workers (docs/rewards.md)
        "reward_errors": (errors := reward_errors.summary(job.pk)),
        "reward_errors_line": reward_errors.line(errors),
        # each of the owner's functions the learner scores: mean, error rate, last error (reads/reward_functions.py)
        "reward_functions": job_reward_functions(job),
        "user_code_refusals_line": refusals_line(job),  # workers whose providers do not run the job's user code
        # the learner's disk, full: "snapshot store full: N MB needed, ..." (learner/diskroom.py), until a write fits
        "learner_storage_line": ((last.extra or {}).get("storage") or "ok") if last else "ok",
        **figures.summary_figures(job, last=last, snap=snap, pool_throughput=pool),  # what each figure is
        "eval": eval_summary(job),  # held-out pass@1 of the first and the latest evaluation (learner/evaluation.py)
    }


def eval_points(metric: JobMetric) -> list[dict]:
    """The evaluations a step report carries (``extra.eval``; the base's rides on step 1's), as the charts draw
    them: the version scored, pass@1, mean@k, how many problems."""
    rows = (metric.extra or {}).get("eval") or []
    return [{key: row.get(key) for key in ("version", "pass_at_1", "mean_at_k", "k", "problems", "split", "seconds")}
            for row in rows if isinstance(row, dict)]


def eval_summary(job: Job) -> dict | None:
    """The job's first evaluation (the base, when the job evaluates before training) and its latest; None when the
    learner reported none."""
    metrics = JobMetric.objects.filter(job=job, extra__has_key="eval").order_by("step")
    points = [point for metric in metrics.only("step", "extra") for point in eval_points(metric)]
    return {"first": points[0], "last": points[-1], "count": len(points)} if points else None


def metric_point(metric: JobMetric) -> dict:
    """One learner step as the job page's charts draw it."""
    extra = metric.extra or {}
    histogram = extra.get("staleness_histogram") or {}
    lengths = extra.get("completion_length") if isinstance(extra.get("completion_length"), dict) else {}
    return {"step": metric.step, "reward_mean": metric.reward_mean, "t_train": metric.t_train,
            "wait_s": metric.wait_s, "max_staleness": metric.max_staleness,
            "staleness_histogram": {str(k): int(v) for k, v in histogram.items()}, "eval": eval_points(metric),
            # the optimisation's own series, as the learner reports them (learner/report.py); null where it did not
            "loss": metric.loss, "kl": _number(extra.get("kl")), "grad_norm": _number(extra.get("grad_norm")),
            "tokens_per_s": _number(extra.get("tokens_per_s")), "completion_mean": _number(lengths.get("mean")),
            "completion_max": _number(lengths.get("max"))}


def _number(value) -> float | None:
    """A reported figure the charts can draw: a finite number, else None (a learner's extra is free-form JSON)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def snapshot_point(snap: Snapshot) -> dict:
    return {"version": snap.version, "t_bcast": snap.t_bcast, "installs": snap.installs,
            "installs_via_parent": snap.installs_via_parent}


def installed_in_job(job: Job, worker_ids: Iterable[int]) -> dict[int, int]:
    """Per worker, the newest version of this job it reported installing (``SnapshotInstall``). Never
    ``Worker.installed_version``: that is whatever the worker holds now, maybe another job's (a finished job's chain
    showed v2000 of the job its workers had moved to)."""
    rows = (SnapshotInstall.objects.filter(snapshot__job=job, worker_id__in=list(worker_ids))
            .values("worker_id").annotate(version=Max("snapshot__version")))
    return {row["worker_id"]: row["version"] for row in rows}


def job_broadcast(job: Job, workers: list[Worker]) -> dict:
    """Who feeds whom for the newest snapshot: the chain plan (learner -> seed -> ... -> tail) and the
    workers that fetch over HTTP, each with the version of this job it has installed and how far behind it is."""
    version = job.published_version  # 0: the base, once published
    plan = telemetry.load_chain_plan(job.pk, version) if version or job.base_digest else None
    active = {w.pk for w in workers}
    planned = {w for chain in plan.chains for w in chain} if plan else set()
    by_id = {w.pk: w for w in workers} | {w.pk: w for w in Worker.objects.filter(pk__in=planned - active)}
    versions = installed_in_job(job, by_id)

    def node(worker_id: int) -> dict:
        worker = by_id.get(worker_id)  # None: deleted since
        installed = versions.get(worker_id)
        return {"id": worker_id, "name": worker.name if worker is not None else f"worker {worker_id}",
                "installed_version": installed, "active": worker_id in active,
                "behind": _behind(version, installed)}

    chains = [[node(w) for w in chain] for chain in plan.chains] if plan else []
    placed = {n["id"] for chain in chains for n in chain}
    http = [node(w.pk) for w in workers if w.pk not in placed]
    return {"version": version, "strategy": job.settings.broadcast_strategy, "learner_relay": bool(job.learner_relay),
            "chains": chains, "http": http}


LIVE_METRICS = 1000  # at most this many new steps per live update (a page far behind reloads the rest)


def job_live(job: Job, *, since_step: int = 0) -> dict:
    """Everything the job page draws, as pushed over its websocket: the headline summary, the learner
    steps after ``since_step`` (each with its staleness histogram), recent snapshots (T_bcast), the active
    workers with their installed versions, and the forwarding chains."""
    active = _open_activations(job)
    workers = [a.worker for a in active]
    refused = refusals.counts([w.pk for w in workers])
    installed = installed_in_job(job, [w.pk for w in workers])
    metrics = JobMetric.objects.filter(job=job, step__gt=since_step).order_by("step")[:LIVE_METRICS]
    return {
        "summary": job_summary(job, active=active),
        "metrics": [metric_point(m) for m in metrics],
        "snapshots": [snapshot_point(s) for s in job.snapshots.order_by("-version")[:20]][::-1],
        "workers": [live_worker(a, published=job.published_version, installed=installed.get(a.worker_id),
                                refused=refused.get(a.worker_id, 0)) for a in active],
        "broadcast": job_broadcast(job, workers),
    }


def live_worker(activation: Activation, *, published: int, installed: int | None, refused: int = 0) -> dict:
    """One active worker as the job page lists it: its figures, what it reports doing (``state``: billed
    while installing or generating), what its activation has cost so far, and how many of its frames the site
    refused for its rate budget (``refusals``; each sent again by an honest agent, which is paced to meet none).
    ``installed``: the newest version of this job it installed (:func:`installed_in_job`); until it has one its
    throughput was measured on another job's model, so none is shown."""
    w = activation.worker
    return {"id": w.pk, "name": w.name, "gpu": w.gpu, "price_per_hour": float(w.price_per_hour),
            "throughput": w.throughput if installed is not None else None, "status": w.status,
            "installed_version": installed, "behind": _behind(published, installed), "state": activation.state,
            "state_reason": activation.state_reason, "billed_s": round(activation.billed_seconds, 3),
            "cost_usd": round(activation.cost_usd(), 6), "refused": refused}


def worker_earnings(workers) -> dict[int, dict]:
    """Per worker: hours billed (installing and generating), hours active in jobs, and USD earned (billed
    time at each activation's frozen rate)."""
    now = timezone.now()
    out: dict[int, dict] = {}
    for activation in Activation.objects.filter(worker__in=workers):
        row = out.setdefault(activation.worker_id, {"hours": 0.0, "active_hours": 0.0, "earned_usd": 0.0})
        end = activation.ended_at or now
        row["hours"] += activation.billed_seconds / 3600
        row["active_hours"] += max(0.0, (end - activation.started_at).total_seconds()) / 3600
        row["earned_usd"] += activation.cost_usd()
    return out


def worker_job_states(workers: Iterable[Worker]) -> dict[int, tuple[str, str]]:
    """Per worker in a job: the state its agent last reported doing for it, and the reason when ``failed``."""
    rows = Activation.objects.filter(worker__in=list(workers), ended_at=None)
    return {worker_id: (state, reason) for worker_id, state, reason in
            rows.values_list("worker_id", "state", "state_reason")}


# ---- worker figures: relay score, uptime, utilization --------------------------------------------------


def chain_stats(workers: Iterable[Worker], *, now: float) -> list[chains.WorkerStats]:
    """The relay statistics the chain score ranks (appendix C.3), for the broadcast planner and the pages alike.

    ``last_seen`` is the last heartbeat; a worker never heard from counts as seen ``now`` (Decay 1), so it is
    not faded out before it could report.
    """
    return [chains.WorkerStats(
        worker_id=w.pk, bandwidth_bps=w.relay_bandwidth_bps, successes=w.relay_successes, failures=w.relay_failures,
        last_seen=w.last_heartbeat.timestamp() if w.last_heartbeat else now,
        last_failure_at=w.relay_last_failure_at.timestamp() if w.relay_last_failure_at else None,
        audit_pass_rate=1.0 if w.audit_pass_rate is None else w.audit_pass_rate) for w in workers]


def worker_scores(workers: Iterable[Worker], *, now: datetime | None = None) -> dict[int, float | None]:
    """Each worker's relay score in [0, 1] (``chains.scores``): the rank the broadcast planner gives it when it
    picks chain seeds. Speed is measured against the best relay of the whole fleet, not only ``workers``, so
    a provider's page shows the rank the scheduler would give. A worker without a relay address cannot
    forward snapshots and is never ranked: None."""
    workers = list(workers)
    now_s = (now or timezone.now()).timestamp()
    relays = [w for w in workers if w.relay_address]
    # Worker.relay_bandwidth_bps in SQL: measured, else registered.
    fleet_best = Max(Coalesce("measured_bandwidth_bps", Cast("bandwidth_bps", FloatField())))
    best = Worker.objects.exclude(relay_address="").aggregate(best=fleet_best)["best"] if relays else 0.0
    ranked = chains.scores(chain_stats(relays, now=now_s), now=now_s, best_bandwidth_bps=float(best or 0.0))
    return {w.pk: ranked.get(w.pk) for w in workers}


def _covered_seconds(intervals: Iterable[tuple[datetime, datetime]], start: datetime, end: datetime) -> float:
    """Seconds of ``[start, end]`` inside the union of ``intervals``: overlaps count once, the rest is clipped."""
    covered, reached = 0.0, start
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, reached), min(finish, end)
        if finish > begin:
            covered += (finish - begin).total_seconds()
            reached = finish
    return covered


def _shares(model: type[WorkerSession | Activation], workers: list[Worker], *, window: timedelta,
            now: datetime) -> tuple[dict[int, float | None], dict[int, datetime]]:
    """Per worker, the share of the window (of its life, if registered within it) covered by its ``model``
    rows (``started_at``/``ended_at``; an open row runs until ``now``); and when its open row began.
    One query for all workers."""
    rows = (model.objects.filter(worker__in=workers, started_at__lt=now)
            .filter(Q(ended_at=None) | Q(ended_at__gt=now - window))
            .values_list("worker_id", "started_at", "ended_at"))
    intervals: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    open_since: dict[int, datetime] = {}
    for worker_id, started_at, ended_at in rows:
        intervals[worker_id].append((started_at, ended_at or now))
        if ended_at is None:
            open_since[worker_id] = started_at
    shares: dict[int, float | None] = {}
    for worker in workers:
        start = max(now - window, worker.created_at)
        span = (now - start).total_seconds()
        shares[worker.pk] = _covered_seconds(intervals[worker.pk], start, now) / span if span > 0 else None
    return shares, open_since


def worker_uptime(workers: Iterable[Worker], *, window: timedelta = UPTIME_WINDOW,
                  now: datetime | None = None) -> dict[int, dict]:
    """Per worker: ``uptime``, the share of the last ``window`` (or of the time since it was registered, if
    younger) its agent was connected, None for a worker registered this instant; ``online_since``, when its
    current session began, None while disconnected."""
    workers = list(workers)
    shares, open_since = _shares(WorkerSession, workers, window=window, now=now or timezone.now())
    return {w.pk: {"uptime": shares[w.pk], "online_since": open_since.get(w.pk)} for w in workers}


def worker_utilization(workers: Iterable[Worker], *, window: timedelta = UPTIME_WINDOW,
                       now: datetime | None = None) -> dict[int, float | None]:
    """Per worker, the share of the last ``window`` (or of its life, if younger) it was active in a job."""
    return _shares(Activation, list(workers), window=window, now=now or timezone.now())[0]


def workers_with_figures(workers: Iterable[Worker], *, now: datetime | None = None) -> list[Worker]:
    """The workers with ``score``, ``uptime``, ``online_since`` and ``job_state`` (what the agent reports doing
    in its job, None outside one) attached, as the provider page and the API show them; three queries for any
    number of workers."""
    workers, now = list(workers), now or timezone.now()
    scores, uptime = worker_scores(workers, now=now), worker_uptime(workers, now=now)
    states = worker_job_states(workers)
    reliabilities = matching.worker_reliability(workers, now=now)
    for worker in workers:
        worker.score = scores[worker.pk]
        worker.reliability = reliabilities[worker.pk].as_dict()
        worker.hardware_line = worker.facts.summary() if worker.hardware else "not reported"
        worker.uptime = uptime[worker.pk]["uptime"]
        worker.online_since = uptime[worker.pk]["online_since"]
        worker.job_state, worker.job_state_reason = states.get(worker.pk, (None, ""))
    return workers


def job_samples(*, job: Job, min_reward: float | None = None, max_reward: float | None = None,
                limit: int = 50) -> list[JobSample]:
    """The job's newest samples (the learner's, dataplane/samples.py), newest step first, within a reward range."""
    rows = JobSample.objects.filter(job=job)
    if min_reward is not None:
        rows = rows.filter(reward__gte=min_reward)
    if max_reward is not None:
        rows = rows.filter(reward__lte=max_reward)
    return list(rows.order_by("-step", "id")[:limit])
