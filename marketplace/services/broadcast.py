"""Snapshot broadcast (paper section 4.2, appendix C.3 and D; docs/broadcast.md): publication, the chain plan
and each worker's place in it. Install reports and the relay statistics they feed are :mod:`.installs`';
relay failures and the repairs they lead to are :mod:`.repair`'s.

The planning itself is the job's chain strategy (``dataplane.broadcast.strategies``, the same objects the
simulator plans with) over the pure core ``chains`` (score, assembly, tails, repair, bandwidth average); this
module loads its inputs, saves the plan (``telemetry``) and tells each agent where to pull from, with the
transfer credential that lets it (docs/trust.md): every snapshot message carries a fresh one for its worker
and, for a relay parent, the sha256 of its child's.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction

from dataplane import basemodel
from dataplane import messages as m
from dataplane.broadcast import chains, strategies
from dataplane.snapshot import SnapshotError, parse_manifest

from ..infra import telemetry
from ..models import Job, Snapshot, Worker
from ..reads import selectors
from . import fanout
from .base import (
    ServiceError,
    learner_may_report,
    push_job_update,
    running_activation,
)

log = logging.getLogger(__name__)


def relaying(job: Job) -> bool:
    """Snapshots travel down relay chains: a relayed strategy (``chain``) and a learner relay to seed them."""
    return strategies.get(job.settings.broadcast_strategy).relayed and bool(job.learner_relay)


def assign_message(job: Job, *, worker_id: int) -> m.Assign:
    """Worker ``worker_id``'s assignment to ``job``: its base snapshot (version 0, with the digest the agent checks
    it against) and the newest one, both fetched over HTTP with the worker's credential (it joins the chains at
    the next publication)."""
    return assign_messages(job, [worker_id])[worker_id]


def assign_messages(job: Job, worker_ids: list[int]) -> dict[int, m.Assign]:
    """:func:`assign_message` of each of ``worker_ids``, the job's snapshots read once."""
    base, snap = selectors.base_snapshot(job), selectors.latest_snapshot(job)
    expires = credential_expiry()
    return {worker_id: _assign(job, worker_id=worker_id, base=base, snap=snap, expires=expires)
            for worker_id in worker_ids}


def _assign(job: Job, *, worker_id: int, base: Snapshot | None, snap: Snapshot | None, expires: int) -> m.Assign:
    def message(s):
        return snapshot_message(s, job=job, worker_id=worker_id, expires=expires).model_dump(mode="json")

    return m.Assign(
        job_id=job.pk, model=job.model_dir, task=job.task, group_size=job.settings.group_size,
        max_new_tokens=job.settings.max_new_tokens, temperature=job.settings.temperature, top_p=job.settings.top_p,
        prompt_format=job.settings.prompt_format,
        base_digest=job.base_digest or None, base=message(base) if base else None,
        snapshot=message(snap) if snap and snap.version > 0 else None,
    )


def credential_expiry() -> int:
    """When credentials issued now expire (Unix s): ``ECHO2["TRANSFER_CREDENTIAL_TTL_S"]`` from now. Computed
    once per publication or repair, so the token a child gets and the fingerprint its parent gets agree."""
    return int(time.time() + settings.ECHO2["TRANSFER_CREDENTIAL_TTL_S"])


def snapshot_message(snap: Snapshot, *, job: Job, worker_id: int, expires: int,
                     route: tuple[int | None, int | None] | None = None,
                     addresses: dict[int, str] | None = None) -> m.SnapshotAvailable:
    """The snapshot for worker ``worker_id``, with its transfer credential (``fanout.notice``, which a
    publication's fan-out builds the same way). ``route`` is its (parent, child) in the chain plan (parent None:
    the learner's relay); without a route it fetches over HTTP from ``snap.url``. A relay parent also gets the
    sha256 of its child's credential, the only child it will then serve."""
    return fanout.notice(_announced(snap, job=job, expires=expires), worker_id=worker_id, route=route,
                         addresses=addresses)


