"""The agent's control session: one websocket to the site, reconnecting with backoff.

Three coroutines share it: a reader that dispatches site messages, a heartbeat, and the rollout loop of the
current assignment (lease groups, generate, return records). Snapshots are fetched in the background and
installed under a lock the rollout loop holds while generating: no batch is generated under a partly installed
snapshot, and its records carry the version really used.

The engine belongs to one job (:class:`~worker_agent.installs.JobEngine`), built from the job's base snapshot
and never serving another job (installs: :mod:`worker_agent.installs`). The rollout loop leases nothing until
the job's base is installed, nor while a version it was told about (when it joined) or failed to install is
missing; meanwhile it asks the site for the snapshot it needs (``snapshot_request``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import websockets

from dataplane import messages as m
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.ratelimit import bucket
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.snapshot import parse_manifest
from dataplane.tasks import build_task

from . import __version__, status, submit
from .cache import BaseCache
from .config import AgentConfig
from .engines.base import Engine, SamplingParams
from .installs import JobEngine, SnapshotInstalls
from .rollout import GroupLease, rollout_groups
from .state import Facts, crash_reason, derive_state, heartbeat_due

log = logging.getLogger("echo2.agent")

REPLY_TIMEOUT_S = 30.0
MAX_IN_FLIGHT = 8  # groups of a batch sent before their replies come back (at most ``groups_per_lease``)
HEARTBEAT_POLL_S = 0.2  # how often the heartbeat loop looks for a state change to report


def _log_crash(task: asyncio.Task) -> None:
    """A background task of the session that ended by an error says so (it is not restarted: a bug)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r", task.get_name(), task.exception(), exc_info=task.exception())


class AgentRejected(RuntimeError):
    """The site refused this agent (unknown key): retrying cannot help."""


def websocket_url(server: str) -> str:
    parts = urlsplit(server)
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/ws/agent/", "", ""))


