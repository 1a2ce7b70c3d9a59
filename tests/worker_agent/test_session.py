"""The agent's per-job engine, driven message by message (a recording socket stands in for the site; snapshots
come from a real learner snapshot store over HTTP): nothing is generated before the job's base is installed or
on a version whose install failed, and a new job never inherits another job's engine."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from dataplane import messages as m
from dataplane.credentials import issue, new_secret
from learner.publisher import SnapshotServer, SnapshotStore, manifest_json
from worker_agent.cache import BaseCache
from worker_agent.config import AgentConfig
from worker_agent.engines import make_engine
from worker_agent.session import AgentSession

TASK = {"name": "arithmetic", "max_operand": 4}
SECRET = new_secret()


class RecordingSocket:
    """The site's end of the websocket: keeps what the agent sends."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    def of(self, kind: str) -> list[dict]:
        return [message for message in self.sent if message["type"] == kind]


async def until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
def learner_side(tmp_path, tiny_model_dir):
    """Two jobs' snapshot stores on one HTTP server, as a learner lays them out: v0 is the base archive."""
    store = SnapshotStore(tmp_path / "snapshots", job_id=1, chunk_bytes=16_384)
    server = SnapshotServer(store).start()
    server.set_secret(SECRET)
    yield store, server
    server.stop()


def snapshot(store: SnapshotStore, server: SnapshotServer, manifest, *, url: str | None = None) -> m.SnapshotAvailable:
    credential = issue(SECRET, job_id=manifest.job_id, worker_id=7, lowest=manifest.version,
                       highest=manifest.version, expires=int(time.time()) + 600)  # as the site issues it
    return m.SnapshotAvailable(job_id=manifest.job_id, version=manifest.version, manifest=manifest_json(manifest),
                               url=url or server.url_for(manifest.version), published_at=time.time(),
                               credential=credential)


def assign(job_id: int, base: m.SnapshotAvailable | None, *, digest: str | None = None) -> m.Assign:
    return m.Assign(job_id=job_id, model="/learner/only/path", task=TASK, group_size=2, max_new_tokens=2,
                    temperature=1.0, base_digest=digest, base=base.model_dump(mode="json") if base else None)


def make_session(tmp_path: Path, built: list[str]) -> tuple[AgentSession, RecordingSocket]:
    def factory(model_dir: str):
        built.append(model_dir)
        return make_engine("hf", model_dir, device="cpu", seed=0)

    config = AgentConfig(server="http://127.0.0.1:9", worker_id=7, name="rig", agent_key="k")
    session = AgentSession(config, engine_factory=factory, cache=BaseCache(tmp_path / "cache", max_bytes=10**9),
                           retry_delay=0.2)
    socket = RecordingSocket()
    session.ws = socket
    return session, socket


async def push(session: AgentSession, message: m._Msg) -> None:
    await session._dispatch(message.model_dump_json())


def answering(socket: RecordingSocket, reply: m._Msg) -> m._Msg:
    """``reply`` as the site sends it: naming the agent's latest lease request."""
    return reply.model_copy(update={"ref_id": socket.of("lease_request")[-1]["id"]})


