"""Deltas through real agents: a learner relay feeds a chain of two agent sessions (real relay hubs on loopback, a
recording socket for the site); each version published as a delta travels the chain as it is, the head forwarding
it to its child, and both install the learner's bf16 weights bit for bit. An agent that lacks the delta's base
(it joined late) fetches the version's full payload over HTTP instead."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import torch
from transformers import AutoModelForCausalLM

from dataplane import credentials
from dataplane import messages as m
from echo2_site.demo import free_port
from learner.publisher import LearnerRelay, SnapshotServer, SnapshotStore, manifest_json
from learner.snapshots import publishable_state

from .test_session import SECRET, assign, make_session, push, snapshot, until

HEAD, TAIL, LATE = 7, 8, 9


def cred(worker_id: int, version: int) -> str:
    return credentials.issue(SECRET, job_id=1, worker_id=worker_id, lowest=version, highest=version,
                             expires=int(time.time()) + 600)


def chained(manifest, server: SnapshotServer, *, worker_id: int, parent: str, parent_worker_id: int | None,
            children: list[int]) -> m.SnapshotAvailable:
    """What the site sends a worker of the chain plan learner -> HEAD -> TAIL."""
    return m.SnapshotAvailable(job_id=1, version=manifest.version, manifest=manifest_json(manifest),
                               url=server.url_for(manifest.version), published_at=time.time(), parent=parent,
                               parent_worker_id=parent_worker_id, children=children,
                               credential=cred(worker_id, manifest.version),
                               child_credential_sha256={c: credentials.fingerprint(cred(c, manifest.version))
                                                        for c in children})


def engine_holds(session, expected: dict[str, torch.Tensor]) -> bool:
    """The engine's weights are the learner's bf16 cast, bit for bit (the HF engine keeps them in fp32)."""
    held = publishable_state(session.job.engine.model)
    return all(torch.equal(held[k].to(torch.bfloat16).view(torch.int16), v.view(torch.int16))
               and torch.equal(held[k], v.float()) for k, v in expected.items())


def test_deltas_travel_a_chain_as_they_are_and_install_bit_for_bit(tmp_path, tiny_model_dir):
    store = SnapshotStore(tmp_path / "snapshots", job_id=1, chunk_bytes=16_384)
    server, relay = SnapshotServer(store).start(), LearnerRelay(store, uplink_bps=None)
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
        sessions = {}
        for worker_id in (HEAD, TAIL, LATE):
            session, socket = make_session(tmp_path / f"agent{worker_id}", [])
            session.config = dataclasses.replace(session.config, worker_id=worker_id)
            session.relaying.worker_id, session.relaying.listen = worker_id, f"127.0.0.1:{free_port()}"
            sessions[worker_id] = session, socket
        for worker_id in (HEAD, TAIL):  # one after the other: from_pretrained in two threads at once trips on itself
            await push(sessions[worker_id][0], assign(1, snapshot(store, server, base), digest=base.sha256))
            await until(lambda w=worker_id: sessions[w][0].ready(1), f"worker {worker_id}'s base")
        head_address = sessions[HEAD][0].relaying.listen
        for version, scale in ((1, 1e-2), (2, 1e-3), (3, 1e-3)):
            manifest = publish(version, scale)
            await push(sessions[HEAD][0], chained(manifest, server, worker_id=HEAD, parent=relay.address,
                                                  parent_worker_id=None, children=[TAIL]))
            await push(sessions[TAIL][0], chained(manifest, server, worker_id=TAIL, parent=head_address,
                                                  parent_worker_id=HEAD, children=[]))
            await until(lambda v=version: all(sessions[w][0].installed_version(1) == v for w in (HEAD, TAIL)),
                        f"v{version} on both agents")
            for worker_id in (HEAD, TAIL):
                assert engine_holds(sessions[worker_id][0], published[-1][1]), (worker_id, version)
        kinds = [manifest.kind for manifest, _ in published]
        assert kinds == ["full", "delta", "delta"]
        installs = [(r["version"], r["source"]) for r in sessions[TAIL][1].of("snapshot_installed")]
        assert installs == [(0, "http"), (1, "parent"), (2, "parent"), (3, "parent")]
        tail_relay = sessions[TAIL][0].relays[(1, 3)]
        assert tail_relay.manifest.kind == "delta" and tail_relay.stats.from_fallback == 0

        late, late_socket = sessions[LATE]  # joins now: holds the base, not v2, so v3's delta is of no use to it
        await push(late, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: late.ready(1), "the late agent's base")
        await push(late, m.SnapshotAvailable(job_id=1, version=3, manifest=manifest_json(published[-1][0]),
                                             url=server.url_for(3), published_at=time.time(), credential=cred(LATE, 3)))
        await until(lambda: late.installed_version(1) == 3, "v3 on the late agent")
        assert engine_holds(late, published[-1][1]) and late.job.held.manifest == published[-1][0].full
        assert [(r["version"], r["source"]) for r in late_socket.of("snapshot_installed")] == [(0, "http"), (3, "http")]
        for session, _ in sessions.values():
            session._stop_rollout()
            if session.hub is not None:
                await session.hub.close()

    try:
        asyncio.run(scenario())
    finally:
        relay.stop()
        server.stop()
