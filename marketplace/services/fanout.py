"""Publication at fleet size (docs/broadcast.md "Publication at fleet size"): one small event per
published snapshot to the job's agents group, and each agent socket building its own worker's notice.

The learner's ``POST /snapshots/`` (``broadcast.snapshot_publish``) records the snapshot, plans the chains
(``telemetry.save_chain_plan``) and, with :func:`publication_announce`, saves in Redis what every site process
needs besides the plan to tell any worker of the job where to pull from (the relay addresses of the plan's
parents, the credentials' expiry, a nonce naming this announcement); after the commit it sends ONE event,
``{"type": "agent.snapshot", "job_id", "version", "nonce"}``, to ``agents.job.<id>``. Every agent socket of a
worker assigned to the job is in that group (:class:`JobFollower`: joined on the ``assign`` the socket forwards,
left on ``release`` and close). Each socket then builds its own worker's ``snapshot`` message
(:meth:`Publication.text_for`): its route from the plan, its credential (an HMAC of the job's secret, no database
write) and, for a relay parent, the sha256 of its child's. The snapshot row, the job's secret, the plan and the
addresses are read once per site process and announcement (:class:`PublicationCache`), so what a worker costs
is two HMACs and a small message, spread over the site's processes, after the learner has its reply.

Neither the event nor the message carries the manifest. The event: channels_redis 4 queues a group message once
per site process, with the names of its member channels (~50 bytes each), so it costs N x 50 bytes however big
the manifest. The message: it names the manifest by reference (``manifest_sha256``, ``manifest_bytes``:
``dataplane.snapshot.manifest_reference``, computed once per announcement) and each agent fetches the manifest
once per version from the learner's server (``{url}manifest.json``, the credential it already has for the
chunks), so a worker's message is a few hundred bytes whatever the snapshot's chunk count, where the whole
manifest (26.7 KB at 256 chunks) went down every socket before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from dataplane import credentials
from dataplane import messages as m
from dataplane.broadcast import chains, strategies
from dataplane.replay import TRANSIENT
from dataplane.snapshot import ManifestReference, manifest_reference

from ..infra import stream, telemetry
from ..models import Snapshot

log = logging.getLogger(__name__)
EVENT = "agent.snapshot"  # handled by AgentConsumer.agent_snapshot
RECORD_TTL_S = 3600  # as long as the chain plan it completes
REJOIN_AFTER_S = 3600.0  # channels_redis forgets a group member after its group_expiry (a day by default)


def agents_group(job_id: int) -> str:
    """The channel group of the agent sockets of the workers assigned to ``job_id``."""
    return f"agents.job.{job_id}"


def _record_key(job_id: int, version: int) -> str:
    return f"echo2:bcast:{job_id}:{version}:announced"


def _latest_key(job_id: int) -> str:
    return f"echo2:bcast:{job_id}:latest"


@dataclass(frozen=True)
class Announced:
    """What every worker's ``snapshot`` message of one published version shares."""

    job_id: int
    version: int
    url: str
    manifest: ManifestReference  # the manifest by reference: agents fetch it from ``{url}manifest.json``
    published_at: float
    strategy: str
    learner_relay: str
    secret: str
    expires: int

    @property
    def relaying(self) -> bool:
        """Snapshots travel down relay chains: a relayed strategy (``chain``) and a learner relay to seed them."""
        return strategies.get(self.strategy).relayed and bool(self.learner_relay)

    def credential(self, worker_id: int) -> str:
        """The token letting ``worker_id`` fetch this version until ``expires`` (dataplane.credentials)."""
        return credentials.issue(self.secret, job_id=self.job_id, worker_id=worker_id, lowest=self.version,
                                 highest=self.version, expires=self.expires)


