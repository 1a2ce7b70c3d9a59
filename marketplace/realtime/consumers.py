"""The agent websocket: authenticate the worker, parse each frame, call one service, reply.

Every frame the site cannot act on gets a ``rejected`` reply naming the reason; nothing it carried
is applied. Pushes from services (assign, release, snapshot) arrive as ``agent.message`` events.

Limits (docs/trust.md "Limits"): failed keys per client address, hellos per worker, a token bucket of
messages per connection (closed with 4429 after sustained abuse), frames up to ``ECHO2_WS_MAX_MESSAGE_BYTES``
(closed with 4413 beyond; the ``welcome`` announces the limit, and a bigger group comes as ``trajectories_part``
frames, joined per connection by ``marketplace/core/assembly.py``), JSON nested at most ``ECHO2_JSON_MAX_DEPTH``
levels. The reason always comes as a ``rejected`` frame first: daphne passes no close reason text on, and its
websocket library lets a server close only with 1000 or 3000-4999, so the codes are HTTP's in the application
range (as 4401), not 1008/1009.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from dataplane import messages as m
from dataplane.replay import TRANSIENT

from .. import services
from ..core.assembly import GroupAssembler
from ..infra import limits, refusals, verdicts
from ..infra.jsonlimits import JSONLimitError, check_json
from ..services import fanout
from . import agentkey, aside, frames, jobcache, lag
from .batches import GroupCommit
from .dbthreads import database
from .jobcache import FreshFor
from .lane import Lane, Newest

log = logging.getLogger(__name__)

UNAUTHORIZED = 4401
TOO_MANY_REQUESTS = 4429  # over the rate limits, sustained (the standard 1008 cannot be sent through daphne)
ROLLOUT_MESSAGES = (m.LeaseRequest, m.Trajectories, m.TrajectoriesPart, m.Submit)  # the hot path: no query
MESSAGE_TOO_BIG = 4413  # a frame over ECHO2_WS_MAX_MESSAGE_BYTES (the standard 1009 cannot be sent through daphne)
REMEMBERED_MESSAGES = (m.LeaseRequest, m.Trajectories, m.Submit)  # answered once per id (infra/verdicts.py)
# Failures of the site's own stores, not of the request: answered "send it again" (retry_after), never as a verdict.
INFRASTRUCTURE = (*TRANSIENT, OperationalError, InterfaceError)
UNAVAILABLE_RETRY_AFTER_S = 2.0  # the Redis client has already retried for ECHO2_REDIS_RETRY_S
REANNOUNCE_EVERY_S = 5.0  # a connection's budget is announced again at most this often (realtime/lag.py)
INSTALLS = GroupCommit(lambda reports: database(services.snapshots_installed)(reports))
"""The install reports of this process's sockets, written together (``realtime/batches.py``)."""
HELLO_WRITES = GroupCommit(lambda hellos: database(services.workers_connected)(hellos))
"""The hellos of this process's sockets (a fleet's reconnect), written together."""
LANE_CLOSE_S = 10.0  # a closed socket's requests still queued are handled for at most this long (daphne's close wait)


def _unavailable(ref: str, err: Exception) -> m.Rejected:
    return m.Rejected(reason=f"the site cannot handle it now ({type(err).__name__}); nothing of it was refused: "
                             "send it again", ref=ref, retry_after=UNAVAILABLE_RETRY_AFTER_S)


async def _job_at_work(job_id: int) -> services.JobAtWork | None:
    """Running job ``job_id`` and who is active in it, read on the sockets' database threads (``jobcache.JOBS``)."""
    return await database(services.job_at_work)(job_id=job_id)


