"""The agent's control session: one websocket to the site, reconnecting with backoff.

Three coroutines share it: a reader that dispatches site messages, a heartbeat, and the rollout loop
of the current assignment (lease prompt groups, generate, return records). Snapshots are fetched in
the background and installed under a lock the rollout loop also holds while generating, so a batch
is never generated under a partially installed snapshot and its records carry the version really used.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import websockets
from safetensors.torch import load

from dataplane import messages as m
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.ratelimit import bucket
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.snapshot import fetch_payload, parse_manifest
from dataplane.tasks import build_task

from . import __version__
from .config import AgentConfig
from .engines.base import Engine, SamplingParams
from .rollout import GroupLease, rollout_groups

log = logging.getLogger("echo2.agent")

REPLY_TIMEOUT_S = 30.0


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


class AgentSession:
    def __init__(self, config: AgentConfig, *, engine_factory: Callable[[str], Engine], groups_per_lease: int = 2,
                 max_reconnect_delay: float = 30.0, relay_listen: str | None = None) -> None:
        self.config = config
        self.engine_factory = engine_factory
        self.groups_per_lease = groups_per_lease
        self.max_reconnect_delay = max_reconnect_delay
        self.engines: dict[str, Engine] = {}
        self.installed: dict[int, int] = {}  # job id -> installed snapshot version (0 = base model)
        self.install_lock = asyncio.Lock()
        self.meter = ThroughputMeter()
        self.heartbeat_interval = 5.0
        self.assignment: m.Assign | None = None
        self.rollout_task: asyncio.Task | None = None
        self.replies: asyncio.Queue = asyncio.Queue()
        self.ws = None
        self.stopped = asyncio.Event()
        self.generated = 0
        self.relay_listen = relay_listen
        self.hub: RelayHub | None = None
        self.relays: dict[tuple[int, int], SnapshotRelay] = {}  # (job, version) -> relay being received/served
        self.relay_parents: dict[tuple[int, int], int | None] = {}
        self.reported_failures: set[tuple[int, int, str]] = set()

    # ---- connection ----------------------------------------------------------------------

    async def run_forever(self) -> None:
        delay = 1.0
        url = websocket_url(self.config.server)
        await self._start_hub()
        while not self.stopped.is_set():
            try:
                async with websockets.connect(url, additional_headers={"Authorization":
                                                                       f"Bearer {self.config.agent_key}"},
                                              open_timeout=15, ping_interval=20, ping_timeout=20,
                                              max_size=64 * 2**20) as ws:
                    log.info("connected to %s as worker %s", url, self.config.worker_id)
                    delay = 1.0
                    await self._session(ws)
            except AgentRejected:
                raise
            except (OSError, TimeoutError, websockets.WebSocketException) as err:
                log.warning("connection to %s lost (%s); reconnecting in %.0fs", url, err or type(err).__name__,
                            delay)
            if self.stopped.is_set():
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_reconnect_delay)

    async def _session(self, ws) -> None:
        self.ws = ws
        self.replies = asyncio.Queue()
        job = self.assignment.job_id if self.assignment else None
        await self.send(m.Hello(agent_version=__version__, installed_version=self.installed.get(job) if job else None))
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

    async def _heartbeats(self) -> None:
        while True:
            job = self.assignment.job_id if self.assignment else None
            await self.send(m.Heartbeat(throughput=self.meter.rate(), job_id=job,
                                        installed_version=self.installed.get(job) if job else None))
            await asyncio.sleep(self.heartbeat_interval)

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
            case m.Assign():
                log.info("assigned to job %s (%s, task %s)", message.job_id, message.model, message.task.get("name"))
                self._stop_rollout()
                self.assignment = message
                self.rollout_task = asyncio.create_task(self._rollout(message))
            case m.Release():
                log.info("released from job %s: %s", message.job_id, message.reason)
                if self.assignment and self.assignment.job_id == message.job_id:
                    self._stop_rollout()
                    self.assignment = None
            case m.SnapshotAvailable():
                asyncio.create_task(self._install(message))
            case m.Rejected() if message.ref is None and "agent key" in message.reason:
                raise AgentRejected(message.reason)
            case m.Rejected() if message.ref not in ("lease_request", "trajectories"):
                log.warning("site rejected our %s: %s", message.ref, message.reason)
            case _:
                await self.replies.put(message)

    def _stop_rollout(self) -> None:
        if self.rollout_task is not None:
            self.rollout_task.cancel()
            self.rollout_task = None

    async def _reply(self) -> m._Msg:
        return await asyncio.wait_for(self.replies.get(), REPLY_TIMEOUT_S)

    # ---- snapshots ------------------------------------------------------------------------

    async def _install(self, snap: m.SnapshotAvailable) -> None:
        key = (snap.job_id, snap.version)
        if key in self.relays:  # a repair: new parent and/or child for a version we already relay
            self._reroute(self.relays[key], snap)
            return
        if snap.version <= self.installed.get(snap.job_id, 0):
            return
        source = "http"
        try:
            if snap.parent:
                manifest, tensors, source = await self._receive_relayed(snap)
            else:
                manifest = parse_manifest(snap.manifest)
                payload = await asyncio.to_thread(fetch_payload, snap.url, manifest, credential=snap.credential)
                tensors = await asyncio.to_thread(load, payload)
        except Exception as err:  # a failed download leaves the old snapshot in place
            log.error("snapshot %s of job %s: download failed: %s", snap.version, snap.job_id, err)
            return
        assignment = self.assignment
        if assignment is None or assignment.job_id != snap.job_id:
            return
        engine = self.engines.get(assignment.model)
        async with self.install_lock:
            if engine is None or snap.version <= self.installed.get(snap.job_id, 0):
                return
            await asyncio.to_thread(engine.load_weights, tensors)
            self.installed[snap.job_id] = manifest.version
        seconds = max(0.0, time.time() - snap.published_at)
        relay = self.relays.get(key)
        stats = relay.stats if relay else None
        log.info("installed snapshot v%d of job %d (%.2fs after publication, via %s)", manifest.version, snap.job_id,
                 seconds, source)
        self._retire_relays(snap.job_id, keep_from=snap.version - 1)
        with contextlib.suppress(ConnectionError, websockets.WebSocketException):  # reported again on reconnect
            await self.send(m.SnapshotInstalled(job_id=snap.job_id, version=manifest.version, seconds=seconds,
                                                source=source, from_parent=stats.from_parent if stats else 0,
                                                from_fallback=stats.from_fallback if stats else 0))

    async def _receive_relayed(self, snap: m.SnapshotAvailable) -> tuple:
        """Pull the version from the chain parent (forwarding to our child as chunks arrive); the relay
        fetches what its parent cannot give from the learner's HTTP server. Returns (manifest, tensors, source)."""
        manifest = parse_manifest(snap.manifest)
        await self._start_hub()
        bw = self.config.bandwidth_bps
        relay = SnapshotRelay(manifest, worker_id=self.config.worker_id, fallback_url=snap.url,
                              uplink=bucket(bw), downlink=bucket(bw), on_event=self._relay_event,
                              credential=snap.credential)  # shown to the parent, the hub and the HTTP fallback
        key = (snap.job_id, snap.version)
        self.relays[key] = relay
        if self.hub is not None:
            self.hub.register(relay)
        self._reroute(relay, snap)
        payload = await relay.receive()
        tensors = await asyncio.to_thread(load, payload)
        stats = relay.stats
        source = "parent" if stats.from_parent and stats.from_parent >= stats.from_fallback else "fallback"
        log.info("snapshot v%d of job %d: %d chunks from parent, %d from fallback", snap.version, snap.job_id,
                 stats.from_parent, stats.from_fallback)
        return manifest, tensors, source

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
            del self.relays[key]
            self.relay_parents.pop(key, None)
            if self.hub is not None:
                self.hub.unregister(*key)

    # ---- rollouts --------------------------------------------------------------------------

    async def _rollout(self, assign: m.Assign) -> None:
        engine = self.engines.get(assign.model)
        if engine is None:
            log.info("loading %s", assign.model)
            engine = await asyncio.to_thread(self.engine_factory, assign.model)
            self.engines[assign.model] = engine
        self.installed.setdefault(assign.job_id, 0)
        if assign.snapshot:
            await self._install(m.SnapshotAvailable.model_validate(assign.snapshot))
        task = build_task(assign.task)
        params = SamplingParams(max_new_tokens=assign.max_new_tokens, temperature=assign.temperature,
                                top_p=assign.top_p)
        while True:
            await self.send(m.LeaseRequest(job_id=assign.job_id, groups=self.groups_per_lease))
            reply = await self._reply()
            if isinstance(reply, m.NoWork):
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
                version = self.installed[assign.job_id]
                leases = [GroupLease(x.lease_id, x.group_id, x.prompt) for x in reply.leases]
                groups = await asyncio.to_thread(rollout_groups, engine, task, leases, job_id=assign.job_id,
                                                 n=assign.group_size, params=params, version=version)
            for lease, group in zip(reply.leases, groups, strict=True):
                await self.send(m.Trajectories(group=group))
                answer = await self._reply()
                if isinstance(answer, m.Accepted) and answer.accepted:
                    self.meter.add(answer.accepted)
                    self.generated += answer.accepted
                else:
                    log.warning("group %s refused: %s", lease.lease_id,
                                "; ".join(getattr(answer, "reasons", []) or [getattr(answer, "reason", "")]))