def test_nothing_is_leased_before_the_base_is_installed_then_records_carry_version_0(tmp_path, learner_side,
                                                                                       tiny_model_dir):
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    built: list[str] = []

    async def scenario() -> None:
        session, socket = make_session(tmp_path, built)
        await push(session, assign(1, None))  # the learner has not published the base yet
        await until(lambda: socket.of("snapshot_request"), "the agent to ask for the base")
        await asyncio.sleep(0.5)
        assert socket.of("lease_request") == [] and built == []
        assert {r["which"] for r in socket.of("snapshot_request")} == {"base"}

        await push(session, snapshot(store, server, base))  # the site answers (or the learner publishes)
        await until(lambda: socket.of("lease_request"), "a lease request once the base is in")
        installed = socket.of("snapshot_installed")
        assert [(r["version"], r["source"]) for r in installed] == [(0, "http")]
        assert built == [str(tmp_path / "cache" / base.sha256)]  # built from the cache, not the learner's path

        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: socket.of("trajectories"), "a generated group")
        assert socket.of("trajectories")[0]["group"]["version"] == 0
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_failed_install_blocks_generation_until_the_site_gives_a_version_that_installs(tmp_path, learner_side,
                                                                                          tiny_model_dir):
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    v1 = store.write(model, 1)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: socket.of("lease_request"), "the first lease request")
        await push(session, snapshot(store, server, v1, url="http://127.0.0.1:9/v1/"))  # pruned, or down: fails
        await until(lambda: session.wanted.get(1) == 1, "the failed install to be noted")
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=0.05)))  # the pending request's answer
        await until(lambda: any(r["which"] == "newest" for r in socket.of("snapshot_request")),
                    "the agent to ask for the newest version")
        leases = len(socket.of("lease_request"))
        await asyncio.sleep(0.5)
        assert len(socket.of("lease_request")) == leases, "leased while its newest version failed to install"

        await push(session, snapshot(store, server, v1))  # the site's answer: the newest, which exists
        await until(lambda: len(socket.of("lease_request")) > leases, "leasing again once v1 is installed")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l2", group_id="g2", prompt="3+4=")])
        await push(session, answering(socket, lease))
        await until(lambda: socket.of("trajectories"), "a generated group")
        assert socket.of("trajectories")[0]["group"]["version"] == 1
        assert session.job.engine.model.model.norm.weight.detach().equal(model.model.norm.weight.detach())
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_new_job_on_the_same_base_gets_a_fresh_engine_from_the_cache(tmp_path, learner_side, tiny_model_dir):
    store, server = learner_side
    base1 = store.write_base(tiny_model_dir)
    other = SnapshotStore(store.root.parent / "job2", job_id=2, chunk_bytes=16_384)
    base2 = other.write_base(tiny_model_dir)
    assert base2.sha256 == base1.sha256  # the same directory: the same digest, whatever the job
    built: list[str] = []

    async def scenario() -> None:
        session, socket = make_session(tmp_path, built)
        await push(session, assign(1, snapshot(store, server, base1), digest=base1.sha256))
        await until(lambda: session.ready(1), "job 1's base")
        first = session.job
        with torch.no_grad():  # job 1 trained its engine
            first.engine.model.model.norm.weight.add_(5.0)
        first.version = 3
        unreachable = snapshot(other, server, base2, url="http://127.0.0.1:9/v0/")  # the cache has it
        await push(session, assign(2, unreachable, digest=base2.sha256))
        await until(lambda: session.ready(2), "job 2's base")
        assert session.job is not first and session.job.job_id == 2 and session.job.version == 0
        assert session.installed_version(1) is None
        fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        assert session.job.engine.model.model.norm.weight.detach().equal(fresh.model.norm.weight.detach())
        assert [(r["job_id"], r["source"]) for r in socket.of("snapshot_installed")] == [(1, "http"), (2, "cache")]
        session._stop_rollout()

    asyncio.run(scenario())
    assert len(built) == 2  # job 2's engine was built, not inherited


def test_a_base_that_is_not_the_jobs_digest_is_refused(tmp_path, learner_side, tiny_model_dir):
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    built: list[str] = []

    async def scenario() -> None:
        session, socket = make_session(tmp_path, built)
        await push(session, assign(1, snapshot(store, server, base), digest="0" * 64))
        await until(lambda: socket.of("snapshot_request"), "the agent to ask again")
        assert built == [] and socket.of("lease_request") == [] and socket.of("snapshot_installed") == []
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_late_reply_is_discarded_by_id_and_a_dead_rollout_loop_restarts(tmp_path, learner_side, tiny_model_dir,
                                                                          monkeypatch):
    """An agent frozen past its reply timeout (SIGSTOP, then SIGCONT): its request is given up, the rollout
    loop restarts, and the reply that finally comes names the old request: it is discarded, not taken as
    the answer to the new one (replies were once paired by arrival order)."""
    import worker_agent.session as session_module

    monkeypatch.setattr(session_module, "REPLY_TIMEOUT_S", 0.5)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: socket.of("lease_request"), "the first lease request")
        first = socket.of("lease_request")[0]["id"]
        await until(lambda: len(socket.of("lease_request")) >= 2, "the loop to give up and start again", 10)
        assert session.rollout_failures >= 1
        second = socket.of("lease_request")[-1]["id"]
        assert second != first
        late = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="old", group_id="g0", prompt="1+1=")])
        await push(session, late.model_copy(update={"ref_id": first}))  # the answer to the abandoned request
        fresh = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="new", group_id="g1", prompt="2+2=")])
        await push(session, answering(socket, fresh))
        await until(lambda: socket.of("trajectories"), "a generated group")
        assert [t["group"]["lease_id"] for t in socket.of("trajectories")] == ["new"]
        session._stop_rollout()

    asyncio.run(scenario())
