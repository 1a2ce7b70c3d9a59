"""Database work a socket's request starts and does not wait for: the groups this process accepted, written every
few seconds, and a worker's earnings, read again every ``EARNINGS_EVERY_S``.

Each was awaited by whichever submit found it due. With 1,000 generating agents on two site processes (and two
cores for everything), a submit waited 0.2-0.4 s on average for the flush and about a second for its earnings
(half the submits found theirs due; a one-off probe of the lane, docs/fleet.md), and every request queued behind it
in its socket's lane waited as long. Neither is part of the request's answer: the flush is the site's own count,
and a submit's ``earned_usd`` is a figure for the agent's status line, as of the last read (at most about
``EARNINGS_EVERY_S`` plus a read old). Only a worker's first submit in this process waits for its read.
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.db import InterfaceError, OperationalError

from dataplane.replay import TRANSIENT

from .. import services
from ..infra import delivered
from .batches import GroupCommit
from .dbthreads import database

log = logging.getLogger(__name__)
INFRASTRUCTURE = (*TRANSIENT, OperationalError, InterfaceError)  # the stores away: logged without a traceback

EARNINGS = GroupCommit(lambda workers: database(services.workers_earned_usd)(workers, now=time.monotonic()))
"""The earnings of this process's workers that are due, read together (``services.workers_earned_usd``)."""
BEATS = GroupCommit(lambda beats: services.worker_heartbeats_record_async(beats))
"""The heartbeats of this process's sockets, recorded in Redis together: one round trip on one connection for all
that arrive while the last batch is written (one each held a connection of the pool for the loop's turn, and at
1,000 generating agents on two processes the pool ran out: heartbeats refused "the site cannot handle it")."""
_running: set[asyncio.Task] = set()  # held until done (a task only its loop holds may be collected)
_rereading: set[int] = set()  # workers whose earnings are being read again
_flushing: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}  # the flush running on each loop


async def earned_usd(worker_id: int) -> float:
    """What the worker has earned as this process last read it; read again in the background once it is due (the
    reads of the other workers due meanwhile with it). Awaited only for a worker not read yet."""
    now = time.monotonic()
    held = services.worker_earned_usd_held(worker_id, now=now)
    if held is not None:
        return held
    known = services.worker_earned_usd_known(worker_id)
    if known is None:
        return await EARNINGS.submit(worker_id)
    if worker_id not in _rereading:
        _rereading.add(worker_id)
        _start(_read_earnings(worker_id))
    return known


def flush_delivered() -> None:
    """Write the groups this process accepted (``infra.delivered``) in the background when a flush is due and none
    runs on this loop."""
    if not delivered.due():
        return
    loop = asyncio.get_running_loop()
    for other in [other for other in _flushing if other.is_closed()]:  # a test's loop, gone
        del _flushing[other]
    running = _flushing.get(loop)
    if running is None or running.done():
        _flushing[loop] = _start(_flush())


def _start(work) -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(work)
    _running.add(task)
    task.add_done_callback(_running.discard)
    return task


async def _read_earnings(worker_id: int) -> None:
    try:
        await EARNINGS.submit(worker_id)
    except Exception as err:  # noqa: BLE001 - nobody waits on it: the held figure stands, read again next submit
        log.warning("worker %s: earnings not read now (%s: %s)", worker_id, type(err).__name__, err,
                    exc_info=not isinstance(err, INFRASTRUCTURE))
    finally:
        _rereading.discard(worker_id)


async def _flush() -> None:
    """Not a verdict on any request: a failure keeps the counts for the next flush and is logged."""
    try:
        await database(services.groups_accepted_flush)()
    except Exception as err:  # noqa: BLE001 - the counts stay for the next flush (services.groups_accepted_flush)
        log.warning("groups accepted not written now (%s: %s); kept for the next flush", type(err).__name__, err,
                    exc_info=not isinstance(err, INFRASTRUCTURE))
