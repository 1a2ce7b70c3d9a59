"""Install reports: every worker of a job reports each snapshot version it installs, so at every publication the
whole fleet reports at once. Counted once per worker and version however often reported (``SnapshotInstall``);
they fix the version's T_bcast once ceil(active/gamma) workers have it, and an install received from a relay parent
counts as a success for that parent (the chain score's Success term) and measures its uplink.

:func:`snapshots_installed` writes the reports of many workers in one transaction of five statements (the agent
sockets of a process hand it every report that arrived while the last batch was written), where one report at a
time took four statements and a commit each: at a publication to a thousand workers, four thousand statements and
a thousand commits queued on the sockets' database threads, each batch now one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from django.db import connection, transaction
from django.db.models import Case, F, Value, When

from dataplane.broadcast import chains

from ..infra import telemetry
from ..models import Activation, Snapshot, SnapshotInstall, Worker
from ..reads import selectors
from .base import ServiceError, checked_running, push_job_update, retry_conflicts
from .rollouts import JobAtWork

log = logging.getLogger(__name__)


class InstallReport(NamedTuple):
    """What a worker reported (``snapshot_installed`` message), with when the site received it (``at``, Unix s: the
    install's time on the site's clock, whenever it is written) and the socket's shared read of the running job
    (``at_work``: when it names the worker active, neither the worker's activation nor the job is read again)."""

    worker: Worker
    job_id: int
    version: int
    seconds: float
    source: str = "http"
    at_work: JobAtWork | None = None
    at: float = 0.0


class _Fleet(NamedTuple):
    """What fixing T_bcast needs of the job: its active workers (None: counted when needed) and gamma."""

    active: int | None
    gamma: float


def snapshots_installed(reports: Sequence[InstallReport]) -> list[ServiceError | None]:
    """Record ``reports``; per report, None or why it was refused (a version never published, a worker not active in
    a running job). The reports whose ``at_work`` names their worker active are written together in one transaction;
    the rest (rare: a socket whose shared read is older than the worker's activation) one at a time, each checked
    against the database as :func:`snapshot_installed`. An outage's error is raised (every report then failed)."""
    outcomes: list[ServiceError | None] = [None] * len(reports)
    fleets = [_vouched(report) for report in reports]
    named = [i for i, fleet in enumerate(fleets) if fleet is not None]
    if named:
        written = _written_together([(reports[i], fleets[i]) for i in named])
        for i, outcome in zip(named, written, strict=True):
            outcomes[i] = outcome
    for i in sorted(set(range(len(reports))) - set(named)):
        try:
            snapshot_installed(**reports[i]._asdict())
        except ServiceError as err:
            outcomes[i] = err
    return outcomes


@retry_conflicts
@transaction.atomic
def snapshot_installed(*, worker: Worker, job_id: int, version: int, seconds: float, source: str = "http",
                       at_work: JobAtWork | None = None, at: float = 0.0) -> None:
    """Record one install report (:class:`InstallReport`; ``at`` 0: now), raising :class:`ServiceError` when it is
    refused. With the agent's hello, the one place that sets ``Worker.installed_version``.

    A report that arrives after the worker's activation in the job ended (the install finished as the job completed
    or the worker was released) is late, not wrong: it is ignored, with nothing to tell the agent."""
    report = InstallReport(worker, job_id, version, seconds, source, at_work, at or time.time())
    fleet = _vouched(report)
    if fleet is None:
        activation = selectors.active_activation(worker=worker, job_id=job_id)
        if activation is None and Activation.objects.filter(worker=worker, job_id=job_id).exists():
            log.info("job %s v%s: worker %s reported an install after its activation ended; ignored", job_id,
                     version, worker.pk)
            return
        fleet = _Fleet(None, checked_running(activation, worker, job_id).job.settings.gamma)
    (error,) = _written([(report, fleet)])
    if error is not None:
        raise error


def _vouched(report: InstallReport) -> _Fleet | None:
    """The job's fleet as the socket's shared read has it, when that read names the worker active; else None."""
    view = report.at_work
    if view is None or view.running.job_id != report.job_id or report.worker.pk not in view.active:
        return None
    return _Fleet(len(view.active), view.gamma)


@retry_conflicts
@transaction.atomic
def _written_together(items: list[tuple[InstallReport, _Fleet]]) -> list[ServiceError | None]:
    return _written(items)


def _written(items: list[tuple[InstallReport, _Fleet]]) -> list[ServiceError | None]:
    """The reports of ``items`` (each worker known active) written in the caller's transaction: the snapshots read
    (one query; a version never published refuses its report), each worker's ``installed_version`` set to the last
    it reported (one; two for several workers, their rows locked in id order first), the installs inserted, those
    recorded before left alone (one), then per snapshot its counters (one). The snapshot's row is the one every
    worker's report of the version updates: it is written last, so it is held only to the commit. Not the
    snapshots' manifests (26 kB of JSON at 256 chunks): a relay's success loads its own."""
    keys = {(report.job_id, report.version) for report, _ in items}
    snaps = {(s.job_id, s.version): s for s in Snapshot.objects.filter(
        job_id__in={job for job, _ in keys}, version__in={version for _, version in keys}).only(
        "pk", "job_id", "version", "published_at", "t_bcast")}
    outcomes: list[ServiceError | None] = []
    found: list[tuple[InstallReport, _Fleet, Snapshot]] = []
    for report, fleet in items:
        snap = snaps.get((report.job_id, report.version))
        outcomes.append(None if snap is not None else ServiceError(
            f"version: snapshot {report.version} of job {report.job_id} was never published"))
        if snap is not None:
            found.append((report, fleet, snap))
    if not found:
        return outcomes
    last = {report.worker.pk: report.version for report, _, _ in found}
    if len(last) > 1:  # in id order, as a job's finish locks them: the two never wait for each other in a cycle
        list(Worker.objects.select_for_update(no_key=True).filter(pk__in=last).order_by("pk").values_list("pk"))
    Worker.objects.bulk_update([Worker(pk=pk, installed_version=version) for pk, version in sorted(last.items())],
                               ["installed_version"])
    # the installs the site can check (a published version of this job): each worker leaves "loading" at its report
    seen = [(report.worker.pk, report.job_id, "installed", report.at) for report, _, _ in found]
    transaction.on_commit(lambda: telemetry.records_observed(seen))
    fresh = _inserted(found)
    if len(fresh) < len(found):
        log.info("%d install report(s) sent again; each counted once", len(found) - len(fresh))
    _relays_credited([(report, snap) for report, _, snap in fresh if report.source == "parent"])
    for snap in sorted({snap.pk: snap for _, _, snap in fresh}.values(), key=lambda s: s.pk):
        _counted([(report, fleet) for report, fleet, of in fresh if of.pk == snap.pk], snap)
    for job_id in sorted({report.job_id for report, _, _ in found}):
        push_job_update(job_id)  # the page shows who has which version
    return outcomes


def _inserted(found: list[tuple[InstallReport, _Fleet, Snapshot]]) -> list[tuple[InstallReport, _Fleet, Snapshot]]:
    """Insert the installs of ``found`` (one per worker and snapshot, the first reported), in arrival order; those
    not recorded before. One ``INSERT ... ON CONFLICT DO NOTHING`` on the one-install-per-worker constraint."""
    first: dict[tuple[int, int], tuple[InstallReport, _Fleet, Snapshot]] = {}
    for item in sorted(found, key=lambda f: f[0].at):
        first.setdefault((item[2].pk, item[0].worker.pk), item)
    table = SnapshotInstall._meta.db_table
    values = [[snap.pk, report.worker.pk, report.source, report.seconds,
               connection.ops.adapt_datetimefield_value(datetime.fromtimestamp(report.at, tz=UTC))]
              for report, _, snap in first.values()]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} (snapshot_id, worker_id, source, seconds, installed_at) "  # noqa: S608
                       f"VALUES {', '.join(['(%s, %s, %s, %s, %s)'] * len(values))} "
                       "ON CONFLICT (snapshot_id, worker_id) DO NOTHING RETURNING snapshot_id, worker_id",
                       [value for row in values for value in row])
        recorded = {(snap_id, worker_id) for snap_id, worker_id in cursor.fetchall()}
    return [item for key, item in first.items() if key in recorded]


