"""The rollout loop of one assignment: return the last batch and lease the next in one round trip, generate under
the installed version, again; supervised, so a crash is reported and the loop restarted.

**Lease ahead**: once a batch's generation has been timed, that round trip goes out while the current
batch generates, so generation does not wait a round trip per batch (150 ms and more on a long link). At most one
lease is held ahead, and only when this batch, the next and a reply fit in ``LEASE_AHEAD_SHARE`` of the site's
lease timeout; a lease ahead that cannot be generated (a newer snapshot to install first) is handed back at once.

Each round trip is one ``submit`` ("return these groups, lease k more"; ``dataplane.messages.Submit``): the
messages an agent sends per trajectory fall as its batches grow, and the batch grows when the agent is fast enough
that one message per batch would use more than ``BUDGET_SHARE`` of the budget the site announced, so the fastest
engine stays far below it. A group too big for one frame goes alone, in parts (``submit.frames``).

A generated group is only ever discarded by the site's verdict on its content: the connection sends a request
again after a refusal, a reconnect or a reply that never came (``worker_agent.connection``) until
``RETURN_DEADLINE_S``; a group that cannot be sent at all (a record bigger than any frame) hands its lease back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import websockets

from dataplane import messages as m
from dataplane.records import TrajectoryGroup
from dataplane.rewards import REFUSED, CannotServe
from dataplane.tasks import build_task

from . import status, submit
from .connection import NotConnected, SiteConnection
from .engines.base import SamplingParams
from .installs import Installer
from .rollout import GroupLease, rollout_groups
from .state import MAX_REASON_CHARS, crash_reason

log = logging.getLogger("echo2.agent")

BUDGET_SHARE = 0.25  # of the paced message rate, at most, spent on the rollout loop's round trips
LEASE_DEADLINE_S = 60.0  # a lease request that gets no answer this long (the site away) fails the loop
RETURN_DEADLINE_S = 120.0  # generated groups are sent again this long before they are given up (leases long gone)
LEASE_AHEAD_SHARE = 0.5  # a lease taken ahead must be answered within this share of the site's lease timeout
LEASE_AHEAD_DRY_S = 5.0  # no lease ahead this long after the site said it had no work
# Generated groups that got no verdict (the site away or unable to take them past RETURN_DEADLINE_S) go again with the
# next request for this long: under the 900 s the site remembers the groups it stored (dataplane.replay
# RESEND_MEMORY_S), so one that was stored after all is told accepted, one whose lease went elsewhere is refused.
KEEP_UNSENT_S = 600.0
# What the site says to a lease or a submit of a job this worker is no longer in (marketplace/services/base.py
# running_activation): a verdict no resend can change, so the loop stops asking.
RELEASED_SIGNS = ("this worker was released from it", "this worker is not active in job")


UNPUBLISHED_BASE_WAIT_S = 15.0  # the least wait to ask for a base the assignment said was not published yet
IDLE_WAIT_CAP_S = 3.0  # an idle agent asks for work at least this often (a job's prompts come back within a step)


def idle_wait(*, retry_after: float, previous: float | None) -> tuple[float, float]:
    """How long to wait before asking again after the site said it had no work, and the ceiling it was drawn under
    (pass it back as ``previous`` while the answer stays the same): the ceiling is ``retry_after`` the first time,
    then doubles up to ``IDLE_WAIT_CAP_S``, and each wait is drawn at random between half and all of it (a fleet
    that ran dry together must not ask again in step: 200 idle agents asking every 0.2 s were 1,000 messages a
    second for nothing). The ceiling doubles from the ceiling, not from the wait drawn: doubling a short draw kept
    some agents well below the cap."""
    ceiling = retry_after if previous is None else min(max(retry_after, IDLE_WAIT_CAP_S), 2 * previous)
    return max(retry_after, random.uniform(0.5, 1.0) * ceiling), ceiling  # never sooner than the site asked


class Released(Exception):
    """The site answered that this worker is not in the job any more (released, or the job ended)."""


@dataclass
class RolloutStatus:
    """What the rollout loops report, kept across restarts and assignments (the status lines, heartbeats)."""

    producing: bool = False  # generating (leases held), not waiting for work or a version
    failure: str | None = None  # the last crash, until the restarted loop works again
    failures: int = 0  # crashes, each restarted
    refused: bool = False  # it will not serve this job (``_refuse``): every heartbeat says so
    no_work: bool = False  # the site's last answer to a lease request was "no work"
    generated: int = 0  # trajectories the site accepted

    def reset(self) -> None:
        self.producing, self.failure, self.no_work, self.refused = False, None, False, False


def batch_size(*, least: int, groups_per_s: float | None, messages_per_s: float | None) -> int:
    """Groups to lease per round trip: ``least`` (the agent's ``--groups``), more when one round trip per
    batch would spend over ``BUDGET_SHARE`` of the message budget, at most ``MAX_BATCH``."""
    if not groups_per_s or not messages_per_s:
        return least
    needed = math.ceil(groups_per_s / (messages_per_s * BUDGET_SHARE))
    return max(least, min(m.MAX_BATCH, needed))


class RolloutLoop:
    """One assignment's loop. ``report_state`` sends a heartbeat when due (entering "generating" at once)."""

    def __init__(self, assign: m.Assign, *, connection: SiteConnection, installs: Installer, rollout: RolloutStatus,
                 tally: status.Tally, meter, report_state: Callable[[], Awaitable[None]], groups_per_lease: int,
                 retry_delay: float, allow_user_code: bool = False,
                 on_released: Callable[[str], None] | None = None) -> None:
        self.assign = assign
        self.on_released = on_released  # told why, when the site's answer says the worker left the job
        self.allow_user_code = allow_user_code  # the provider's opt-in (echo2-agent run --allow-user-code)
        self.connection = connection
        self.installs = installs
        self.status = rollout
        self.tally = tally
        self.meter = meter
        self.report_state = report_state
        self.groups_per_lease = groups_per_lease
        self.retry_delay = retry_delay
        self.batch = groups_per_lease  # groups leased per round trip now
        self.generation_s: float | None = None  # how long the last batch took to generate
        self.leased_ahead = 0  # batches leased while the one before generated
        self.dry_at = -math.inf  # when the site last had no work for us (time.monotonic())
        self.unsent: dict[str, tuple[float, TrajectoryGroup]] = {}  # lease id -> (first sent, group): no verdict yet
        self.idle_ceiling: float | None = None  # the last idle wait's ceiling, while the site keeps saying "no work"

    async def supervised(self) -> None:
        """Run the loop; when it crashes (an engine error, the site away past a deadline, a bug) the cause is
        logged, counted and reported (state ``failed`` with the reason, billed nothing) and the loop starts again
        after a back-off (1 s doubling to 30 s while it keeps failing). The state stays ``failed`` until the
        restarted loop works again (an accepted group, or the site saying it has no work); failing too long, the
        site releases it."""
        delay = 1.0
        while True:
            try:
                await self.run()
                return
            except asyncio.CancelledError:
                raise
            except Released as err:  # asking again would be answered the same, once a second, for good
                self.status.producing = False
                log.warning("job %s: the site says %s; not asking for its work any more", self.assign.job_id, err)
                if self.on_released is not None:
                    self.on_released(str(err))
                return
            except Exception as err:  # noqa: BLE001 - whatever killed it, the loop must come back
                st = self.status
                st.failures += 1
                delay = delay if st.failure is not None else 1.0  # it had recovered: back-off anew
                st.producing, st.failure = False, crash_reason(err)
                log.error("job %s: the rollout loop failed (%s); restarting it in %.0f s", self.assign.job_id,
                          st.failure, delay, exc_info=not isinstance(err, TimeoutError | ConnectionError))
                await asyncio.sleep(delay)
                delay = min(2 * delay, 30.0)

    async def run(self) -> None:
        assign, st = self.assign, self.status
        await self.installs.join(assign)
        task = build_task(assign.task)
        try:  # after the join: the task's data sets are fetched with the base
            await asyncio.to_thread(task.prepare, allow_user_code=self.allow_user_code)
        except CannotServe as err:  # user code it does not run, a scorer's package missing: it will not change
            await self._refuse(str(err))
            return
        params = SamplingParams(max_new_tokens=assign.max_new_tokens, temperature=assign.temperature,
                                top_p=assign.top_p)
        groups: list[TrajectoryGroup] = []  # generated, to return with the next request
        lease: m.Lease | None = None  # leased ahead while the last batch generated: the next to generate
        rate: float | None = None  # groups per second over the last round (generation and round trip)
        while True:
            ready = self.installs.ready(assign.job_id)
            st.producing = st.producing and ready  # waiting for a version is idle
            if lease is not None and not ready:  # a version to reach first came meanwhile
                await self._hand_back(lease, "the agent must install a newer snapshot before generating")
                lease = None
            started = time.monotonic()
            want = self._batch(rate)
            if lease is None:  # nothing in hand: return what we have and lease, one round trip, then generate
                if not groups and not ready:
                    await self._until_ready(assign.job_id)
                    continue
                lease = await self._round_trip(groups, lease=want if ready else 0)  # no lease it cannot answer
                groups = []
                if lease is None:
                    continue
            # Generate the lease in hand; meanwhile the groups of the last batch go back and, when the next batch
            # will be generated well within the site's lease timeout, the next lease comes (one ahead, at most).
            ahead = self._may_lease_ahead(lease)
            trip = (asyncio.create_task(self._return_and_lease(groups, lease=want if ahead else 0))
                    if groups or ahead else None)
            groups = []
            try:
                generated = await self._generate(lease, task, params)
            except BaseException:
                if trip is not None:  # the groups on their way back still go (an engine error), unless cancelled
                    await _finish(trip)
                raise
            try:
                next_lease = await trip if trip is not None else None
            except (TimeoutError, NotConnected) as err:  # the site away past the deadline: the groups just generated
                log.warning("job %d: %s; the next round trip takes the groups generated since", assign.job_id,
                            err or type(err).__name__)  # go with the next request, which fails the loop likewise
                next_lease = None
            if generated is None:  # an install failed meanwhile: the lease goes back, to be leased again at once
                await self._hand_back(lease, "the agent's snapshot install failed")
                st.producing = False
            groups, lease = generated or [], next_lease if isinstance(next_lease, m.Lease) else None
            if ahead:
                self.leased_ahead += lease is not None
            st.no_work = isinstance(next_lease, m.NoWork)
            if st.no_work:
                self.dry_at = time.monotonic()
            rate = len(groups) / max(time.monotonic() - started, 1e-3) if groups else rate

    async def _round_trip(self, groups: list[TrajectoryGroup], *, lease: int) -> m.Lease | None:
        """Return ``groups`` and lease ``lease`` more in one round trip, generation waiting: the lease to generate,
        or None (not leasing; the site has no work, after its ``retry_after``; or it refused, after a second)."""
        st = self.status
        reply = await self._return_and_lease(groups, lease=lease)
        if not lease:
            return None
        st.producing = isinstance(reply, m.Lease)
        await self.report_state()
        st.no_work = isinstance(reply, m.NoWork)
        if isinstance(reply, m.NoWork):
            self.dry_at = time.monotonic()
            st.failure = None  # the loop works: there is just nothing to do
            wait, self.idle_ceiling = idle_wait(retry_after=reply.retry_after, previous=self.idle_ceiling)
            await asyncio.sleep(wait)
            return None
        self.idle_ceiling = None
        if not isinstance(reply, m.Lease):
            await asyncio.sleep(1.0)
            return None
        return reply

    def _batch(self, rate: float | None) -> int:
        """Groups to lease per round trip now (:func:`batch_size`), said at DEBUG when it changes."""
        want = batch_size(least=self.groups_per_lease, groups_per_s=rate, messages_per_s=self.connection.pacer.rate)
        if want != self.batch:
            log.debug("job %d: leasing %d groups per round trip (%.1f groups/s, paced at %s messages/s)",
                      self.assign.job_id, want, rate or 0.0, self.connection.pacer.rate)
            self.batch = want
        return want

    def _may_lease_ahead(self, lease: m.Lease) -> bool:
        """Whether to lease the next batch while this one generates: only once a batch's generation was timed,
        and only when this batch and the next (about as long) and a reply's round trip fit in
        ``LEASE_AHEAD_SHARE`` of the site's lease timeout, so no lease ahead expires before its groups go back
        (an expired lease is leased again to another worker, and the late group is refused: work lost). Not for
        ``LEASE_AHEAD_DRY_S`` after the site had no work for us: prompts are scarce, one leased ahead would wait here
        while another worker idles, and the ahead request would mostly come back empty (a message for nothing)."""
        if self.generation_s is None or time.monotonic() - self.dry_at < LEASE_AHEAD_DRY_S:
            return False
        rtt = self.connection.round_trips.srtt or 0.0
        return 2 * self.generation_s + rtt < LEASE_AHEAD_SHARE * lease.timeout

    async def _generate(self, lease: m.Lease, task, params: SamplingParams) -> list[TrajectoryGroup] | None:
        """The lease's groups, generated under the installed version (no install lands meanwhile); None when the
        job's engine is not ready (an install failed since the lease was asked for)."""
        assign = self.assign
        async with self.installs.install_lock:  # no snapshot is installed while we generate
            job = self.installs.engine_for(assign.job_id)
            if job is None or not self.installs.ready(assign.job_id):
                return None
            leases = [GroupLease(x.lease_id, x.group_id, x.prompt) for x in lease.leases]
            began = time.monotonic()
            groups = await asyncio.to_thread(rollout_groups, job.engine, task, leases, job_id=assign.job_id,
                                             n=assign.group_size, params=params, version=job.version)
        self.generation_s = time.monotonic() - began
        return groups

    async def _hand_back(self, lease: m.Lease, why: str) -> None:
        """Give a lease's prompts back to the site (leased again at once); where that cannot be said now (no
        connection), they come back after the site's lease timeout. Nothing is lost either way."""
        for leased in lease.leases:
            with contextlib.suppress(NotConnected, websockets.WebSocketException):
                await self.connection.send(m.LeaseReturn(job_id=self.assign.job_id, lease_id=leased.lease_id,
                                                         reason=why))

    async def _refuse(self, why: str) -> None:
        """This worker will not serve the job (its task runs user code the provider did not allow, or needs a package
        not installed here): say so in the state the site sees (``failed`` and ``refused``, the reason in words; the
        site releases it at once and plans it no more for this job) and stop, without restarting: retrying cannot
        change the answer."""
        st = self.status
        text = f"{REFUSED}{why}"
        st.producing, st.refused = False, True
        st.failure = text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."
        log.error("job %s: %s", self.assign.job_id, st.failure)
        await self.report_state()

    async def _return_and_lease(self, groups: list[TrajectoryGroup], *, lease: int) -> m.Lease | m.NoWork | None:
        """Return ``groups`` and lease ``lease`` more, in as few requests as the frame limit allows (the lease
        rides on the last). Returns the new lease, ``no_work``, or None when the site refused the request."""
        job_id = self.assign.job_id
        batches, alone = self._batches(self._with_unsent(groups))
        for group in alone:  # too big for a batch frame: in parts, under its own request
            await self._return_alone(group)
        if not batches and not lease:
            return None
        for i, batch in enumerate(batches or [[]]):
            last = i == max(len(batches), 1) - 1
            ask = lease if last else 0
            deadline = RETURN_DEADLINE_S if batch else LEASE_DEADLINE_S
            try:
                reply = await self.connection.request(m.Submit(job_id=job_id, groups=batch, lease=ask),
                                                      deadline_s=deadline)
            except (TimeoutError, NotConnected):
                self._keep_unsent(batches[i:])  # no verdict on them: they go again with the next request
                raise
            if isinstance(reply, m.Rejected) and any(sign in reply.reason for sign in RELEASED_SIGNS):
                raise Released(reply.reason)
            if isinstance(reply, m.Rejected) and reply.retry_after is not None:  # the site could not take it now
                self._keep_unsent(batches[i:])
                log.warning("job %s: the site could not take our submit (%s); %d groups go again with the next",
                            job_id, reply.reason, len(self.unsent))
                return None
            for group in batch:  # a verdict on each: accepted, or refused for its content
                self.unsent.pop(group.lease_id, None)
            if isinstance(reply, m.Rejected):
                if batch:
                    log.warning("job %s: the site refused our submit of %d groups: %s", job_id, len(batch),
                                reply.reason)
                else:  # a lease alone, as the job ended or we were released: nothing of ours was lost
                    log.info("job %s: no lease: %s", job_id, reply.reason)
                return None
            if not isinstance(reply, m.Submitted):
                log.warning("job %s: unexpected %s answering a submit", job_id, reply.type)
                return None
            for group, result in zip(batch, reply.results, strict=False):
                self._counted(group, result)
            if reply.earned_usd is not None:
                self.tally.earned_usd = reply.earned_usd
            if last:
                return reply.lease
        return None

    def _with_unsent(self, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
        """The groups kept for want of a verdict (those under ``KEEP_UNSENT_S`` old), then ``groups``."""
        now = time.monotonic()
        for lease_id, (since, _) in list(self.unsent.items()):
            if now - since >= KEEP_UNSENT_S:
                del self.unsent[lease_id]
                log.warning("job %s: the group of lease %s got no verdict in %.0f s; dropped", self.assign.job_id,
                            lease_id, now - since)
        kept = [group for _, group in self.unsent.values()]
        return kept + [group for group in groups if group.lease_id not in self.unsent]

    def _keep_unsent(self, batches: list[list[TrajectoryGroup]]) -> None:
        now = time.monotonic()
        for group in (group for batch in batches for group in batch):
            self.unsent.setdefault(group.lease_id, (now, group))

    def _batches(self, groups: list[TrajectoryGroup]) -> tuple[list[list[TrajectoryGroup]], list[TrajectoryGroup]]:
        """Consecutive batches that each fit one frame, and the groups that fit no batch frame alone."""
        if not groups:
            return [], []
        room = self.connection.max_message_bytes - 200  # the submit's own fields
        sizes = [len(group.model_dump_json()) + 1 for group in groups]
        batches: list[list[TrajectoryGroup]] = []
        alone: list[TrajectoryGroup] = []
        current, used = [], 0
        for group, size in zip(groups, sizes, strict=True):
            if size > room:
                alone.append(group)
                continue
            if current and (used + size > room or len(current) == m.MAX_BATCH):
                batches.append(current)
                current, used = [], 0
            current.append(group)
            used += size
        if current:
            batches.append(current)
        return batches, alone

    async def _return_alone(self, group: TrajectoryGroup) -> None:
        """A group too big for one frame, sent in parts; a record bigger than any frame hands its lease back."""
        try:
            answer = await self.connection.request(m.Trajectories(group=group), deadline_s=RETURN_DEADLINE_S)
        except submit.RecordTooBig as err:
            log.error("job %d: the group of lease %s cannot be sent (%s); handing the lease back", group.job_id,
                      group.lease_id, err)
            await self.connection.send(m.LeaseReturn(job_id=group.job_id, lease_id=group.lease_id,
                                                     reason=str(err)[:500]))
            return
        if isinstance(answer, m.Accepted):
            self._counted(group, answer)
        else:
            log.warning("group %s refused: %s", group.lease_id, getattr(answer, "reason", answer.type))

    def _counted(self, group: TrajectoryGroup, answer: m.Accepted) -> None:
        if answer.accepted:
            self.meter.add(answer.accepted)
            self.tally.add(trajectories=answer.accepted, tokens=sum(len(r.completion_ids) for r in group.records))
            self.status.generated += answer.accepted
            self.status.failure = None  # the restarted loop delivers again
        else:
            log.warning("group %s refused: %s", group.lease_id, "; ".join(answer.reasons))

    async def _until_ready(self, job_id: int) -> None:
        """Wait until the job's version is installed; meanwhile, when nothing is being installed for the job, ask
        the site for the snapshot missing (the base, else the newest), again after a doubling delay. Each wait is
        drawn between half and all of its delay. When the assignment named no base (the learner had not published
        it yet), its announcement is what installs it, and the first ask, in case that was lost, waits
        :data:`UNPUBLISHED_BASE_WAIT_S`: a fleet assigned at once asked four times each while a job's learner
        started, every ask at the same instants, and the site answered the last ones 20 s late."""
        delay, due = self.retry_delay, time.monotonic()
        if self.assign.base is None and self.installs.engine_for(job_id) is None:
            delay = max(delay, UNPUBLISHED_BASE_WAIT_S)
            due += random.uniform(0.5, 1.0) * delay
        while not self.installs.ready(job_id):
            idle = not any(key[0] == job_id for key in self.installs.installing)
            if idle and time.monotonic() >= due:
                which = "newest" if self.installs.engine_for(job_id) else "base"
                log.debug("job %d: asking the site for its %s snapshot", job_id, which)
                await self.connection.send(m.SnapshotRequest(job_id=job_id, which=which))
                due = time.monotonic() + random.uniform(0.5, 1.0) * delay
                delay = min(delay * 2, 30.0)
            await asyncio.sleep(0.1)


async def _finish(task: asyncio.Task) -> None:
    """Let ``task`` (a round trip under way) end on its own, whatever it raises; cancelled with us, it is cancelled
    too (the loop was stopped: its requests end with it)."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        task.cancel()
        raise
    except Exception:  # noqa: BLE001 - the error that ends the loop is the caller's, not this round trip's
        log.debug("a round trip ended by %r while the loop stopped", task.exception(), exc_info=False)
