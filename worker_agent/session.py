"""The agent's control session: the composition of a connection to the site, the snapshot installs, the relays
and the rollout loop of the current assignment, each an object of its own:

- :class:`~worker_agent.connection.SiteConnection`: the websocket, reconnects, request ids, pacing by the site's
  announced budget, requests sent again rather than dropped;
- :class:`~worker_agent.installs.Installer`: the job's engine and its versions, and which version to fetch when
  (no batch is generated under a partly installed snapshot, and its records carry the version really used);
- :class:`~worker_agent.relaying.Relays`: the forwarding chains' relay hub and relays, on the session's loop;
- :class:`~worker_agent.rollout_loop.RolloutLoop`: lease, generate, return, supervised.

The session reads the site's messages and hands each to its owner, and sends heartbeats (small and regular, and at
once when the state changes: :mod:`worker_agent.state`). A reconnect does not stop the rollout loop: its requests
wait for the connection and go again, and the site's re-sent assignment for the same job leaves the loop running.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from dataplane import messages as m
from dataplane.hardware import Hardware

from . import __version__, status
from .cache import BaseCache
from .config import AgentConfig
from .connection import AgentRejected, NotConnected, SiteConnection
from .engines.base import Engine
from .hardware import probe
from .installs import Installer
from .relaying import Relays
from .rollout_loop import RolloutLoop, RolloutStatus
from .state import Facts, derive_state, heartbeat_due
from .timing import Rates

log = logging.getLogger("echo2.agent")

HEARTBEAT_POLL_S = 0.2  # how often the heartbeat loop looks for a state change to report

__all__ = ["AgentSession", "ThroughputMeter"]


def _log_crash(task: asyncio.Task) -> None:
    """A background task of the session that ended by an error says so (it is not restarted: a bug)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r", task.get_name(), task.exception(), exc_info=task.exception())


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
    """One agent's session with the site: its parts (``connection``, ``installs``, ``relaying``, the rollout loop of
    the assignment and its ``rollout`` status) wired together, the site's messages dispatched to them, heartbeats."""

    def __init__(self, config: AgentConfig, *, engine_factory: Callable[[str], Engine], cache: BaseCache,
                 groups_per_lease: int = 2, max_reconnect_delay: float = 30.0, relay_listen: str | None = None,
                 retry_delay: float = 2.0, status_every: float = 10.0, hardware: Hardware | None = None,
                 status_file: Path | None = None) -> None:
        """``engine_factory`` builds an engine from a checkpoint directory (the job's base, unpacked in ``cache``);
        ``groups_per_lease``: the least groups leased per round trip (more when the agent is fast);
        ``retry_delay``: first wait before asking the site again for a snapshot the agent lacks (doubling, <= 30 s);
        ``status_every``: seconds between two summaries of what the agent does (:mod:`worker_agent.status`);
        ``status_file``: where the status is kept for ``echo2-agent status`` (None: nowhere);
        ``hardware``: what this machine has, sent with every hello (default: :func:`worker_agent.hardware.probe`);"""
        self.config = config
        self.hardware = hardware or probe(cache.root)
        self.groups_per_lease = groups_per_lease
        self.retry_delay = retry_delay
        self.connection = SiteConnection(config.server, config.agent_key, max_reconnect_delay=max_reconnect_delay)
        self.relaying = Relays(worker_id=config.worker_id, bandwidth_bps=config.bandwidth_bps, listen=relay_listen,
                               report=self._relay_report)
        self.installs = Installer(cache=cache, engine_factory=engine_factory, relays=self.relaying,
                                  send=self.connection.send, assignment=lambda: self.assignment,
                                  round_trips=self.connection.round_trips, rates=Rates(config.bandwidth_bps),
                                  user_code=lambda: self.config.allow_user_code)
        self.rollout = RolloutStatus()
        self.meter = ThroughputMeter()
        self.tally = status.Tally()  # what the site accepted, for the status lines' rates
        self.heartbeat_interval = 5.0
        self.assignment: m.Assign | None = None
        self.rollout_task: asyncio.Task | None = None
        self.last_beat: tuple[str, float] | None = None  # the last heartbeat: state, monotonic time
        self.stopped = asyncio.Event()
        self.status_every, self.status_file = status_every, status_file
        self.released: str | None = None  # why the site last released this worker, until the next assignment

    # ---- connection ----------------------------------------------------------------------

    async def run_forever(self) -> None:
        await self.relaying.start_hub()
        reporter = asyncio.create_task(status.report(self, every=self.status_every, status_file=self.status_file),
                                       name="the status reporter")
        reporter.add_done_callback(_log_crash)
        try:
            await self.connection.run(self._session, self.stopped)
        finally:
            reporter.cancel()
            self._stop_rollout()
            await self.relaying.close()

    async def _session(self) -> None:
        """One socket's life: hello, heartbeats, and every frame the site sends, until it closes."""
        log.info("connected as worker %s", self.config.worker_id)
        job = self.assignment.job_id if self.assignment else None
        await self.connection.send(m.Hello(agent_version=__version__, job_id=job,
                                           installed_version=self.installs.installed_version(job),
                                           hardware=self.hardware, allow_user_code=self.config.allow_user_code))
        heartbeat = asyncio.create_task(self._heartbeats())
        try:
            async for frame in self.connection.ws:
                await self._dispatch(frame)
        finally:
            heartbeat.cancel()

    async def _relay_report(self, message: m.RelayFailed) -> None:
        """A relay's parent failure, reported only for the job this worker serves: when a job ends or releases us,
        the chain above closes too, and a report about it repairs nothing (the site takes one that crossed the
        release in silence)."""
        if self.assignment is None or self.assignment.job_id != message.job_id:
            log.debug("not reporting v%d of job %d's failed parent: not serving that job now", message.version,
                      message.job_id)
            return
        await self.connection.send(message)

    def state(self) -> m.WorkerState:
        """What the agent is doing now (:func:`worker_agent.state.derive_state`), as the site bills it."""
        job = self.assignment.job_id if self.assignment else None
        loading, installing = self.installs.activity(job)
        return derive_state(Facts(assigned=job is not None, failure=self.rollout.failure,
                                  producing=self.rollout.producing, loading=loading, installing=installing))

    async def _heartbeats(self) -> None:
        """Every ``heartbeat_interval``, and at once (at most once a second) when the state changes."""
        self.last_beat = None  # a new socket: the first at once
        while True:
            self.connection.sample_ping()  # the websocket's ping round trips time the agent's waits too
            with contextlib.suppress(NotConnected):
                await self.report_state()
            await asyncio.sleep(HEARTBEAT_POLL_S)

    async def report_state(self) -> None:
        """A heartbeat if due (``state.heartbeat_due``); also called on a lease: "generating" precedes its groups."""
        state, now = self.state(), time.monotonic()
        last_state, last_sent = self.last_beat or (None, None)
        if self.connection.ws is None or not heartbeat_due(state=state, last_state=last_state, last_sent=last_sent,
                                                           now=now, interval=self.heartbeat_interval):
            return
        self.last_beat = (state, now)  # before the send: a concurrent caller sees it as sent
        job = self.assignment.job_id if self.assignment else None
        await self.connection.send(m.Heartbeat(throughput=self.meter.rate(), job_id=job, state=state,
                                               reason=(self.rollout.failure or "") if state == "failed" else "",
                                               refused=state == "failed" and self.rollout.refused,
                                               installed_version=self.installs.installed_version(job)))

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
                self.connection.welcome(message)
            case m.Assign():
                self._assigned(message)
            case m.Release():
                log.info("released from job %s: %s", message.job_id, message.reason)
                if self.assignment and self.assignment.job_id == message.job_id:
                    self._stop_rollout()
                    self.assignment, self.released = None, f"released from job {message.job_id}: {message.reason}"
            case m.SnapshotAvailable():
                self.installs.offer(message)
            case m.Rejected() if message.ref is None and "agent key" in message.reason:
                raise AgentRejected(message.reason)
            case m.Lease() | m.NoWork() | m.Accepted() | m.Rejected() | m.Submitted() if message.ref_id is not None:
                self.connection.answer(message)
            case m.Rejected() if message.retry_after is not None:  # a message that waits on no reply, refused
                self.connection.refused += 1
                self.connection.pacer.hold(message.retry_after)
                log.warning("site refused our %s for now: %s", message.ref, message.reason)
            case m.Rejected():
                log.warning("site rejected our %s: %s", message.ref, message.reason)
            case _:
                log.warning("discarding a %s that answers no request of ours", message.type)

    def _assigned(self, assign: m.Assign) -> None:
        """An assignment: a new job starts a new rollout loop; the same job again (re-sent on a reconnect, with the
        newest snapshot) leaves the running loop alone, its requests go on, and only the versions are updated."""
        same = (self.assignment is not None and self.assignment.job_id == assign.job_id
                and self.rollout_task is not None and not self.rollout_task.done()
                and assign.base_digest == self.assignment.base_digest)
        if same:
            self.assignment = assign
            if assign.snapshot:
                self.installs.want(assign.job_id, int(assign.snapshot["version"]))
            return
        log.info("assigned to job %s (%s, task %s)", assign.job_id, assign.model, assign.task.get("name"))
        self._stop_rollout()
        self.assignment, self.released = assign, None
        loop = RolloutLoop(assign, connection=self.connection, installs=self.installs, rollout=self.rollout,
                           tally=self.tally, meter=self.meter, report_state=self.report_state,
                           groups_per_lease=self.groups_per_lease, retry_delay=self.retry_delay,
                           allow_user_code=self.config.allow_user_code,
                           on_released=lambda why, job=assign.job_id: self._left(job, why))
        self.rollout_task = asyncio.create_task(loop.supervised(), name=f"the rollout loop of job {assign.job_id}")

    def _left(self, job_id: int, why: str) -> None:
        """The site answered the rollout loop that this worker is not in ``job_id`` any more (its release was lost,
        or crossed a request): idle, as if the release had come, and the status line says why."""
        if self.assignment is not None and self.assignment.job_id == job_id:
            self.assignment, self.released = None, f"released from job {job_id}: {why}"
            self.rollout.reset()

    def _stop_rollout(self) -> None:
        if self.rollout_task is not None:
            self.rollout_task.cancel()
            self.rollout_task = None
        self.rollout.reset()