def _announced(snap: Snapshot, *, job: Job, expires: int) -> fanout.Announced:
    return fanout.announced(snap, strategy=job.settings.broadcast_strategy, learner_relay=job.learner_relay or "",
                            secret=job.transfer_secret, expires=expires)


def _checked_manifest(job: Job, version: int, manifest: Any) -> dict:
    """The learner's manifest, its shape checked (``dataplane.snapshot.parse_manifest``): agents verify every
    chunk and the whole payload against it, so a malformed one is refused here, naming the field."""
    try:
        parsed = parse_manifest(manifest, max_total_bytes=settings.ECHO2["MAX_SNAPSHOT_BYTES"])
    except SnapshotError as err:
        raise ServiceError(str(err)) from None
    if (parsed.job_id, parsed.version) != (job.pk, version):
        raise ServiceError(f"manifest: describes job {parsed.job_id} version {parsed.version}, "
                           f"not job {job.pk} version {version}")
    return parsed.model_dump(mode="json")


@transaction.atomic
def snapshot_publish(*, job: Job, version: int, url: str, manifest: dict) -> Snapshot:
    """Record a version and tell every active worker where to get it: its chain parent (or the learner's
    HTTP server), and which child its relay serves (docs/broadcast.md).

    Version 0 is the job's base checkpoint (dataplane/basemodel.py), published once before training; its
    payload's sha256 becomes ``Job.base_digest``. Every later version must be newer than the last."""
    job = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
    learner_may_report(job)
    snap = Snapshot.objects.filter(job=job, version=version).first()
    if snap is not None and snap.manifest.get("sha256") == manifest.get("sha256"):
        # The learner announces again what it published: our reply was lost, or it restarted and serves it from a
        # new address (what agents fetch from now on). The newest is planned and pushed again; an older one (the
        # base) only moves.
        if snap.url != url:
            snap.url = url
            snap.save(update_fields=["url"])
        if version < job.published_version:
            snap.n_chains = 0
            return snap
    elif version == 0:
        _check_base(job, manifest)
    elif version <= job.published_version:
        raise ServiceError(f"version: {version} is not newer than the published {job.published_version}")
    if snap is None:
        manifest = _checked_manifest(job, version, manifest)
        snap = Snapshot.objects.create(job=job, version=version, url=url, manifest=manifest)
        if version == 0:
            Job.objects.filter(pk=job.pk).update(base_digest=manifest["sha256"])
        else:
            Job.objects.filter(pk=job.pk).update(published_version=version)
    # A worker whose socket closed keeps its activation until it times out (it may reconnect), but it cannot
    # relay meanwhile: it is left out of the plan and gets the newest snapshot when it says hello again.
    active = [PlannedWorker(*row) for row in Worker.objects.filter(activations__job=job, activations__ended_at=None)
              .exclude(status=Worker.Status.OFFLINE).order_by("pk").values_list(*PlannedWorker._fields)]
    plan = _away_from_the_accused(job, broadcast_plan(job=job, workers=active, now=time.time()), active)
    telemetry.save_chain_plan(job.pk, version, plan)
    snap.n_chains = len(plan.chains)  # the learner sizes its relay's fan-out from this (API reply)
    push_job_update(job.pk)
    # One event to the job's agents group after the commit (the last push: the fan-out it starts keeps this
    # process busy); each agent socket builds its own worker's message (route, credential, child's fingerprint)
    # off this request: docs/broadcast.md "Publication at fleet size".
    fanout.publication_announce(job_id=job.pk, version=version, plan=plan,
                                addresses={w.pk: w.relay_address for w in active}, expires=credential_expiry())
    return snap