class AgentConsumer(AsyncJsonWebsocketConsumer):
    worker = None
    lane: Lane | None = None  # made at connect
    beats: Newest | None = None  # the socket's heartbeats, beside the lane (made at connect)
    reports: Newest | None = None  # their database reports, beside both
    follower = None  # keeps the socket in its job's agents group (services.fanout)
    closed = False  # its websocket closed: nothing more is sent (send)

    async def connect(self) -> None:
        self.hello_at = None  # when this socket's session began: its close must not end a newer socket's
        self.lane = Lane(f"agent socket {self.channel_name}")  # its requests, in order; heartbeats pass it (lane.py)
        self.beats = Newest(f"agent heartbeats {self.channel_name}")
        self.reports = Newest(f"agent heartbeat reports {self.channel_name}")
        self.following = asyncio.Lock()  # the job group's joins and leaves, one at a time (_follow)
        self.bucket = limits.MessageBucket.from_settings()
        self.assembler = GroupAssembler()  # the group arriving in parts, if any: dropped with the socket
        self.frame_bytes = 0  # size of the frame being handled, which the assembly counts
        self.running = FreshFor(settings.ECHO2["AGENT_STATE_MAX_AGE_S"])  # the worker's running job, as last read
        self.welcomed: m.Welcome | None = None  # as sent: announced again with a lower budget when replies lag
        self.announced_share, self.reannounced_at = 1.0, -REANNOUNCE_EVERY_S
        await self.accept()
        client = (self.scope.get("client") or ["unknown"])[0]
        self.worker, wait = await database(agentkey.worker_by_key)(client, agentkey.bearer_key(self.scope))
        if wait:  # not "agent key" in the reason: an agent takes that as final, and this one is not
            await self._refuse(f"too many failed credentials from {client}; retry in {wait:.0f} s",
                               TOO_MANY_REQUESTS)
            return
        if self.worker is None:
            await self._refuse("unknown or missing agent key", UNAUTHORIZED)
            return
        await self.channel_layer.group_add(services.worker_group(self.worker.pk), self.channel_name)
        self.follower = fanout.JobFollower(self.channel_layer, self.channel_name, self.worker.pk)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # ended without its close too (cancelled by daphne): its lane's task must not outlive it
            if self.lane is not None:
                self.lane.cancel()
                self.beats.cancel()
                self.reports.cancel()

    async def dispatch(self, message) -> None:
        """Channels' dispatch without its ``aclose_old_connections()`` before every message: that call is a trip
        through the one database thread, so every heartbeat waited there behind every hello's and connect's queries
        (a reconnect storm held heartbeats for seconds). This consumer reaches the database only through
        ``dbthreads.database``, which closes stale connections around each call itself."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def send(self, text_data=None, bytes_data=None, close=False) -> None:
        """Nothing once the socket closed: its lane still handles what came before the close (a submit's groups are
        stored), but the replies have no one to reach; the agent sends the request again when it is back and gets
        the verdict kept for it. Sending on a closed websocket would raise in daphne and be logged as a failure."""
        if self.closed:
            return
        try:
            await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except Disconnected:  # closed by the peer before Channels told the consumer
            self.closed = True

    async def disconnect(self, code) -> None:
        self.closed = True
        left, *_ = await asyncio.gather(self.lane.close(LANE_CLOSE_S), self.beats.close(LANE_CLOSE_S),
                                        self.reports.close(LANE_CLOSE_S))
        if left:
            log.warning("agent %s: socket closed with %d request(s) not handled", getattr(self.worker, "pk", None),
                        left)
        self.assembler.drop()
        if self.worker is not None:
            await self.channel_layer.group_discard(services.worker_group(self.worker.pk), self.channel_name)
            if self.follower is not None:
                await self.follower.leave()
            # Queued in Redis, no query (services.worker_socket_closed): a thousand closes fit daphne's close timeout.
            await database(services.worker_socket_closed)(worker_id=self.worker.pk, since=self.hello_at)

    async def _refuse(self, reason: str, code: int, ref: str | None = None) -> None:
        await self.send_json(m.Rejected(reason=reason, ref=ref).model_dump())
        await self.close(code=code, reason=reason[:120])

    async def receive_json(self, content, **kwargs) -> None:
        if self.worker is None:
            return
        try:
            message = m.parse_agent_message(content)
        except m.MessageError as err:
            ref = content.get("type") if isinstance(content, dict) else None
            if ref == "trajectories_part":
                self.assembler.drop()  # the group can no longer arrive whole
            if ref in ("trajectories", "trajectories_part") and isinstance(content.get("group"), dict):
                group = content["group"]
                await database(services.trajectories_malformed)(
                    worker=self.worker, job_id=group.get("job_id"), records=group.get("records"))
            request_id = content.get("id") if isinstance(content, dict) else None
            request_id = request_id if isinstance(request_id, str) and 0 < len(request_id) <= 64 else None
            await self.send_json(m.Rejected(reason=str(err), ref=ref if isinstance(ref, str) else None,
                                            ref_id=request_id).model_dump())
            return
        await self._handle(message)

    async def _handle(self, message) -> None:
        """Call the message's service and send its replies, each naming the request's id."""
        if isinstance(message, m.Hello):
            wait = await sync_to_async(limits.HELLOS.take, thread_sensitive=False)(str(self.worker.pk))
            if wait:
                await self._refuse(f"too many hellos from worker {self.worker.pk}; retry in {wait:.0f} s",
                                   TOO_MANY_REQUESTS, ref="hello")
                return
        # Its verdict kept, and a resend answered from it, in the work's own Redis round trip (infra/verdicts.py)
        verdict_key = verdicts.key_for(self.worker.pk, message) \
            if isinstance(message, REMEMBERED_MESSAGES) and message.id is not None else None
        replies = await self._guarded(message, functools.partial(self._replies, message, verdict_key))
        if isinstance(message, m.Hello) and message.job_id is not None and not any(
                isinstance(reply, m.Assign) and reply.job_id == message.job_id for reply in replies):
            # it reconnected still serving a job it is no longer active in (released while it was away)
            replies.append(m.Release(job_id=message.job_id, reason="not active in this job any more"))
        request_id = getattr(message, "id", None)
        texts = []
        for reply in replies:
            if isinstance(reply, m.Welcome):  # the budget this connection enforces, so the agent keeps under it
                reply = self.welcomed = reply.model_copy(update=self.bucket.announced())
                self.announced_share = 1.0
            if request_id is not None and "ref_id" in type(reply).model_fields:
                reply = reply.model_copy(update={"ref_id": request_id})  # the agent pairs replies by id
            texts.append(reply.model_dump_json())  # pydantic's own encoder: no dict, no json.dumps
        for text in texts:
            await self.send(text_data=text)
        await self._follow(*(r.model_dump(mode="json") for r in replies if isinstance(r, m.Assign | m.Release)))
        if isinstance(message, ROLLOUT_MESSAGES):
            await self._shed_load()

    async def _guarded(self, message, work: Callable[[], Awaitable[list[m._Msg]]]) -> list[m._Msg]:
        """``work()``'s replies to ``message``, or the one reply that says why it failed."""
        try:
            return await work()
        except services.ServiceError as err:
            return [m.Rejected(reason=str(err), ref=message.type)]
        except INFRASTRUCTURE as err:  # not a verdict on the request: it is sent again, and then runs again
            log.warning("agent %s: %s not handled now (%s: %s)", self.worker.pk, message.type, type(err).__name__, err)
            return [_unavailable(message.type, err)]
        except Exception:  # a bug must not kill the agent's session; it gets a reason, we get the traceback
            log.exception("agent %s: %s failed", self.worker.pk, message.type)
            return [m.Rejected(reason="internal error while handling the message", ref=message.type)]

    async def _replies(self, message, verdict_key: str | None) -> list[m._Msg]:
        """The message's service, called."""
        if isinstance(message, ROLLOUT_MESSAGES):
            started = time.monotonic()
            try:
                replies = await self._rollout(message, verdict_key)
            except services.ServiceError:
                again = await self._answered_before(message, verdict_key) if verdict_key is not None else None
                if again is None:
                    raise
                replies = [again]
            lag.SHEDDING.replies.add(time.monotonic() - started)
            return replies
        if isinstance(message, m.Heartbeat):
            return await self._heartbeat(message)
        if isinstance(message, m.SnapshotInstalled):
            return await self._installed(message)
        if isinstance(message, m.SnapshotRequest) and not await self._base_out(message.job_id):
            return []  # what a fleet polls until the learner publishes: answered from the shared read, no query
        self.running.clear()  # a hello or a report may change the activation: read it again
        if isinstance(message, m.Hello):
            self.hello_at = timezone.now()
            return await HELLO_WRITES.submit(services.Hello(
                worker=self.worker, installed_version=message.installed_version, at=self.hello_at,
                hardware=message.hardware, allow_user_code=message.allow_user_code))
        return await database(self._dispatch)(message)

    async def _shed_load(self) -> None:
        """Announce the budget again, lowered while this process runs late (``realtime/lag.py``) or back up as it
        recovers: a change of a fifth or more, at most every ``REANNOUNCE_EVERY_S``. The bucket still enforces the
        full budget: agents pace below it, so the lower figure costs no refusal."""
        if self.welcomed is None:
            return
        share = lag.SHEDDING.share(loop_lag_s=settings.ECHO2["LOOP_LAG_S"], reply_lag_s=settings.ECHO2["REPLY_LAG_S"])
        now = time.monotonic()
        if abs(share - self.announced_share) < 0.2 * self.announced_share or now - self.reannounced_at < \
                REANNOUNCE_EVERY_S:
            return
        self.announced_share, self.reannounced_at = share, now
        full, burst = self.bucket.rate, self.bucket.burst
        rate = max(min(full, lag.MIN_MESSAGES_PER_S), full * share)
        lowered = self.welcomed.model_copy(update={"messages_per_s": rate,
                                                   "message_burst": max(1.0, burst * rate / full)})
        log.info("agent %s: replies lag %.1f s on average, the loop %.2f s; announcing %.0f%% of the message budget",
                 self.worker.pk, lag.SHEDDING.replies.average, lag.SHEDDING.loop_lag(), 100 * rate / full)
        await self.send_json(lowered.model_dump(mode="json"))

    async def _answered_before(self, message, verdict_key: str) -> m._Msg | None:
        """For a request refused before it reached Redis (the worker is not active in the job now): when an earlier
        sending of it ran, its groups may be stored, and the resend gets that verdict (else None: the refusal
        stands)."""
        return await sync_to_async(services.submitted_again, thread_sensitive=False)(
            worker=self.worker, message=message, verdict_key=verdict_key)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        if self.worker is None:
            return
        size = len(text_data or bytes_data or b"")
        if text_data is not None and not text_data.isascii():
            size = len(text_data.encode())
        limit = settings.ECHO2["WS_MAX_MESSAGE_BYTES"]
        self.frame_bytes = size
        if size > limit:
            await self._refuse(f"frame of {size} bytes exceeds the site's limit of {limit} bytes; split it",
                               MESSAGE_TOO_BIG)
            return
        wait = self.bucket.take(size)
        if wait:
            await self._over_budget(text_data, size, wait)
            return
        if text_data is None:
            await self.send_json(m.Rejected(reason="frames must be JSON text, not binary").model_dump())
            return
        if self.welcomed is not None and frames.frame_type(text_data) == "heartbeat":
            # never behind the socket's requests (lane.py), nor in the way of its next frames and pushes while its
            # Redis call runs (lane.Newest); before the hello is answered, after it: the database holds the worker
            # online only then
            self.beats.put(functools.partial(self._receive_text, text_data))
        else:
            self.lane.put(functools.partial(self._receive_in_turn, text_data, size))

    async def _receive_in_turn(self, text: str, size: int) -> None:
        await self.beats.done()  # a heartbeat sent before it is in Redis first
        if frames.frame_type(text) not in frames.GROUP_FRAMES:  # a group reads nothing a report writes
            await self.reports.done()  # and a request that reads or bills the worker comes after its report
        self.frame_bytes = size  # for the group assembly: the frame being handled now
        await self._receive_text(text)

    async def _receive_text(self, text_data: str) -> None:
        if frames.frame_type(text_data) in frames.GROUP_FRAMES:
            message = frames.parsed_group(text_data)
            if message is not None:
                await self._handle(message)
                return
        try:
            content = json.loads(text_data)
            check_json(content)
        except RecursionError:
            await self.send_json(m.Rejected(reason=f"frame is nested deeper than {settings.ECHO2['JSON_MAX_DEPTH']} "
                                                   "levels").model_dump())
            return
        except JSONLimitError as err:
            await self.send_json(m.Rejected(reason=f"frame: {err}").model_dump())
            return
        except ValueError:
            await self.send_json(m.Rejected(reason="frame is not valid JSON").model_dump())
            return
        await self.receive_json(content)

    async def _over_budget(self, text: str | None, size: int, wait: float) -> None:
        """A frame over the connection's budget: refused unread, named by its type and request id (read from the
        frame's head), with when to send it again; counted per worker. After sustained abuse, the socket closes."""
        bucket = self.bucket
        reason = (f"rate limit: at most {bucket.rate:g} messages per second (bursts of {bucket.burst:g})"
                  + (f" and {bucket.bytes_per_s:.0f} bytes per second" if bucket.bytes_per_s else "")
                  + f"; this {size}-byte frame was not read: send it again in {wait:.2f} s")
        await sync_to_async(refusals.count, thread_sensitive=False)(self.worker.pk)
        if bucket.abusive:
            await self._refuse(reason + "; closing after sustained abuse", TOO_MANY_REQUESTS)
            return
        await self.send_json(m.Rejected(reason=reason, ref=frames.frame_type(text), ref_id=frames.frame_id(text),
                                        retry_after=round(wait + 0.005, 3)).model_dump())

    async def _rollout(self, message: m.LeaseRequest | m.Trajectories | m.TrajectoriesPart | m.Submit,
                       verdict_key: str | None = None) -> list[m._Msg]:
        """A lease or a group, checked against the running job this socket read (``marketplace.realtime.jobcache``):
        read from the database when it is not held, then the work is one Redis round trip (its verdict kept under
        ``verdict_key`` in it) on the event loop's own client (``services.rollout_async``: no thread hop, and the
        sockets' rollouts never queue behind one another's queries or threads)."""
        job_id = message.job_id if isinstance(message, m.LeaseRequest | m.Submit) else message.group.job_id
        running = self.running.get(job_id)
        if running is not None:  # the process's next read of the job starts once the newest is half its age
            jobcache.JOBS.refresh(job_id, functools.partial(_job_at_work, job_id), max_age_s=self.running.max_age_s)
        else:
            read_at, running = await self._read_running(job_id)
            if running is None:  # not active in it, or it does not run: read for this worker, which says why
                try:
                    running = await database(services.running_job)(worker=self.worker, job_id=job_id)
                except services.ServiceError:
                    if isinstance(message, m.TrajectoriesPart):
                        self.assembler.drop()  # the group can no longer arrive whole
                    raise
            self.running.put(job_id, running, read_at=read_at)
        # its answer says what the worker earned, as last read (read again aside when due: realtime/aside.py)
        earned = await aside.earned_usd(self.worker.pk) if isinstance(message, m.Submit) else None
        if isinstance(message, m.TrajectoriesPart):  # rare (a group too big for one frame): the sync path, on a thread
            replies = await sync_to_async(services.trajectories_part_submit, thread_sensitive=False)(
                worker=self.worker, assembler=self.assembler, part=message, frame_bytes=self.frame_bytes,
                running=running)
        else:
            replies = [await services.rollout_async(worker=self.worker, message=message, running=running,
                                                    earned_usd=earned, verdict_key=verdict_key)]
        aside.flush_delivered()  # the groups this process accepted, into the database every few seconds
        return replies

    async def _read_running(self, job_id: int) -> tuple[float, services.RunningJob | None]:
        """(when the read began, the worker's running job ``job_id`` or None): :meth:`_read_job`, for this worker."""
        read_at, view = await self._read_job(job_id)
        return read_at, view.for_worker(self.worker.pk) if view is not None else None

    async def _read_job(self, job_id: int) -> tuple[float, services.JobAtWork | None]:
        """(when the read began, running job ``job_id`` and who is active in it, or None), from the process's shared
        read (``jobcache.JOBS``: held, or in flight) when one began since this socket last forgot, else read now and
        shared."""
        max_age = self.running.max_age_s
        if max_age <= 0:  # read always: nothing to share, and the worker's own read is one query
            return time.monotonic(), None
        return await jobcache.JOBS.read(
            job_id, functools.partial(_job_at_work, job_id),
            not_before=self.running.cleared_at, max_age_s=max_age)

    async def _base_out(self, job_id: int) -> bool:
        """False when the process's shared read shows this worker active in the job and its base unpublished."""
        _, view = await self._read_job(job_id)
        return view is None or self.worker.pk not in view.active or view.base_published

    async def _installed(self, message: m.SnapshotInstalled) -> list[m._Msg]:
        """An install report, checked against the process's shared read of the job (every worker reports every
        version it installs, so at each publication the whole fleet does, at once): its activation and the job's
        are read only when that read does not show the worker active. Written with the reports of the process's
        other sockets that arrive meanwhile (:data:`INSTALLS`), its refusal (a version never published) its own."""
        received = time.time()
        _, view = await self._read_job(message.job_id)
        await INSTALLS.submit(services.InstallReport(
            worker=self.worker, job_id=message.job_id, version=message.version, seconds=message.seconds,
            source=message.source, at_work=view, at=received))
        return []

    async def _heartbeat(self, message: m.Heartbeat) -> list[m._Msg]:
        """Recorded in Redis on the event loop with the other sockets' heartbeats that arrive meanwhile
        (``aside.BEATS``: no thread, so heartbeats never queue behind other sockets' queries or threads), as of when
        it was handed over; the database hears of it only when something changes now. The installed version it
        carries is not recorded: only hello and install reports set it."""
        fields = {"throughput": message.throughput, "state": message.state, "job_id": message.job_id}
        beat = await aside.BEATS.submit({"worker_id": self.worker.pk, "at": time.time(), **fields})
        if beat.to_database:
            self.running.clear()  # it may change the activation: read it again
            # on a task of its own: the next heartbeat's Redis write never waits for the database (a report waits
            # for the socket's database threads, seconds when they are busy); a newer report replaces one waiting
            self.reports.put(functools.partial(self._heartbeat_report, message, beat, fields))
        aside.flush_delivered()  # groups accepted before the rollouts stopped still reach the database
        return []

    async def _heartbeat_report(self, message: m.Heartbeat, beat, fields: dict) -> None:
        """What a heartbeat tells the database (a state change, the periodic report, a worker back online). A request
        sent after the heartbeat, a group excepted, waits for it (:meth:`_receive_in_turn`), so it is handled after the
        report is in. Only the newest report waiting is made: each carries the worker's state as it is now."""
        async def report() -> list[m._Msg]:
            await database(services.worker_heartbeat_apply)(worker=self.worker, beat=beat, reason=message.reason,
                                                            refused=message.refused, **fields)
            return []

        for reply in await self._guarded(message, report):
            await self.send(text_data=reply.model_dump_json())

    def _dispatch(self, message) -> list[m._Msg]:
        worker = self.worker
        match message:
            case m.LeaseReturn():
                services.lease_return(worker=worker, job_id=message.job_id, lease_id=message.lease_id,
                                      reason=message.reason)
                return []
            case m.SnapshotInstalled():
                services.snapshot_installed(worker=worker, job_id=message.job_id, version=message.version,
                                            seconds=message.seconds, source=message.source)
                return []
            case m.SnapshotRequest():
                return services.snapshot_request(worker=worker, job_id=message.job_id, which=message.which)
            case m.RelayFailed():
                services.relay_failed(worker=worker, job_id=message.job_id, version=message.version,
                                      culprit_worker_id=message.culprit_worker_id, reason=message.reason)
                return []
        raise services.ServiceError(f"type: {message.type} is not handled")

    async def agent_message(self, event) -> None:
        """A push from services: sent at once once the hello was answered; before, in turn with the socket's requests
        (``lane.py``), so the welcome goes out before the assignment the hello's activation pushed."""
        await self._in_turn_until_welcomed(functools.partial(self._pushed, event))

    async def _in_turn_until_welcomed(self, work: Callable[[], Awaitable[None]]) -> None:
        if self.welcomed is None:
            self.lane.put(work)
        else:  # never behind the socket's requests: a push is the site's news, and the requests may wait long
            await work()

    async def _pushed(self, event) -> None:
        """Every push (assign, release, snapshot) may change the running job this socket holds, so it is read again
        at the next lease or group (a request being handled keeps the one it read)."""
        self.running.clear()
        await self.send_json(event["message"])
        await self._follow(event["message"])

    async def _follow(self, *sent: dict) -> None:
        """Join the agents group of the job an ``assign`` just sent names, leave it on a ``release``
        (``services.fanout.JobFollower``); a snapshot published while the assignment travelled is sent now. One at a
        time: a hello's replies (in the lane) and a push (beside it) must not interleave their joins and leaves."""
        async with self.following:
            for message in sent:
                text = await self.follower.follow(message) if self.follower is not None else None
                if text is not None:
                    await self.send(text_data=text)

    async def agent_snapshot(self, event) -> None:
        """A snapshot of a job was published (one event per job, ``services.fanout``): :meth:`_snapshot`, as a push
        (:meth:`agent_message`)."""
        await self._in_turn_until_welcomed(functools.partial(self._snapshot, event))

    async def _snapshot(self, event) -> None:
        """This socket builds its worker's own message for the published snapshot (route, credential, its child's
        fingerprint) and sends it, if the worker is still assigned to that job and was in the plan."""
        if self.follower is None or not self.follower.wants(event):
            return
        self.running.clear()  # the running job this socket holds names the published version: read it again
        async with self.following:
            await self.follower.stay()
        text = await fanout.snapshot_text(self.worker.pk, event)
        if text is not None:
            await self.send(text_data=text)
