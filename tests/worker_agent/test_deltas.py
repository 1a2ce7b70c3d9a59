"""Deltas through real agents: a learner relay feeds a chain of two agent sessions (real relay hubs on loopback, a
recording socket for the site); each version published as a delta travels the chain as it is, the head forwarding
it to its child, and both install the learner's bf16 weights bit for bit. An agent that lacks the delta's base
(it joined late) fetches the version's full payload over HTTP instead."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from dataplane import credentials
from dataplane import messages as m
from dataplane.broadcast.store import CHUNKS, MANIFEST, version_dir
from dataplane.snapshot import FULL, manifest_reference
from echo2_site.demo import free_port
from learner.serving import RELAY_MODES, LearnerRelay, SnapshotServer
from learner.snapshots import SnapshotStore, publishable_state

from .test_session import SECRET, assign, make_session, push, snapshot, until

HEAD, TAIL, LATE = 7, 8, 9


def cred(worker_id: int, version: int, expires: int) -> str:
    return credentials.issue(SECRET, job_id=1, worker_id=worker_id, lowest=version, highest=version, expires=expires)


def expiry(server: SnapshotServer, version: int) -> int:
    """When ``version``'s credentials expire: fixed once per published version, as the site's announcement fixes it,
    so a parent's word for its child's credential and the credential the child gets later agree to the byte."""
    return int((version_dir(server.store.root, version) / MANIFEST).stat().st_mtime) + 600


def chained(manifest, server: SnapshotServer, *, worker_id: int, parent: str, parent_worker_id: int | None,
            children: list[int]) -> m.SnapshotAvailable:
    """What the site sends a worker of the chain plan learner -> HEAD -> TAIL."""
    sha256, size = manifest_reference(manifest)
    expires = expiry(server, manifest.version)
    return m.SnapshotAvailable(job_id=1, version=manifest.version, manifest_sha256=sha256, manifest_bytes=size,
                               url=server.url_for(manifest.version), published_at=time.time(), parent=parent,
                               parent_worker_id=parent_worker_id, children=children,
                               credential=cred(worker_id, manifest.version, expires),
                               child_credential_sha256={c: credentials.fingerprint(cred(c, manifest.version, expires))
                                                        for c in children})


def offered(manifest, server: SnapshotServer, *, worker_id: int) -> m.SnapshotAvailable:
    """What the site sends a worker with no place in a chain (it fetches over HTTP)."""
    sha256, size = manifest_reference(manifest)
    return m.SnapshotAvailable(job_id=1, version=manifest.version, manifest_sha256=sha256, manifest_bytes=size,
                               url=server.url_for(manifest.version), published_at=time.time(),
                               credential=cred(worker_id, manifest.version, expiry(server, manifest.version)))


def chain_of_agents(tmp_path) -> dict:
    """HEAD, TAIL and LATE: three agent sessions (session, socket), each with a relay hub of its own to listen on."""
    sessions = {}
    for worker_id in (HEAD, TAIL, LATE):
        session, socket = make_session(tmp_path / f"agent{worker_id}", [])
        session.config = dataclasses.replace(session.config, worker_id=worker_id)
        session.relaying.worker_id, session.relaying.listen = worker_id, f"127.0.0.1:{free_port()}"
        sessions[worker_id] = session, socket
    return sessions


async def join(session, store: SnapshotStore, server: SnapshotServer, base, *, worker: str) -> None:
    """Assign ``session`` to job 1 and wait until its engine is built from the base."""
    await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
    await until(lambda: session.installs.ready(1), f"{worker}'s base")


async def down_the_chain(sessions: dict, manifest, server: SnapshotServer, relay_address: str) -> None:
    """Send ``manifest``'s version down learner -> HEAD -> TAIL, and wait until both installed it."""
    version = manifest.version
    await push(sessions[HEAD][0], chained(manifest, server, worker_id=HEAD, parent=relay_address,
                                          parent_worker_id=None, children=[TAIL]))
    await push(sessions[TAIL][0], chained(manifest, server, worker_id=TAIL, parent=sessions[HEAD][0].relaying.listen,
                                          parent_worker_id=HEAD, children=[]))
    await until(lambda: all(sessions[w][0].installs.installed_version(1) == version for w in (HEAD, TAIL)),
                f"v{version} on both agents")


async def stop_all(sessions: dict) -> None:
    for session, _ in sessions.values():
        session._stop_rollout()
        if session.relaying.hub is not None:
            await session.relaying.hub.close()


def engine_holds(session, expected: dict[str, torch.Tensor]) -> bool:
    """The engine's weights are the learner's bf16 cast, bit for bit (the HF engine keeps them in fp32)."""
    held = publishable_state(session.installs.job.engine.model)
    return all(torch.equal(held[k].to(torch.bfloat16).view(torch.int16), v.view(torch.int16))
               and torch.equal(held[k], v.float()) for k, v in expected.items())


