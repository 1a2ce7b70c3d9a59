"""Many agents' hellos in one transaction: what a fleet's reconnect sends a site process at once.

After a site restart every agent of a fleet says hello within seconds. One by one, each hello was a transaction of
five to eight statements on the sockets' database threads (``presence.worker_connected``), so the last of 1,000
agents on one process was welcomed about 14 s after the first (docs/architecture.md "The reconnect storm"), and
every socket's other database work queued behind them. Together (``marketplace.realtime.batches.GroupCommit``),
a round's hellos read their workers' activations, open sessions and recent losses in one query each, open their
sessions in one insert and mark their workers in one update per kind of change; what is rare (a session the site
missed the end of, a worker taken back into the job it left by going silent) is done per worker, as alone.

Each hello gets what ``worker_connected`` would have given it. When the batch fails as a whole, each hello is
tried again alone, so one bad hello costs the others nothing but time.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction

from dataplane import messages as m
from dataplane.hardware import Hardware

from ..infra import liveness
from ..models import Activation, Worker, WorkerSession
from .broadcast import assign_messages
from .presence import (
    PROVISION_WINDOW_S,
    _session_open,
    enqueue_coalesced,
    rejoin_after,
    rejoin_window,
    welcome,
    worker_connected,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Hello:
    """One agent's hello, as :func:`presence.worker_connected` takes it."""

    worker: Worker
    installed_version: int | None
    at: datetime
    hardware: Hardware | None = None
    allow_user_code: bool | None = None

    def alone(self) -> list[m._Msg]:
        return worker_connected(worker=self.worker, installed_version=self.installed_version, at=self.at,
                                hardware=self.hardware, allow_user_code=self.allow_user_code)


def workers_connected(hellos: Sequence[Hello]) -> list[list[m._Msg] | BaseException]:
    """The replies to each hello (``worker_connected``'s), or the exception that is its outcome."""
    if len({h.worker.pk for h in hellos}) == len(hellos) > 1:
        try:
            return _together(hellos)
        except Exception as err:  # noqa: BLE001 - each alone below says whose it was
            log.warning("%d hellos written together failed (%s: %s); each alone", len(hellos), type(err).__name__,
                        err)
    outcomes: list[list[m._Msg] | BaseException] = []
    for hello in hellos:  # one worker's two sockets at once (a reconnect): in turn, as they came
        try:
            outcomes.append(hello.alone())
        except Exception as err:  # noqa: BLE001 - the caller raises it for that hello alone
            outcomes.append(err)
    return outcomes


@transaction.atomic
def _together(hellos: Sequence[Hello]) -> list[list[m._Msg]]:
    ids = [h.worker.pk for h in hellos]
    active: dict[int, Activation] = {}
    for activation in Activation.objects.select_related("job").filter(worker_id__in=ids, ended_at=None).order_by("pk"):
        active.setdefault(activation.worker_id, activation)  # as active_activation's first()
    stale = set(WorkerSession.objects.filter(worker_id__in=ids, ended_at=None).values_list("worker_id", flat=True))
    for hello in hellos:
        if hello.worker.pk in stale:
            _session_open(hello.worker.pk, at=hello.at)  # the rare path, with its billing: as alone
    WorkerSession.objects.bulk_create([WorkerSession(worker_id=h.worker.pk, started_at=h.at) for h in hellos
                                       if h.worker.pk not in stale])
    _workers_marked(hellos, active)
    marks = [(h.worker.pk, h.at.timestamp(), a.state if (a := active.get(h.worker.pk)) else "idle",
              a.job_id if a else None) for h in hellos]
    transaction.on_commit(lambda: liveness.marks_online(marks))

    assigns: dict[int, m.Assign] = {}
    by_job: dict[int, list[Activation]] = defaultdict(list)
    for activation in active.values():
        by_job[activation.job_id].append(activation)
    for activations in by_job.values():
        assigns.update(assign_messages(activations[0].job, [a.worker_id for a in activations]))
    idle = [h for h in hellos if h.worker.pk not in active]
    if idle and len(_rejoined(idle)) < len(idle):
        # A new idle worker may be what a running job waits for; a thousand hellos queue one task a second.
        enqueue_coalesced("provision_waiting_jobs", window_s=PROVISION_WINDOW_S)
    return [[welcome(h.worker.pk), *([assigns[h.worker.pk]] if h.worker.pk in assigns else [])] for h in hellos]


def _workers_marked(hellos: Sequence[Hello], active: dict[int, Activation]) -> None:
    """Each worker live as of its hello, as ``worker_connected`` saves it: one update per set of fields."""
    groups: dict[tuple[str, ...], list[Worker]] = defaultdict(list)
    for hello in hellos:
        worker = hello.worker
        worker.status = Worker.Status.ACTIVE if worker.pk in active else Worker.Status.IDLE
        worker.last_heartbeat, worker.installed_version = hello.at, hello.installed_version
        fields = ("status", "last_heartbeat", "installed_version")
        if hello.hardware is not None:
            worker.hardware, worker.hardware_at = hello.hardware.model_dump(), hello.at
            fields += ("hardware", "hardware_at")
        if hello.allow_user_code is not None:
            worker.allow_user_code = hello.allow_user_code
            fields += ("allow_user_code",)
        groups[fields].append(worker)
    for fields, workers in groups.items():
        Worker.objects.bulk_update(workers, list(fields))


def _rejoined(idle: Sequence[Hello]) -> list[Activation]:
    """``presence._rejoin`` of each idle hello, their latest activations read in one query."""
    last: dict[int, Activation] = {}
    for activation in (Activation.objects.select_related("job")
                       .filter(worker_id__in=[h.worker.pk for h in idle],
                               ended_at__gte=min(h.at for h in idle) - rejoin_window())
                       .order_by("worker_id", "-ended_at")):
        last.setdefault(activation.worker_id, activation)
    return [a for h in idle if (a := rejoin_after(h.worker, last.get(h.worker.pk), at=h.at)) is not None]
