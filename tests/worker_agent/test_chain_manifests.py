"""The manifest down the chain, through real agents: a learner (its snapshot store, HTTP server and relay hub in a
process of its own) and agent sessions with relay hubs on loopback, a recording socket for the site. A chain's head
takes each version's manifest from the learner's hub in its ``accept``, its child from the head: the learner's HTTP
server (counting what it sends) serves no manifest for the version. A parent that sends another manifest is
refused and reported, and its child still installs, with the manifest it fetched itself."""

from __future__ import annotations

import asyncio

import torch
from transformers import AutoModelForCausalLM

from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.store import read_version, version_dir
from learner.serving import LearnerRelay, SnapshotServer
from learner.snapshots import SnapshotStore
from tests.dataplane.broadcast.test_manifest_down_chain import ForgingRelay

from .test_deltas import HEAD, TAIL, chain_of_agents, chained, down_the_chain, join, stop_all
from .test_session import SECRET, assign, push, until


def learner(tmp_path) -> tuple[SnapshotStore, SnapshotServer, LearnerRelay]:
    store = SnapshotStore(tmp_path / "snapshots", job_id=1, chunk_bytes=16_384)
    server, relay = SnapshotServer(store).start(), LearnerRelay(store, uplink_bps=None)
    server.set_secret(SECRET)
    relay.set_secret(SECRET)
    return store, server, relay


def trained(tiny_model_dir, shift: float):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight.add_(shift)
    return model


def test_a_chain_takes_each_manifest_from_its_parents_and_the_learner_serves_none_over_http(tmp_path,
                                                                                          tiny_model_dir):
    store, server, relay = learner(tmp_path)
    base = store.write_base(tiny_model_dir)
    relay.serve(0)

    async def scenario() -> None:
        sessions = chain_of_agents(tmp_path)
        # The base down the chain: the head has nothing cached, the tail holds it and serves nothing from the
        # learner; each after the other (from_pretrained in two threads at once trips on itself).
        payload = b"".join(read_version(version_dir(store.root, 0))[1].values())
        sessions[TAIL][0].installs.cache.put(base.sha256, payload)
        for worker_id, parent, parent_id, children in ((HEAD, relay.address, None, [TAIL]),
                                                       (TAIL, sessions[HEAD][0].relaying.listen, HEAD, [])):
            session = sessions[worker_id][0]
            await push(session, assign(1, None, digest=base.sha256))
            await push(session, chained(base, server, worker_id=worker_id, parent=parent, parent_worker_id=parent_id,
                                        children=children))
            await until(lambda session=session: session.installs.ready(1), f"worker {worker_id}'s base", timeout=60)
        assert server.served["manifest"] == 0, server.served

        v1 = store.write(trained(tiny_model_dir, 1.0), 1)
        relay.serve(1)
        await down_the_chain(sessions, v1, server, relay.address)
        assert server.served["manifest"] == 0, server.served  # neither the head nor its child asked the learner
        assert server.served["chunk"] == 0, server.served
        for worker_id in (HEAD, TAIL):
            session, socket = sessions[worker_id]
            assert session.installs.manifests.fetched == 0
            assert session.installs.manifests.relayed == 2  # v0's and v1's, from the parent
            assert session.relaying.relays[(1, 1)].manifest_from == "parent"
            assert [(r["version"], r["source"]) for r in socket.of("snapshot_installed")] == [
                (0, "parent" if worker_id == HEAD else "cache"), (1, "parent")]
            assert not socket.of("relay_failed")
        assert relay.served()[1].manifests_sent == 1  # to the head: the learner's hub sent it once per chain
        assert sessions[HEAD][0].relaying.relays[(1, 1)].stats.manifests_sent == 1
        await stop_all(sessions)

    try:
        asyncio.run(scenario())
    finally:
        relay.stop()
        server.stop()


def test_a_parent_that_sends_another_manifest_is_reported_and_its_child_installs_with_its_own_fetch(
        tmp_path, tiny_model_dir):
    store, server, relay = learner(tmp_path)
    base = store.write_base(tiny_model_dir)
    model = trained(tiny_model_dir, 2.0)
    v1 = store.write(model, 1)

    async def scenario() -> None:
        sessions = chain_of_agents(tmp_path)
        tail, socket = sessions[TAIL]
        await join(tail, store, server, base, worker="the tail")  # the base over HTTP: one manifest fetched
        assert tail.installs.manifests.fetched == 1 and server.served["manifest"] == 1
        _, chunks = read_version(version_dir(store.root, 1))
        liar = ForgingRelay(v1, chunks=chunks, worker_id=HEAD, secret=SECRET)  # every chunk right, not the manifest
        hub = RelayHub()
        hub.register(liar)
        port = await hub.start("127.0.0.1", 0)
        await push(tail, chained(v1, server, worker_id=TAIL, parent=f"127.0.0.1:{port}", parent_worker_id=HEAD,
                                 children=[]))
        await until(lambda: tail.installs.installed_version(1) == 1, "v1 on the tail", timeout=60)
        assert tail.installs.job.engine.model.model.norm.weight.detach().equal(model.model.norm.weight.detach())
        reports = socket.of("relay_failed")
        assert [(r["version"], r["culprit_worker_id"]) for r in reports] == [(1, HEAD)], reports
        assert "refused: it hashes to" in reports[0]["reason"], reports
        received = tail.relaying.relays[(1, 1)]
        assert received.manifest_from == "fallback" and received.stats.manifests_refused == 1
        assert tail.installs.manifests.fetched == 2 and server.served["manifest"] == 2  # v1's, its own fetch
        assert [(r["version"], r["source"]) for r in socket.of("snapshot_installed")] == [(0, "http"),
                                                                                         (1, "fallback")]
        await hub.close()
        await stop_all(sessions)

    try:
        asyncio.run(scenario())
    finally:
        relay.stop()
        server.stop()