@pytest.mark.parametrize("mode", RELAY_MODES)
def test_deltas_travel_a_chain_as_they_are_and_install_bit_for_bit(tmp_path, tiny_model_dir, mode):
    store = SnapshotStore(tmp_path / "snapshots", job_id=1, chunk_bytes=16_384)
    server, relay = SnapshotServer(store).start(), LearnerRelay(store, uplink_bps=None, mode=mode)
    server.set_secret(SECRET)
    relay.set_secret(SECRET)
    base = store.write_base(tiny_model_dir)
    learner = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    published = []

    def publish(version: int, scale: float):
        with torch.no_grad():
            for parameter in learner.parameters():  # a small step: a few weights move by an ulp or two
                parameter.add_(torch.randn_like(parameter) * scale * parameter.abs().mean())
        manifest = store.write(learner, version)
        relay.serve(version)
        published.append((manifest, {k: v.to(torch.bfloat16) for k, v in publishable_state(learner).items()}))
        return manifest

    async def scenario() -> None:
        sessions = chain_of_agents(tmp_path)
        for worker_id in (HEAD, TAIL):  # one after the other: from_pretrained in two threads at once trips on itself
            await join(sessions[worker_id][0], store, server, base, worker=f"worker {worker_id}")
        for version, scale in ((1, 1e-2), (2, 1e-3), (3, 1e-3)):
            manifest = publish(version, scale)
            await down_the_chain(sessions, manifest, server, relay.address)
            for worker_id in (HEAD, TAIL):
                assert engine_holds(sessions[worker_id][0], published[-1][1]), (worker_id, version)
        kinds = [manifest.kind for manifest, _ in published]
        assert kinds == ["full", "delta", "delta"]
        installs = [(r["version"], r["source"]) for r in sessions[TAIL][1].of("snapshot_installed")]
        assert installs == [(0, "http"), (1, "parent"), (2, "parent"), (3, "parent")]
        tail_relay = sessions[TAIL][0].relaying.relays[(1, 3)]
        assert tail_relay.manifest.kind == "delta" and tail_relay.stats.from_fallback == 0

        late, late_socket = sessions[LATE]  # joins now: holds the base, not v2, so v3's delta is of no use to it
        await join(late, store, server, base, worker="the late agent")
        await push(late, offered(published[-1][0], server, worker_id=LATE))
        await until(lambda: late.installs.installed_version(1) == 3, "v3 on the late agent")
        assert engine_holds(late, published[-1][1]) and late.installs.job.held.manifest == published[-1][0].full
        assert [(r["version"], r["source"]) for r in late_socket.of("snapshot_installed")] == [(0, "http"), (3, "http")]
        await stop_all(sessions)

    try:
        asyncio.run(scenario())
    finally:
        relay.stop()
        server.stop()


def test_a_late_agent_takes_the_newest_full_from_the_learners_store_then_follows_the_deltas(tmp_path,
                                                                                           tiny_model_dir):
    """Deltas on the wire, fulls from the cache (docs/broadcast.md): every version after the first is a delta. An
    agent joining at v3 takes v3's full payload from the learner's store (v3's delta is gone from the store here,
    so fetching it would fail the install), then installs v4 from its delta (v4's full is gone), bit for bit. It
    misses v5: v6's delta is never applied to the v4 it holds, and while v6's full cannot be had the engine keeps
    v4's weights and generates nothing; once it can, v6 installs whole."""
    store = SnapshotStore(tmp_path / "snapshots", job_id=1, chunk_bytes=16_384, keep=10)
    server = SnapshotServer(store).start()
    server.set_secret(SECRET)
    base = store.write_base(tiny_model_dir)
    learner = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    published = {}

    def publish(version: int):
        with torch.no_grad():
            for parameter in learner.parameters():
                parameter.add_(torch.randn_like(parameter) * 1e-3 * parameter.abs().mean())
        published[version] = (store.write(learner, version),
                              {k: v.to(torch.bfloat16) for k, v in publishable_state(learner).items()})
        return published[version][0]

    def offer(version: int) -> m.SnapshotAvailable:
        return offered(published[version][0], server, worker_id=LATE)

    async def scenario() -> None:
        assert [publish(v).kind for v in (1, 2, 3)] == ["full", "delta", "delta"]
        shutil.rmtree(version_dir(store.root, 3) / CHUNKS)  # v3's delta: of no use to an agent holding the base
        late, socket = make_session(tmp_path / "late", [])
        late.config = dataclasses.replace(late.config, worker_id=LATE)
        await join(late, store, server, base, worker="the late agent")
        await push(late, offer(3))
        await until(lambda: late.installs.installed_version(1) == 3, "v3 from the learner's store")
        assert engine_holds(late, published[3][1]) and late.installs.job.held.manifest == published[3][0].full

        assert publish(4).kind == "delta"
        shutil.rmtree(version_dir(store.root, 4) / FULL)  # only the delta can give v4 now
        await push(late, offer(4))
        await until(lambda: late.installs.installed_version(1) == 4, "v4 from its delta")
        assert engine_holds(late, published[4][1]) and late.installs.job.held.manifest == published[4][0].full

        publish(5)  # missed
        assert publish(6).kind == "delta" and published[6][0].base_version == 5
        cache = version_dir(store.root, 6) / FULL
        cache.rename(tmp_path / "v6-full")  # the learner's store cannot give v6's full for now
        await push(late, offer(6))
        await until(lambda: late.installs.wanted.get(1) == 6 and (1, 6) not in late.installs.installing,
                    "v6's install to fail")
        assert late.installs.installed_version(1) == 4 and not late.installs.ready(1)
        assert engine_holds(late, published[4][1]) and late.installs.job.held.manifest == published[4][0].full
        (tmp_path / "v6-full").rename(cache)
        await push(late, offer(6))  # the site's answer to the agent's request for the newest
        await until(lambda: late.installs.installed_version(1) == 6, "v6 whole")
        assert engine_holds(late, published[6][1]) and late.installs.ready(1)
        assert [(r["version"], r["source"]) for r in socket.of("snapshot_installed")] == [
            (0, "http"), (3, "http"), (4, "http"), (6, "http")]
        late._stop_rollout()

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