class PlannedWorker(NamedTuple):
    """What planning reads of an active worker (``broadcast_plan``, ``selectors.chain_stats``), with the model's
    own derived figures. A row, not a model instance: at 10 k workers the instances were most of the publish
    request's time and, kept alive through it, set off the collections of the whole process's heap (0.5 s)."""

    pk: int
    relay_address: str
    bandwidth_bps: int
    measured_bandwidth_bps: float | None
    relay_successes: int
    relay_failures: int
    relay_last_failure_at: datetime | None
    last_heartbeat: datetime | None
    audits_passed: int
    audits_failed: int

    relay_bandwidth_bps = Worker.relay_bandwidth_bps
    audit_pass_rate = Worker.audit_pass_rate


def _away_from_the_accused(job: Job, plan: chains.ChainPlan, active: Sequence[PlannedWorker]) -> chains.ChainPlan:
    """A worker that said its relay parent failed (one child's word, within the score's decay window) is not planned
    under that parent again: another chain's relay tail takes it (``chains.reroute`` with no learner slot beyond
    the plan's ``N_ch`` seeds: a liar adds no chain), else it stays (and moves if it reports again). Before, a relay
    that died without its socket closing (a crashed host: the site hears nothing until the worker timeout, 30 s)
    was planned as the same child's parent at every publication, and the child found out again each time (the
    `paper` WAN bench: v6 and v8)."""
    pairs = [(chain[i - 1], chain[i]) for chain in plan.chains for i in range(1, len(chain))]
    if not pairs:
        return plan
    reported = telemetry.relay_failure_reporters(job.pk, sorted({parent for parent, _ in pairs}))
    relays = {w.pk for w in active if w.relay_address}
    for parent, child in pairs:
        if child in reported.get(parent, ()) and (chains.route(plan, child) or (None,))[0] == parent:
            moved = chains.reroute(plan, child, relays=relays - {parent}, learner_slots=len(plan.chains))
            if moved is not None:
                log.info("job %s: worker %s said relay %s failed; planned under %s instead", job.pk, child, parent,
                         moved[1][0][1] if moved[1][0][1] is not None else "the learner")
                plan = moved[0]
    return plan


def _check_base(job: Job, manifest: dict) -> None:
    if job.base_digest or job.snapshots.filter(version=0).exists():
        raise ServiceError("version: the base snapshot (version 0) of this job is already published")
    if manifest.get("format") != basemodel.FORMAT:
        raise ServiceError(f"manifest: version 0 is the base checkpoint archive, format {basemodel.FORMAT!r}")
    digest = manifest.get("sha256")
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        raise ServiceError("manifest: sha256 must be 64 lowercase hex digits")


def snapshot_request(*, worker: Worker, job_id: int, which: str) -> list[m._Msg]:
    """An agent asks for its job's base or newest snapshot (it joined late, restarted, or failed to install
    what it was told): that snapshot, fetched over HTTP; nothing while none is published. The learner keeps
    both on disk (learner/serving.py)."""
    job = running_activation(worker, job_id).job
    snap = selectors.base_snapshot(job) if which == "base" else selectors.latest_snapshot(job)
    if snap is None:
        return []
    return [snapshot_message(snap, job=job, worker_id=worker.pk, expires=credential_expiry())]


def broadcast_plan(*, job: Job, workers: Sequence[Worker | PlannedWorker], now: float) -> chains.ChainPlan:
    """The plan of the job's strategy (``strategies.get(job.broadcast_strategy).plan``; docs/broadcast.md "Chain
    assignment") over the workers' relay statistics (``selectors.chain_stats``: each one's ``Bw_hat``, measured,
    else registered); a worker can serve a child when it registered a ``relay_address``. A relayed strategy
    whose learner announced no relay: everyone is rollout-only (HTTP)."""
    strategy = strategies.get(job.settings.broadcast_strategy)
    if strategy.relayed and not job.learner_relay:
        return chains.star_plan([w.pk for w in workers])
    return strategy.plan(selectors.chain_stats(workers, now=now), can_relay={w.pk for w in workers if w.relay_address},
                         b0_bps=job.settings.learner_uplink_bps, now=now)