def notice(shared: Announced, *, worker_id: int, route: tuple[int | None, int | None] | None = None,
           addresses: dict[int, str] | None = None) -> m.SnapshotAvailable:
    """The snapshot for worker ``worker_id``, with its transfer credential. ``route`` is its (parent, child) in
    the chain plan (parent None: the learner's relay); without a route it fetches over HTTP from the url. A
    relay parent also gets the sha256 of its child's credential, the only child it will then serve. The manifest
    goes by reference, the same for every worker (the agent fetches it once from ``{url}manifest.json``)."""
    relay: dict[str, Any] = {"strategy": shared.strategy}
    if route is not None and shared.relaying:
        parent, child = route
        address = shared.learner_relay if parent is None else (addresses or {}).get(parent, "")
        if address:
            children = [child] if child is not None else []
            prints = {c: credentials.fingerprint(shared.credential(c)) for c in children}
            relay.update(parent=address, parent_worker_id=parent, children=children, child_credential_sha256=prints)
    return m.SnapshotAvailable(job_id=shared.job_id, version=shared.version, url=shared.url,
                               manifest_sha256=shared.manifest.sha256, manifest_bytes=shared.manifest.size,
                               published_at=shared.published_at, credential=shared.credential(worker_id), **relay)


def announced(snap: Snapshot, *, strategy: str, learner_relay: str, secret: str, expires: int) -> Announced:
    """What every worker's message of ``snap`` shares. The reference hashes the manifest as the site stored it,
    after checking it (``broadcast._checked_manifest``: ``parse_manifest``, then its JSON)."""
    return Announced(job_id=snap.job_id, version=snap.version, url=snap.url, manifest=manifest_reference(snap.manifest),
                     published_at=snap.published_at.timestamp(), strategy=strategy, learner_relay=learner_relay,
                     secret=secret, expires=expires)


@dataclass(frozen=True)
class Publication:
    """One announcement of a published version, as a site process holds it to tell any worker of the job."""

    shared: Announced
    nonce: str
    routes: dict[int, tuple[int | None, int | None]]  # chain members' (parent, child)
    members: frozenset[int]  # every worker in the plan: chains and rollout-only
    addresses: dict[int, str]  # relay address of every parent in the plan

    @classmethod
    def build(cls, shared: Announced, *, nonce: str, plan: chains.ChainPlan,
              addresses: dict[int, str]) -> Publication:
        members = frozenset(w for chain in plan.chains for w in chain) | frozenset(plan.rollout_only)
        return cls(shared=shared, nonce=nonce, routes=chains.routes(plan), members=members, addresses=addresses)

    def text_for(self, worker_id: int) -> str | None:
        """Worker ``worker_id``'s ``snapshot`` message as JSON text, or None when it is not in the plan (it was
        offline when the plan was made: it gets the newest snapshot with the ``assign`` its next hello brings).
        Validated as any other message (pydantic); its manifest is the announcement's reference."""
        if worker_id not in self.members:
            return None
        return notice(self.shared, worker_id=worker_id, route=self.routes.get(worker_id),
                      addresses=self.addresses).model_dump_json()


def publication_announce(*, job_id: int, version: int, plan: chains.ChainPlan, addresses: dict[int, str],
                         expires: int) -> str:
    """Save what the fan-out needs besides the plan (one Redis round trip) and send the job's agents group one
    event naming it once the transaction commits; returns the announcement's nonce. ``addresses`` may hold
    every worker's relay address: only the plan's parents' are kept."""
    nonce = secrets.token_hex(8)
    parents = {w: addresses[w] for chain in plan.chains for w in chain[:-1] if addresses.get(w)}
    record = json.dumps({"nonce": nonce, "expires": expires, "addresses": parents, "seeds": len(plan.chains)},
                        separators=(",", ":"))
    pipe = stream.client().pipeline()
    pipe.set(_record_key(job_id, version), record, ex=RECORD_TTL_S)
    pipe.set(_latest_key(job_id), json.dumps([version, nonce]), ex=RECORD_TTL_S)
    pipe.execute()
    _push_event(agents_group(job_id), {"type": EVENT, "job_id": job_id, "version": version, "nonce": nonce})
    return nonce