def _counted(fresh: list[tuple[InstallReport, _Fleet]], snap: Snapshot) -> None:
    """Add the ``fresh`` installs (arrival order) to the snapshot's counters in one ``UPDATE``. T_bcast is fixed by
    the install that brings the count to ceil(active / gamma), whichever it is (its time after the publication, as
    the site saw it): which of these that is depends on the count before them, so the statement picks it (one
    ``WHEN`` per install), not a read of the row that would have to lock it first."""
    counters = {"installs": F("installs") + len(fresh)}
    via_parent = sum(report.source == "parent" for report, _ in fresh)
    if via_parent:
        counters["installs_via_parent"] = F("installs_via_parent") + via_parent
    if snap.t_bcast is None:
        active, gamma = fresh[-1][1]
        if active is None:
            active = Activation.objects.filter(job_id=snap.job_id, ended_at=None).count()
        needed, published = math.ceil(active / gamma), snap.published_at.timestamp()
        counters["t_bcast"] = Case(
            When(t_bcast__isnull=False, then=F("t_bcast")),
            *(When(installs__gte=needed - 1 - i, then=Value(max(0.0, report.at - published)))
              for i, (report, _) in enumerate(fresh)),
            default=None)
    Snapshot.objects.filter(pk=snap.pk).update(**counters)