class ThroughputMeter:
    """mu_i: trajectories per second over a sliding window."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.events: collections.deque[tuple[float, int]] = collections.deque()
        self.started = time.monotonic()

    def add(self, count: int) -> None:
        self.events.append((time.monotonic(), count))

    def rate(self) -> float | None:
        now = time.monotonic()
        while self.events and now - self.events[0][0] > self.window_s:
            self.events.popleft()
        if not self.events:
            return None
        span = min(self.window_s, now - self.started)
        return sum(c for _, c in self.events) / max(span, 1e-6)


def reconnect_delays(*, first: float = 1.0, cap: float = 30.0) -> Iterator[float]:
    """Waits before each reconnection attempt: a random quarter to half of the time spent away so far (at least
    ``first``), at most ``cap``. Proportional waits bring the agent back within half the outage again after the
    site returns (doubling waits: up to as long again), and the randomness spreads a fleet that lost the site
    together instead of bringing it back in step."""
    away = 0.0
    while True:
        wait = min(cap, random.uniform(0.25, 0.5) * max(first, away))
        away += wait
        yield wait


class AgentSession(SnapshotInstalls):
    def __init__(self, config: AgentConfig, *, engine_factory: Callable[[str], Engine], cache: BaseCache,
                 groups_per_lease: int = 2, max_reconnect_delay: float = 30.0, relay_listen: str | None = None,
                 retry_delay: float = 2.0, status_every: float = 30.0) -> None:
        """``engine_factory`` builds an engine from a checkpoint directory (the job's base, unpacked in ``cache``);
        ``retry_delay``: first wait before asking the site again for a snapshot the agent lacks (doubling, <= 30 s);
        ``status_every``: seconds between two summaries of what the agent does (:mod:`worker_agent.status`)."""
        self.config = config
        self.engine_factory = engine_factory
        self.cache = cache
        self.groups_per_lease = groups_per_lease
        self.max_reconnect_delay = max_reconnect_delay
        self.retry_delay = retry_delay
        self.job: JobEngine | None = None
        self.wanted: dict[int, int] = {}
        self.installing: dict[tuple[int, int], asyncio.Task] = {}
        self.install_lock = asyncio.Lock()
        self.meter = ThroughputMeter()
        self.heartbeat_interval = 5.0
        self.max_message_bytes = submit.DEFAULT_MAX_MESSAGE_BYTES  # the site's frame limit, once its welcome says
        self.assignment: m.Assign | None = None
        self.rollout_task: asyncio.Task | None = None
        self.waiting: dict[str, asyncio.Future] = {}  # request id -> its reply, once the site answers
        self.request_lock = asyncio.Lock()  # held while one request's frames go out
        self.in_flight = max(1, min(groups_per_lease, MAX_IN_FLIGHT))  # groups sent before waiting for replies
        self._request_ids = itertools.count(1)
        self.rollout_failures = 0  # crashes of the rollout loop, each restarted
        self.rollout_failure: str | None = None  # the last crash, until the restarted loop works again
        self.producing = False  # the rollout loop is generating (leases held), not waiting for work or a version
        self.last_beat: tuple[str, float] | None = None  # the last heartbeat: state, monotonic time
        self.ws = None
        self.stopped = asyncio.Event()
        self.generated = 0
        self.relay_listen = relay_listen
        self.hub: RelayHub | None = None
        self.relays: dict[tuple[int, int], SnapshotRelay] = {}  # (job, version) -> relay being received/served
        self.relay_parents: dict[tuple[int, int], int | None] = {}
        self.reported_failures: set[tuple[int, int, str]] = set()
        self.status_every = status_every
        self.tally = status.Tally()  # what the site accepted, for the status lines' rates
        self.released: str | None = None  # why the site last released this worker, until the next assignment
        self.no_work = False  # the site's last answer to a lease request was "no work"

    # ---- connection ----------------------------------------------------------------------

    async def run_forever(self) -> None:
        url = websocket_url(self.config.server)
        await self._start_hub()
        reporter = asyncio.create_task(status.report(self, every=self.status_every), name="the status reporter")
        reporter.add_done_callback(_log_crash)
        try:
            await self._connect_forever(url)
        finally:
            reporter.cancel()

    async def _connect_forever(self, url: str) -> None:
        delays = reconnect_delays(cap=self.max_reconnect_delay)
        while not self.stopped.is_set():
            connected = False
            try:
                async with websockets.connect(url, additional_headers={"Authorization":
                                                                       f"Bearer {self.config.agent_key}"},
                                              open_timeout=15, ping_interval=20, ping_timeout=20,
                                              max_size=64 * 2**20) as ws:
                    log.info("connected to %s as worker %s", url, self.config.worker_id)
                    connected, delays = True, reconnect_delays(cap=self.max_reconnect_delay)
                    await self._session(ws)
                why = "the site closed the connection"
            except AgentRejected:
                raise
            except (OSError, TimeoutError, websockets.WebSocketException) as err:
                reason = err or type(err).__name__
                why = f"connection to {url} lost ({reason})" if connected else f"cannot reach {url} ({reason})"
            if self.stopped.is_set():
                break
            delay = next(delays)
            log.warning("%s; reconnecting in %.1f s", why, delay)
            await asyncio.sleep(delay)

    async def _session(self, ws) -> None:
        self.ws = ws
        self._forget_requests()
        job = self.assignment.job_id if self.assignment else None
        await self.send(m.Hello(agent_version=__version__, installed_version=self.installed_version(job)))
        heartbeat = asyncio.create_task(self._heartbeats())
        try:
            async for frame in ws:
                await self._dispatch(frame)
        finally:
            heartbeat.cancel()
            self._stop_rollout()
            self.ws = None

    async def send(self, message: m._Msg) -> None:
        if self.ws is None:
            raise ConnectionError("not connected")
        await self.ws.send(message.model_dump_json())

    def state(self) -> m.WorkerState:
        """What the agent is doing now (:func:`worker_agent.state.derive_state`), as the site bills it."""
        job = self.assignment.job_id if self.assignment else None
        built = self.engine_for(job) is not None
        ours = [version for key_job, version in self.installing if key_job == job]
        return derive_state(Facts(assigned=job is not None, failure=self.rollout_failure, producing=self.producing,
                                  loading=bool(ours) and (not built or 0 in ours),
                                  installing=built and any(version > 0 for version in ours)))

    async def _heartbeats(self) -> None:
        """Every ``heartbeat_interval``, and at once (at most once a second) when the state changes."""
        self.last_beat = None  # a new socket: the first at once
        while True:
            await self.report_state()
            await asyncio.sleep(HEARTBEAT_POLL_S)

    async def report_state(self) -> None:
        """A heartbeat if due (``state.heartbeat_due``); also called on a lease: "generating" precedes its groups."""
        state, now = self.state(), time.monotonic()
        last_state, last_sent = self.last_beat or (None, None)
        if self.ws is None or not heartbeat_due(state=state, last_state=last_state, last_sent=last_sent, now=now,
                                                interval=self.heartbeat_interval):
            return
        self.last_beat = (state, now)  # before the send: a concurrent caller sees it as sent
        job = self.assignment.job_id if self.assignment else None
        await self.send(m.Heartbeat(throughput=self.meter.rate(), job_id=job, state=state,
                                    reason=(self.rollout_failure or "") if state == "failed" else "",
                                    installed_version=self.installed_version(job)))

    # ---- dispatch -------------------------------------------------------------------------

    async def _dispatch(self, frame) -> None:
        try:
            message = m.parse_site_message(json.loads(frame))
        except (ValueError, m.MessageError) as err:
            log.error("ignoring a frame from the site that is not a valid message: %s", err)
            return
        match message:
            case m.Welcome():
                self.heartbeat_interval = message.heartbeat_interval
                self.max_message_bytes = message.max_message_bytes or submit.DEFAULT_MAX_MESSAGE_BYTES
            case m.Assign():
                log.info("assigned to job %s (%s, task %s)", message.job_id, message.model, message.task.get("name"))
                self._stop_rollout()
                self.assignment, self.released = message, None
                self.rollout_task = asyncio.create_task(self._supervised(message))
            case m.Release():
                log.info("released from job %s: %s", message.job_id, message.reason)
                if self.assignment and self.assignment.job_id == message.job_id:
                    self._stop_rollout()
                    self.assignment, self.released = None, f"released from job {message.job_id}: {message.reason}"
            case m.SnapshotAvailable():
                self._install(message)
            case m.Rejected() if message.ref is None and "agent key" in message.reason:
                raise AgentRejected(message.reason)
            case m.Lease() | m.NoWork() | m.Accepted() | m.Rejected() if message.ref_id is not None:
                self._answer(message)
            case m.Rejected():
                log.warning("site rejected our %s: %s", message.ref, message.reason)
            case _:
                log.warning("discarding a %s that answers no request of ours", message.type)

    def _stop_rollout(self) -> None:
        if self.rollout_task is not None:
            self.rollout_task.cancel()
            self.rollout_task = None
        self.producing, self.rollout_failure, self.no_work = False, None, False

    async def _request(self, message: m.LeaseRequest | m.Trajectories) -> m._Msg:
        """Send a request under a fresh id and return the reply that names it (``REPLY_TIMEOUT_S`` at most:
        TimeoutError). A reply that comes later, or to a request of a rollout loop cancelled meanwhile (a
        release, a job switch), names an id no longer waited for and is discarded, never taken as the answer
        to a newer request. A group too big for the site's frame limit goes in parts (``submit.frames``; a
        record too big for any frame: :class:`submit.RecordTooBig`), all under the one id its one reply names;
        a reply that comes before the last part (a part refused) stops the sending."""
        request_id = f"r{next(self._request_ids)}"
        texts = submit.frames(message.model_copy(update={"id": request_id}), limit=self.max_message_bytes)
        future = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        try:
            async with self.request_lock:  # the parts of two groups in flight never interleave
                for text in texts:
                    if future.done():
                        break
                    if self.ws is None:
                        raise ConnectionError("not connected")
                    await self.ws.send(text)
            return await asyncio.wait_for(future, REPLY_TIMEOUT_S)
        finally:
            self.waiting.pop(request_id, None)

    def _answer(self, reply: m.Lease | m.NoWork | m.Accepted | m.Rejected) -> None:
        future = self.waiting.get(reply.ref_id)
        if future is None or future.done():
            log.warning("discarding a late %s for request %s (no longer waited for)", reply.type, reply.ref_id)
            return
        future.set_result(reply)

    def _forget_requests(self) -> None:
        """A new socket: the site will never answer what was asked on the old one."""
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the connection was lost before the site answered"))
        self.waiting.clear()

    # ---- snapshots: the relay side (the installs themselves: worker_agent/installs.py) -------

    async def _receive_relayed(self, snap: m.SnapshotAvailable, chunks: dict[int, bytes] | None = None) -> tuple:
        """Pull the version from the chain parent (forwarding to our child as chunks arrive); the relay
        fetches what its parent cannot give from the learner's HTTP server. ``chunks`` already held (a cached
        base) make this relay an origin. Returns (manifest, the verified chunks in order, source)."""
        manifest = parse_manifest(snap.manifest)
        await self._start_hub()
        bw = self.config.bandwidth_bps
        relay = SnapshotRelay(manifest, worker_id=self.config.worker_id, fallback_url=snap.url, chunks=chunks,
                              uplink=bucket(bw), downlink=bucket(bw), on_event=self._relay_event,
                              credential=snap.credential)  # shown to the parent, the hub and the HTTP fallback
        key = (snap.job_id, snap.version)
        self.relays[key] = relay
        if self.hub is not None:
            self.hub.register(relay)
        self._reroute(relay, snap)
        ordered = await relay.receive_chunks()
        stats = relay.stats
        source = "parent" if stats.from_parent and stats.from_parent >= stats.from_fallback else "fallback"
        log.info("snapshot v%d of job %d: %d chunks from parent, %d from fallback", snap.version, snap.job_id,
                 stats.from_parent, stats.from_fallback)
        return manifest, ordered, source

    async def _start_hub(self) -> None:
        if self.hub is None and self.relay_listen:
            host, _, port = self.relay_listen.rpartition(":")
            hub = RelayHub()
            await hub.start(host, int(port))
            self.hub = hub
            log.info("relay listening on %s", self.relay_listen)

    def _reroute(self, relay: SnapshotRelay, snap: m.SnapshotAvailable) -> None:
        key = (snap.job_id, snap.version)
        self.relay_parents[key] = snap.parent_worker_id
        # Our relay serves a child only with the credential the site gave it (its sha256 comes with the child).
        relay.assign_children({c: snap.child_credential_sha256.get(c) for c in snap.children})
        if snap.parent and not relay.complete:
            host, _, port = snap.parent.rpartition(":")
            relay.set_parent(host, int(port), credential=snap.credential)
            log.info("snapshot v%d of job %d: pulling from %s (%s), serving %s", snap.version, snap.job_id,
                     snap.parent, f"worker {snap.parent_worker_id}" if snap.parent_worker_id else "learner",
                     snap.children or "no child")

    def _relay_event(self, event: dict) -> None:
        if event["event"] != "parent_failed":
            return
        key = (event["job_id"], event["version"])
        marker = (*key, event.get("parent", ""))
        if marker in self.reported_failures or self.ws is None:
            return
        self.reported_failures.add(marker)
        message = m.RelayFailed(job_id=key[0], version=key[1], culprit_worker_id=self.relay_parents.get(key),
                                reason=str(event.get("reason", ""))[:500])

        async def report() -> None:
            with contextlib.suppress(ConnectionError, websockets.WebSocketException):
                await self.send(message)

        asyncio.get_running_loop().create_task(report())

    def _retire_relays(self, job_id: int, *, keep_from: int) -> None:
        """Stop serving versions older than ``keep_from`` (our child has had time to take the newer one)."""
        for key in [k for k in self.relays if k[0] == job_id and k[1] < keep_from]:
            self._drop_relay(key)

    def _drop_relay(self, key: tuple[int, int]) -> None:
        self.relays.pop(key, None)
        self.relay_parents.pop(key, None)
        if self.hub is not None:
            self.hub.unregister(*key)

    # ---- rollouts --------------------------------------------------------------------------

    async def _supervised(self, assign: m.Assign) -> None:
        """Run the job's rollout loop; when it crashes (a reply that never came, an engine error, a bug) the
        cause is logged, counted and reported (state ``failed`` with the reason, billed nothing) and the loop
        starts again after a back-off (1 s doubling to 30 s while it keeps failing), so the agent never goes
        on heartbeating as if it generated. The state stays ``failed`` until the restarted loop works again
        (an accepted group, or the site saying it has no work); failing too long, the site releases it."""
        delay = 1.0
        while True:
            try:
                await self._rollout(assign)
                return
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - whatever killed it, the loop must come back
                self.rollout_failures += 1
                delay = delay if self.rollout_failure is not None else 1.0  # it had recovered: back-off anew
                self.producing, self.rollout_failure = False, crash_reason(err)
                log.error("job %s: the rollout loop failed (%s); restarting it in %.0f s", assign.job_id,
                          self.rollout_failure, delay, exc_info=not isinstance(err, TimeoutError | ConnectionError))
                await asyncio.sleep(delay)
                delay = min(2 * delay, 30.0)

    async def _rollout(self, assign: m.Assign) -> None:
        await self._join(assign)
        task = build_task(assign.task)
        params = SamplingParams(max_new_tokens=assign.max_new_tokens, temperature=assign.temperature,
                                top_p=assign.top_p)
        while True:
            self.producing = self.producing and self.ready(assign.job_id)  # waiting for a version is idle
            await self._until_ready(assign.job_id)
            reply = await self._request(m.LeaseRequest(job_id=assign.job_id, groups=self.groups_per_lease))
            self.producing = isinstance(reply, m.Lease)
            await self.report_state()
            self.no_work = isinstance(reply, m.NoWork)
            if isinstance(reply, m.NoWork):
                self.rollout_failure = None  # the loop works: there is just nothing to do
                await asyncio.sleep(reply.retry_after)
                continue
            if isinstance(reply, m.Rejected):
                log.warning("lease refused: %s", reply.reason)
                await asyncio.sleep(1.0)
                continue
            if not isinstance(reply, m.Lease):
                log.warning("unexpected %s while waiting for a lease", reply.type)
                continue
            async with self.install_lock:  # no snapshot is installed while we generate
                job = self.engine_for(assign.job_id)
                if job is None or not self.ready(assign.job_id):
                    self.producing = False
                    continue  # an install failed meanwhile: the leases expire and are leased again
                leases = [GroupLease(x.lease_id, x.group_id, x.prompt) for x in reply.leases]
                groups = await asyncio.to_thread(rollout_groups, job.engine, task, leases, job_id=assign.job_id,
                                                 n=assign.group_size, params=params, version=job.version)
            await self._return_groups(groups)

    async def _return_groups(self, groups: list) -> None:
        """Send a batch's groups without waiting for each reply: at most ``in_flight`` unanswered at once (the
        site answers each by its request id), so a round trip per group no longer paces the agent. Returns once
        every group is answered; a reply that never comes fails the batch (``REPLY_TIMEOUT_S``), as it did."""
        slots = asyncio.Semaphore(self.in_flight)

        async def one(group) -> None:
            async with slots:
                await self._return_group(group)

        sends = [asyncio.create_task(one(group)) for group in groups]
        try:
            await asyncio.gather(*sends)  # the first failure, as itself (not wrapped), for the supervisor's report
        finally:
            for send in sends:  # a failure stops the others' waits; a cancelled loop cancels them all
                send.cancel()

    async def _return_group(self, group) -> None:
        """Send a generated group and count what the site accepted. A group that cannot reach the site (a record
        too big for any frame) is not resent: its lease is handed back, so the prompt goes to the next worker."""
        try:
            answer = await self._request(m.Trajectories(group=group))
        except submit.RecordTooBig as err:
            log.error("job %d: the group of lease %s cannot be sent (%s); handing the lease back", group.job_id,
                      group.lease_id, err)
            await self.send(m.LeaseReturn(job_id=group.job_id, lease_id=group.lease_id, reason=str(err)[:500]))
            return
        if isinstance(answer, m.Accepted) and answer.accepted:
            self.meter.add(answer.accepted)
            self.tally.add(trajectories=answer.accepted, tokens=sum(len(r.completion_ids) for r in group.records))
            self.generated += answer.accepted
            self.rollout_failure = None  # the restarted loop delivers again
        else:
            log.warning("group %s refused: %s", group.lease_id,
                        "; ".join(getattr(answer, "reasons", []) or [getattr(answer, "reason", "")]))

    async def _join(self, assign: m.Assign) -> None:
        """Start serving ``assign``'s job: another job's engine (or one of another base) is dropped, never reused;
        the job's base is installed when the assignment names it, and the newest version it names is to be
        reached before generating (asked for afresh once the base is in: it may be gone by then)."""
        job = self.engine_for(assign.job_id)
        if self.job is not None and (job is None or assign.base_digest not in (None, job.base_digest)):
            log.info("job %d: dropping the engine of job %d; this job starts from its own base", assign.job_id,
                     self.job.job_id)
            async with self.install_lock:
                self.job = None
        for key, task in list(self.installing.items()):
            if key[0] != assign.job_id:
                task.cancel()
        for key in [k for k in self.relays if k[0] != assign.job_id]:
            self._drop_relay(key)
        if assign.snapshot:
            self.wanted[assign.job_id] = max(self.wanted.get(assign.job_id, 0), int(assign.snapshot["version"]))
        if assign.base and self.engine_for(assign.job_id) is None:
            self._install(m.SnapshotAvailable.model_validate(assign.base))

    async def _until_ready(self, job_id: int) -> None:
        """Wait until :meth:`ready`; meanwhile, when nothing is being installed for the job, ask the site for
        the snapshot missing (the base, else the newest), again after a doubling delay."""
        delay, asked_at = self.retry_delay, None
        while not self.ready(job_id):
            idle = not any(key[0] == job_id for key in self.installing)
            if idle and (asked_at is None or time.monotonic() - asked_at >= delay):
                which = "newest" if self.engine_for(job_id) else "base"
                log.info("job %d: asking the site for its %s snapshot", job_id, which)
                await self.send(m.SnapshotRequest(job_id=job_id, which=which))
                delay = delay if asked_at is None else min(delay * 2, 30.0)
                asked_at = time.monotonic()
            await asyncio.sleep(0.1)