def _push_event(group: str, event: dict) -> None:
    """Send ``event`` to ``group`` once the transaction commits, best effort (as ``base._push``), on an event loop
    of its own: the site process's loop may hold thousands of the job's sockets, and once the event is queued
    it is busy building their messages; a send made through it (``async_to_sync``'s default) had the learner's
    request wait behind them (0.2 to 2.6 s at 10 k sockets, ``bench/bench_publication.py``). So the learner's
    request is answered after the event's own round trips, whatever the fan-out costs."""
    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send, force_new_loop=True)(group, event)
        except Exception as err:  # noqa: BLE001 - any transport failure of a best-effort push
            log.warning("push to %s lost (%s: %s)", group, type(err).__name__, err)

    transaction.on_commit(send)


def publication_load(job_id: int, version: int) -> Publication | None:
    """The announcement of ``version`` of ``job_id`` as saved last (with the snapshot's row, its URL the newest
    the learner announced), or None when it is gone (expired, or its transaction never committed)."""
    raw = stream.client().get(_record_key(job_id, version))
    plan = telemetry.load_chain_plan(job_id, version)
    snap = Snapshot.objects.select_related("job").filter(job_id=job_id, version=version).first()
    if raw is None or plan is None or snap is None:
        return None
    record = json.loads(raw)
    job = snap.job
    shared = announced(snap, strategy=job.settings.broadcast_strategy, learner_relay=job.learner_relay or "",
                       secret=job.transfer_secret, expires=int(record["expires"]))
    return Publication.build(shared, nonce=record["nonce"], plan=plan,
                             addresses={int(w): a for w, a in record["addresses"].items()})


def announced_seeds(job_id: int, version: int) -> int | None:
    """How many chains the plan of ``version`` had when it was announced (the learner sized its relay's fan-out
    from that: those seeds and one slot more), or None when the announcement is gone."""
    raw = stream.client().get(_record_key(job_id, version))
    seeds = json.loads(raw).get("seeds") if raw is not None else None
    return int(seeds) if seeds is not None else None


def latest_announced(job_id: int) -> tuple[int, str] | None:
    """(version, nonce) of the newest announcement of ``job_id``, if any."""
    raw = stream.client().get(_latest_key(job_id))
    if raw is None:
        return None
    version, nonce = json.loads(raw)
    return int(version), str(nonce)


class PublicationCache:
    """The announcements this site process has read, newest ``size`` kept: each read once however many of the
    process's sockets ask at the same moment (they share the one read, on the database thread)."""

    def __init__(self, size: int = 16, loader=publication_load) -> None:
        self.size = size
        self.loader = loader
        self.loads = 0  # reads made (the benchmark and the tests count them)
        self._held: OrderedDict[tuple[int, int, str], Publication] = OrderedDict()
        self._loading: dict[tuple[int, int, str], asyncio.Task] = {}

    async def get(self, job_id: int, version: int, nonce: str) -> Publication | None:
        key = (job_id, version, nonce)
        held = self._held.get(key)
        if held is not None:
            self._held.move_to_end(key)
            return held
        loop = asyncio.get_running_loop()
        task = self._loading.get(key)
        if task is None or task.get_loop() is not loop:
            # A task of its own: a socket closing while it waits must not cancel the read the others wait on.
            task = self._loading[key] = loop.create_task(self._load(key))
        return await asyncio.shield(task)

    async def _load(self, key: tuple[int, int, str]) -> Publication | None:
        try:
            self.loads += 1
            publication = await database_sync_to_async(self.loader)(key[0], key[1])
        finally:
            self._loading.pop(key, None)
        if publication is not None:  # held under its own nonce: a newer announcement is what was read
            self._held[(key[0], key[1], publication.nonce)] = publication
            while len(self._held) > self.size:
                self._held.popitem(last=False)
        return publication

    def clear(self) -> None:
        self._held.clear()


