"""Reads for matching jobs to workers: each worker's long-run reliability, what a job needs, who meets
it, and why a running job waits. The decisions are the pure cores' (``core/reliability.py``, ``core/matching.py``);
this module only gathers their inputs. It writes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from dataplane.hardware import Hardware
from dataplane.jobs import JobSpec
from dataplane.requirements import estimate_memory, memory_needed
from dataplane.tasks import build_task

from ..core import matching as core
from ..core.reliability import HORIZON_S, Record, Reliability, reliability
from ..models import Activation, Job, Worker, WorkerSession

WINDOW = timedelta(days=7)
"""The long-run record's window, the same as the provider page's uptime."""


def worker_reliability(workers: Iterable[Worker], *, now: datetime | None = None) -> dict[int, Reliability]:
    """Each worker's ``r_i`` (``core.reliability``) from what the site saw over the last ``WINDOW``: its sessions
    (connected time, connections ended), audits, relays, and activations released silent. Two queries."""
    workers, now = list(workers), now or timezone.now()
    start = now - WINDOW
    connected: Counter[int] = Counter()
    ended: Counter[int] = Counter()
    sessions = (WorkerSession.objects.filter(worker__in=workers, started_at__lt=now)
                .filter(Q(ended_at=None) | Q(ended_at__gt=start)).values_list("worker_id", "started_at", "ended_at"))
    for worker_id, started_at, ended_at in sessions:
        connected[worker_id] += ((ended_at or now) - max(started_at, start)).total_seconds()
        ended[worker_id] += ended_at is not None
    kept: Counter[int] = Counter()
    silent: Counter[int] = Counter()
    for worker_id, code in (Activation.objects.filter(worker__in=workers, ended_at__gt=start)
                            .values_list("worker_id", "end_code")):
        (silent if code == Activation.End.SILENT else kept)[worker_id] += 1
    out = {}
    for w in workers:
        span = (now - max(start, w.created_at)).total_seconds()
        record = Record(connected_s=max(0.0, connected[w.pk]), sessions_ended=ended[w.pk],
                        audits_passed=w.audits_passed, audits_failed=w.audits_failed, relays_ok=w.relay_successes,
                        relays_broken=w.relay_failures, activations_kept=kept[w.pk],
                        activations_silent=silent[w.pk], uptime=min(1.0, connected[w.pk] / span) if span > 0 else None)
        out[w.pk] = reliability(record, horizon_s=HORIZON_S)
    return out


def needs_of(spec: JobSpec) -> tuple[core.Needs, dict]:
    """What ``spec`` asks of a worker, the memory estimated when not given; and how, for the plan preview."""
    req = spec.requirements
    estimate = None
    if req.min_gpu_memory_gb is None and settings.ECHO2["CHECK_MODEL_DIR"]:  # where it sees the learner's paths
        engine = "vllm" if req.engine == "vllm" else "hf"
        estimate = estimate_memory(spec.model_dir, engine=engine, snapshot_dtype=spec.snapshot_dtype,
                                   max_new_tokens=spec.max_new_tokens, group_size=spec.group_size)
    memory, how = memory_needed(req, estimate)
    user_code = user_code_of(spec.task)
    needs = core.Needs(memory_gb=memory, memory_given=req.min_gpu_memory_gb is not None, engine=req.engine,
                       max_price_per_hour=req.max_price_per_hour, min_reliability=req.min_reliability,
                       user_code=user_code)
    return needs, {"min_gpu_memory_gb": memory, "memory": how, "engine": req.engine,
                   "max_price_per_hour": req.max_price_per_hour, "min_reliability": req.min_reliability,
                   "user_code": list(user_code)}


def user_code_of(task: dict) -> tuple[str, ...]:
    """The owner's code a job's task (its spec) runs on a worker: read from the spec, nothing is imported."""
    return tuple(build_task(task).user_code())


def offer_of(worker: Worker, r: Reliability) -> core.Offer:
    facts: Hardware | None = worker.facts
    return core.Offer(worker.pk, float(worker.price_per_hour), r.value,
                      None if facts is None else facts.model_memory_gb, tuple(facts.engines) if facts else (),
                      worker.allow_user_code)


def match_workers(needs: core.Needs, workers: Iterable[Worker], *,
                  reliabilities: dict[int, Reliability] | None = None) -> core.Matching:
    """Who of ``workers`` meets ``needs``, and why the others do not."""
    workers = list(workers)
    reliabilities = worker_reliability(workers) if reliabilities is None else reliabilities
    return core.match([offer_of(w, reliabilities[w.pk]) for w in workers], needs)


def online_workers() -> list[Worker]:
    """Every worker a job could ever get now: connected, not suspended, paused or removed (busy or not)."""
    return list(Worker.objects.exclude(status=Worker.Status.OFFLINE).filter(suspended_at__isnull=True, paused_at=None,
                                                                            removed_at=None))


def job_waiting_reason(job: Job) -> str:
    """Why a running job has no worker now ("" when it has some, or is not running), in the words of its page,
    the API (``waiting_reason``) and ``echo2 job status``. It starts by itself: every hello and every re-plan
    offers idle workers to running jobs, oldest first (first come, first served)."""
    if job.status != Job.Status.RUNNING:
        return ""
    if job.learner_seen_at is None:
        return f"waiting for learner: none has reported yet (echo2-learner --job {job.pk})"
    if job.activations.filter(ended_at=None).exists():
        return ""
    workers = online_workers()
    if not workers:
        return "waiting for workers: none online"
    needs = needs_of(job.settings)[0]
    reliabilities = worker_reliability(workers)
    offers = [offer_of(w, reliabilities[w.pk]) for w in workers]
    matched = core.match(offers, needs)
    if not matched.qualify:  # which requirement, and what would fix it
        return f"waiting for workers: {matched.line()}: {core.remedy(offers, needs, matched)}"
    busy = set(Activation.objects.filter(ended_at=None, worker_id__in=matched.qualify).values_list("worker_id",
                                                                                                   flat=True))
    if len(busy) == len(matched.qualify):
        return (f"waiting for workers: {matched.line()}, all busy in other jobs (first come, first served: "
                "they go to the oldest running job that needs them when they are released)")
    return f"waiting for workers: {matched.line()}; the next re-plan activates them"
