"""What every service module shares: the error callers show, the channel groups, the pushes (sent after the
transaction commits), tasks enqueued by name, and the checks several sub-domains make.

This module imports no sibling, so each sub-domain may import it without closing a circle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from functools import wraps
from typing import Any

from asgiref.sync import async_to_sync
from celery import current_app
from channels.layers import get_channel_layer
from django.db import OperationalError, connection, transaction

from dataplane import messages as m

from ..models import Activation, Job, Worker
from ..reads import selectors

log = logging.getLogger(__name__)


class ServiceError(ValueError):
    """A request that cannot be carried out; ``str(err)`` is the reason shown to the caller."""


def worker_group(worker_id: int) -> str:
    return f"worker.{worker_id}"


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


_outbox = threading.local()  # the pushes collected by ``pushes_together`` in this thread, else None
PUSHES_AT_ONCE = 32  # groups sent to at once by one ``pushes_together``


def _push(group: str, event: dict[str, Any]) -> None:
    """Send ``event`` to a channel group once the transaction commits. Best effort: the write is committed
    whatever happens to the push, so a channel layer that is away (Redis restarting) is logged, never turned
    into an error for a request that succeeded (agents catch up on their next hello or snapshot request)."""
    def send() -> None:
        events = getattr(_outbox, "events", None)
        if events is None:
            _send_all([(group, event)])
        else:  # a copy of one already collected (each release's "job changed") is sent once
            events.setdefault((group, json.dumps(event, sort_keys=True)), (group, event))

    transaction.on_commit(send)


@contextlib.contextmanager
def pushes_together() -> Iterator[None]:
    """The pushes of what commits inside, sent together once it is done: one trip to the event loop, a few groups
    at a time, each group's events in order, a repeated event once. A job's end released its workers one by one,
    each release's pushes a trip of their own to the site process's event loop: with a thousand workers on a busy
    site, the owner's Cancel outlived its 60 s HTTP timeout. Which pushes are sent is still the transaction's
    to say (a rolled back one's never reach here); inside another ``pushes_together``, that one sends them."""
    if getattr(_outbox, "events", None) is not None:
        yield
        return
    _outbox.events = {}
    try:
        yield
    finally:
        events, _outbox.events = list(_outbox.events.values()), None
        _send_all(events)


def _send_all(events: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None or not events:
        return
    by_group: dict[str, list[dict[str, Any]]] = {}
    for group, event in events:
        by_group.setdefault(group, []).append(event)
    at_once = asyncio.Semaphore(PUSHES_AT_ONCE)

    async def send_group(group: str, group_events: list[dict[str, Any]]) -> None:
        async with at_once:
            for event in group_events:
                try:
                    await layer.group_send(group, event)
                except Exception as err:  # noqa: BLE001 - any transport failure of a best-effort push
                    log.warning("push to %s lost (%s: %s)", group, type(err).__name__, err)

    async def send() -> None:
        await asyncio.gather(*(send_group(group, group_events) for group, group_events in by_group.items()))

    try:
        async_to_sync(send)()
    except Exception as err:  # noqa: BLE001 - the loop itself failed: every push of it is lost, the writes stand
        log.warning("%d push(es) lost (%s: %s)", len(events), type(err).__name__, err)


def push_to_worker(worker_id: int, message: m._Msg) -> None:
    """Send ``message`` to the worker's agent socket once the transaction commits."""
    _push(worker_group(worker_id), {"type": "agent.message", "message": message.model_dump(mode="json")})


def push_job_update(job: Job | int) -> None:
    """Tell the job's dashboards that it changed (after the transaction commits). The event carries no
    state: each open job page computes the live view itself, at most twice a second
    (``frontend.consumers.JobLiveConsumer``), so a burst of installs costs one query round per viewer and
    a job nobody watches costs nothing."""
    job_id = job if isinstance(job, int) else job.pk
    _push(job_group(job_id), {"type": "job.changed", "job_id": job_id})


def enqueue_task(name: str, *args: Any, countdown: float | None = None) -> None:
    """Run the Celery task ``marketplace.tasks.<name>`` with ``args`` once the transaction commits (and
    ``countdown`` seconds later, if given; eager tasks run at once).

    By name, because services never import the tasks module: its tasks call services (and the scheduler),
    so importing it here would close a circle. Under ``CELERY_TASK_ALWAYS_EAGER`` (tests, the browser-test
    site) the task runs here and now, as ``delay`` would; ``send_task`` alone ignores that setting.

    Best effort, like the pushes: the write is committed whatever happens to the broker, so a broker that
    stays away past Celery's publish retries (``CELERY_TASK_PUBLISH_RETRY_POLICY``) is logged, never turned
    into a 500 for a request that succeeded. Every task enqueued here is also run by Celery beat
    (``replan_running_jobs`` every 5 s), which catches up once the broker is back.
    """
    task_name = f"marketplace.tasks.{name}"

    def send() -> None:
        if current_app.conf.task_always_eager:
            current_app.loader.import_default_modules()  # registers the discovered tasks, as a worker does
            current_app.tasks[task_name].delay(*args)
            return
        try:
            current_app.send_task(task_name, args=list(args), countdown=countdown)
        except Exception as err:  # noqa: BLE001 - kombu raises its own and the transport's errors
            log.warning("task %s%s not enqueued (%s: %s); Celery beat runs it again", task_name, args,
                        type(err).__name__, err)

    transaction.on_commit(send)


def running_activation(worker: Worker, job_id: int) -> Activation:
    """The worker's open activation in ``job_id``, which must be running: what an agent's rollout and
    broadcast reports are checked against."""
    return checked_running(selectors.active_activation(worker=worker, job_id=job_id), worker, job_id)


def checked_running(activation: Activation | None, worker: Worker, job_id: int) -> Activation:
    """``activation`` (the worker's open one in ``job_id``, as just read, with its job) when its job runs; else
    the :class:`ServiceError` that says why not."""
    if activation is None:
        status = Job.objects.filter(pk=job_id, activations__worker=worker).values_list("status", flat=True).first()
        if status is not None and status != Job.Status.RUNNING:  # a request that crossed the job's end: say so
            raise ServiceError(f"job_id: job {job_id} is {status}; this worker was released from it")
        raise ServiceError(f"job_id: this worker is not active in job {job_id}")
    if activation.job.status != Job.Status.RUNNING:
        raise ServiceError(f"job_id: job {job_id} is {activation.job.status}")
    return activation


def learner_may_report(job: Job) -> None:
    """The learner reports and publishes while the job runs or is paused (it trains what is queued), and
    when it comes back to a job it had stalled."""
    if job.status not in (Job.Status.RUNNING, Job.Status.PAUSED, Job.Status.STALLED):
        raise ServiceError(f"status: job is {job.status}")


CONFLICT_ATTEMPTS = 3


def retry_conflicts(fn):
    """Run the transaction ``fn`` (decorated with ``transaction.atomic`` beneath this) again, up to
    ``CONFLICT_ATTEMPTS`` times in all, when PostgreSQL aborts it for a deadlock or a serialization failure:
    two agents' reports that lock the same rows in opposite orders are both correct, and the one chosen as the
    victim has changed nothing. Inside an outer transaction it runs once: only the outermost may retry."""
    @wraps(fn)
    def run(*args, **kwargs):
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except OperationalError as err:
                conflict = type(err.__cause__).__name__ in ("DeadlockDetected", "SerializationFailure")
                if not conflict or connection.in_atomic_block or attempt == CONFLICT_ATTEMPTS:
                    raise
                log.info("%s: %s, attempt %d of %d; running it again", fn.__name__, type(err.__cause__).__name__,
                         attempt, CONFLICT_ATTEMPTS)
                time.sleep(0.05 * attempt * (1 + random.random()))  # apart, so the two do not meet again
        raise AssertionError("unreachable")

    return run