PUBLICATIONS = PublicationCache()


async def snapshot_text(worker_id: int, event: dict) -> str | None:
    """The ``snapshot`` message of ``worker_id`` for an ``agent.snapshot`` event (None: not in that plan)."""
    publication = await PUBLICATIONS.get(int(event["job_id"]), int(event["version"]), str(event["nonce"]))
    return publication.text_for(worker_id) if publication is not None else None


def membership(message: dict) -> tuple[str, int, int]:
    """What a message the site sends an agent means for its socket's agents group: ``("join", job, newest version
    it names)`` for an ``assign``, ``("leave", job, -1)`` for a ``release``, ``("", 0, -1)`` for anything else."""
    kind = message.get("type")
    if kind == "assign":
        named = [int(s["version"]) for s in (message.get("base"), message.get("snapshot")) if s]
        return "join", int(message["job_id"]), max(named, default=-1)
    if kind == "release":
        return "leave", int(message["job_id"]), -1
    return "", 0, -1


class JobFollower:
    """Keeps one agent socket in the agents group of the job its worker is assigned to (at most one)."""

    def __init__(self, layer, channel_name: str, worker_id: int) -> None:
        self.layer, self.channel_name, self.worker_id = layer, channel_name, worker_id
        self.group: str | None = None
        self.caught_up: str | None = None  # nonce of the announcement sent on joining, if any
        self.joined_at = 0.0
        # Each socket renews after its own share of the hour, so a fleet that joined together does not re-join
        # together at one publication (the layer batches those that still meet, ``channel_layer.rejoin``).
        self.spread = random.uniform(0.5, 1.0)

    def follows(self, job_id: int) -> bool:
        return self.group == agents_group(job_id)

    def wants(self, event: dict) -> bool:
        """Whether an ``agent.snapshot`` event is news for this socket: of the job it follows, and not the
        announcement it caught up with on joining (the event may also reach it when both crossed)."""
        return self.follows(int(event["job_id"])) and event["nonce"] != self.caught_up

    async def follow(self, message: dict) -> str | None:
        """Join or leave as ``message`` (just sent to the agent) says. After joining, the newest announcement's
        message for this worker when it is newer than what the ``assign`` named: one published between the
        assignment's writing and this join reached the group before this socket was in it."""
        action, job_id, named = membership(message)
        if not action or (action == "leave" and not self.follows(job_id)):
            return None
        await self.leave()
        if action == "leave":
            return None
        self.group = agents_group(job_id)
        await self.layer.group_add(self.group, self.channel_name)
        self.joined_at = time.monotonic()
        latest = await sync_to_async(latest_announced, thread_sensitive=False)(job_id)
        if latest is None or latest[0] <= named:
            return None
        self.caught_up = latest[1]
        publication = await PUBLICATIONS.get(job_id, *latest)
        return publication.text_for(self.worker_id) if publication is not None else None

    async def stay(self) -> None:
        """Join the group again when the membership is old: channels_redis drops a member ``group_expiry`` after it
        joined (a day by default), and a job can run for longer. Called at each event, so it costs a share of a
        batched round trip every half hour to hour (``spread``), not one per publication; a failed re-join is
        tried again at the next event (the membership has most of a day left)."""
        if self.group is not None and time.monotonic() - self.joined_at > REJOIN_AFTER_S * self.spread:
            try:
                await self.layer.rejoin(self.group, self.channel_name)
            except TRANSIENT as err:
                log.warning("re-join of %s for %s failed (%s); next event tries again", self.group,
                            self.channel_name, err)
                return
            self.joined_at = time.monotonic()

    async def leave(self) -> None:
        self.caught_up = None
        if self.group is not None:
            group, self.group = self.group, None
            await self.layer.group_discard(group, self.channel_name)
