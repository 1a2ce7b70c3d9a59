"""Relay failures and chain repair (paper section 4.2, appendix D; docs/broadcast.md "Failures"): a child's report
of its relay parent (believed as far as the site can confirm it: docs/trust.md, "What the scheduler believes"), the
plan repaired around a relay that failed or went away, and the new routes pushed to the workers they concern, each
with a fresh transfer credential. Split from :mod:`.broadcast`, whose messages it sends."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dataplane.broadcast import chains

from ..infra import liveness, telemetry
from ..models import Job, Snapshot, SnapshotInstall, Worker
from ..reads import selectors
from . import fanout
from .base import ServiceError, push_job_update, push_to_worker, running_activation
from .broadcast import credential_expiry, snapshot_message

log = logging.getLogger(__name__)


@transaction.atomic
def relay_failed(*, worker: Worker, job_id: int, version: int, culprit_worker_id: int | None, reason: str) -> None:
    """An agent says its relay parent failed. The parent is counted failed and excised from the plan
    (``chains.repair``) only when the site can confirm it (``_parent_failure_confirmed``: other children said so
    too, or the parent is silent). On one child's word alone the child moves and nobody else: to another parent
    that holds or is receiving the version (``chains.reroute``: the learner's spare slot when the accused is a seed,
    another chain's relay tail), taking the rest of its chain along, else out of the chains to the learner's HTTP
    fallback (``chains.detach``); the accused keeps its place and its score.

    A report that crossed the worker's release or the job's end is moot, not wrong: the chain it is about closed with
    the job (the learner stops its relay when the job ends, so every child sees its parent go), and nothing is
    repaired. Only a worker that never served the job is refused."""
    try:
        activation = running_activation(worker, job_id)
    except ServiceError:
        if not worker.activations.filter(job_id=job_id).exists():
            raise
        log.info("job %s v%s: worker %s's relay report came after its part in the job ended; nothing to repair",
                 job_id, version, worker.pk)
        return
    job = activation.job
    plan = telemetry.load_chain_plan(job_id, version)
    log.warning("job %s v%s: worker %s reports relay parent %s failed: %s", job_id, version, worker.pk,
                culprit_worker_id if culprit_worker_id is not None else "learner", reason[:200])
    if plan is None or culprit_worker_id is None:
        return  # the learner's relay or an old plan: the agent falls back to HTTP on its own
    route = chains.route(plan, worker.pk)
    if route is None or route[0] != culprit_worker_id:
        raise ServiceError(f"culprit_worker_id: worker {culprit_worker_id} is not your parent for version {version}")
    witnesses = telemetry.relay_failure_witness(job_id, parent_id=culprit_worker_id, child_id=worker.pk,
                                                window_s=chains.ScoreParams().decay_window_s)
    why = _parent_failure_confirmed(job_id, version, culprit_worker_id, witnesses=witnesses)
    if not why:
        rerouted = _reroute(job, version, plan, worker.pk)
        if rerouted is not None:
            log.info("job %s v%s: worker %s's word alone: it now pulls from %s; parent %s not counted", job_id,
                     version, worker.pk, rerouted[1][0][1] if rerouted[1][0][1] is not None else "the learner",
                     culprit_worker_id)
            _apply_repair(job, version, *rerouted, also=(culprit_worker_id,))  # the accused: its child is gone
            return
        log.info("job %s v%s: worker %s's word alone: no relay to take it, it fetches from the learner; parent %s "
                 "not counted", job_id, version, worker.pk, culprit_worker_id)
        _apply_repair(job, version, *chains.detach(plan, worker.pk), also=(worker.pk,))
        return
    log.warning("job %s v%s: relay parent %s failed (%s)", job_id, version, culprit_worker_id, why)
    Worker.objects.filter(pk=culprit_worker_id).update(relay_failures=F("relay_failures") + 1,
                                                       relay_last_failure_at=timezone.now())
    _excise(job, version, plan, culprit_worker_id)


def _reroute(job: Job, version: int, plan: chains.ChainPlan,
             worker_id: int) -> tuple[chains.ChainPlan, list[tuple[int, int | None]]] | None:
    """``chains.reroute`` over what the site knows: who can serve a child (a relay address, and online), who has
    installed the version, and the learner's fan-out for it (the seeds it was announced with, and one more)."""
    members = [w for chain in plan.chains for w in chain]
    relays = set(Worker.objects.filter(pk__in=members).exclude(relay_address="").exclude(status=Worker.Status.OFFLINE)
                 .values_list("pk", flat=True))
    holding = set(SnapshotInstall.objects.filter(snapshot__job_id=job.pk, snapshot__version=version,
                                                 worker_id__in=members).values_list("worker_id", flat=True))
    seeds = fanout.announced_seeds(job.pk, version)  # gone (an old announcement): no slot known to be spare
    learner_slots = seeds + 1 if seeds is not None else len(plan.chains)
    return chains.reroute(plan, worker_id, relays=relays, learner_slots=learner_slots, holding=holding)


def _parent_failure_confirmed(job_id: int, version: int, parent_id: int, *, witnesses: int) -> str:
    """Why the site believes relay parent ``parent_id`` failed ("" when it does not): ``RELAY_FAILURE_WITNESSES``
    distinct children reported it within the decay window, or it is silent: no heartbeat for
    ``RELAY_PARENT_SILENT_S``, or no install of ``version`` reported that long after its publication."""
    echo = settings.ECHO2
    if witnesses >= int(echo["RELAY_FAILURE_WITNESSES"]):
        return f"{witnesses} children reported it"
    bound = float(echo["RELAY_PARENT_SILENT_S"])
    now = time.time()
    parent = Worker.objects.filter(pk=parent_id).values("status", "last_heartbeat").first()
    if parent is None or parent["status"] == Worker.Status.OFFLINE:
        return "it is offline"
    heard = [t for t in (liveness.last_seen([parent_id]).get(parent_id),
                         parent["last_heartbeat"] and parent["last_heartbeat"].timestamp()) if t]
    if not heard or now - max(heard) > bound:
        return f"no heartbeat for {bound:.0f} s"
    snap = Snapshot.objects.filter(job_id=job_id, version=version).values("pk", "published_at").first()
    if (snap is not None and now - snap["published_at"].timestamp() > bound
            and not SnapshotInstall.objects.filter(snapshot_id=snap["pk"], worker_id=parent_id).exists()):
        return f"no install of v{version} {bound:.0f} s after its publication"
    return ""


def _excise(job: Job, version: int, plan: chains.ChainPlan, gone: int) -> None:
    """Take worker ``gone`` out of the chain plan of ``version`` (``chains.repair``) and re-point whoever
    pulled from it (telling each new parent which child to serve)."""
    _apply_repair(job, version, *chains.repair(plan, gone))


def _apply_repair(job: Job, version: int, new_plan: chains.ChainPlan, moves: list[tuple[int, int | None]],
                  also: Sequence[int] = ()) -> None:
    """Save ``new_plan`` of ``version`` and send its new route to each worker a move concerns (the child, its new
    parent) and to the workers in ``also`` (one taken out of the chains: it fetches over HTTP)."""
    telemetry.save_chain_plan(job.pk, version, new_plan)
    push_job_update(job.pk)
    snap = Snapshot.objects.filter(job_id=job.pk, version=version).first()
    if snap is None:
        return
    targets = [*also, *(t for move in moves for t in move if t is not None)]
    routes = {t: chains.route(new_plan, t) for t in targets}
    # every target's parent too: a new parent inside a chain is told its own parent again with its new child
    dialled = {*targets, *(r[0] for r in routes.values() if r is not None and r[0] is not None)}
    addresses = dict(Worker.objects.filter(pk__in=dialled).values_list("pk", "relay_address"))
    expires = credential_expiry()  # re-issued: the repair may come late in a long transfer
    for child, new_parent in moves:
        log.info("job %s v%s: repair: worker %s now pulls from %s", job.pk, version, child,
                 new_parent if new_parent is not None else "the learner")
    for target in dict.fromkeys(targets):
        push_to_worker(target, snapshot_message(snap, job=job, worker_id=target, expires=expires,
                                                route=routes[target], addresses=addresses))


def repair_without(worker: Worker) -> None:
    """A worker went away (socket closed, or silent past the timeout): take it out of the newest chain plan
    of its running job at once, rather than when its orphaned child's transfer stalls (paper appendix D).
    Not counted as a relay failure: it may just be restarting. Runs inside the caller's transaction."""
    activation = selectors.active_activation(worker=worker)
    job = activation.job if activation else None
    if job is None or job.status != Job.Status.RUNNING:
        return  # (version 0, the base, has a chain plan too once published)
    plan = telemetry.load_chain_plan(job.pk, job.published_version)
    if plan is not None and any(worker.pk in chain for chain in plan.chains):
        log.info("job %s v%s: worker %s went away; repairing its chain", job.pk, job.published_version, worker.pk)
        _excise(job, job.published_version, plan, worker.pk)