def _relays_credited(through_parent: list[tuple[InstallReport, Snapshot]]) -> None:
    """Reports of installs received from a relay parent: each is that parent's success, when the version's plan
    routes the worker under one. Each snapshot's plan (Redis) and size (its manifest, 26 kB of JSON at 256 chunks)
    are read once however many of its children report; the parents' rows are locked in id order."""
    plans: dict[int, chains.ChainPlan | None] = {}
    sizes: dict[int, int] = {}
    credits = []
    for report, snap in through_parent:
        if snap.pk not in plans:
            plans[snap.pk] = telemetry.load_chain_plan(report.job_id, report.version)
        route = chains.route(plans[snap.pk], report.worker.pk) if plans[snap.pk] else None
        if route is not None and route[0] is not None:
            credits.append((route[0], report, snap))
    for parent_id, report, snap in sorted(credits, key=lambda c: c[0]):
        if snap.pk not in sizes:  # the base's install time includes building the engine: no measure of the link
            sizes[snap.pk] = int(Snapshot.objects.filter(pk=snap.pk).values_list("manifest", flat=True).get().get(
                "total_bytes") or 0) if snap.version > 0 else 0
        _relay_succeeded(parent_id, snap=snap, total_bytes=sizes[snap.pk], child_bps=float(report.worker.bandwidth_bps),
                         seconds=report.at - snap.published_at.timestamp())


def _relay_succeeded(parent_id: int, *, snap: Snapshot, total_bytes: int, seconds: float, child_bps: float) -> None:
    """A child (its link ``child_bps``) installed ``snap`` through ``parent_id`` ``seconds`` after its publication
    (as the site saw both): one more success (the score's Success term), and the rate the child saw folded into the
    parent's ``Bw_hat`` when the parent's uplink held the hop back, not the parent's own parent nor the child's link
    (``chains.measured_bandwidth``, given the parent's own install of ``snap`` as the site saw it), never above the
    parent's registered ``Bw``."""
    parent = Worker.objects.select_for_update(no_key=True).filter(pk=parent_id).first()
    if parent is None:
        return
    own = SnapshotInstall.objects.filter(snapshot=snap, worker_id=parent_id).values_list("installed_at", flat=True)
    parent_seconds = next(((t - snap.published_at).total_seconds() for t in own), None)
    parent.relay_successes += 1
    parent.measured_bandwidth_bps = chains.measured_bandwidth(
        parent.measured_bandwidth_bps, total_bytes=total_bytes, seconds=seconds, parent_seconds=parent_seconds,
        registered_bps=float(parent.bandwidth_bps), child_bps=child_bps)
    parent.save(update_fields=["relay_successes", "measured_bandwidth_bps"])
