"""The agent's per-job engine, driven message by message (a recording socket stands in for the site; snapshots
come from a real learner snapshot store over HTTP): nothing is generated before the job's base is installed or
on a version whose install failed, and a new job never inherits another job's engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from dataplane import messages as m
from dataplane.credentials import issue, new_secret
from dataplane.dataset import content
from dataplane.snapshot import manifest_reference
from learner.datasets import lay_out
from learner.serving import SnapshotServer
from learner.snapshots import SnapshotStore
from worker_agent import rollout_loop, status
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
        self.frames: list[str] = []  # as sent, for their size

    async def send(self, text: str) -> None:
        self.frames.append(text)
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


def sums_data_set(directory: Path, *, answer_column: str = "a") -> Path:
    """A job owner's data set: ``train.jsonl``, the nine sums of 0..2 ("q": "1+2=", ``answer_column``: "3")."""
    directory.mkdir()
    (directory / "train.jsonl").write_text("".join(f'{{"q": "{a}+{b}=", "{answer_column}": "{a + b}"}}\n'
                                                   for a in range(3) for b in range(3)))
    return directory


def served(store: SnapshotStore, path: Path) -> str:
    """``path`` (a data set or code package) laid out in the learner's store, as the learner serves it: its digest."""
    digest = content.digest(path)
    lay_out(store.root, digest, content.pack(path), job_id=1, chunk_bytes=256)
    return digest


def snapshot(store: SnapshotStore, server: SnapshotServer, manifest, *, url: str | None = None) -> m.SnapshotAvailable:
    credential = issue(SECRET, job_id=manifest.job_id, worker_id=7, lowest=manifest.version,
                       highest=manifest.version, expires=int(time.time()) + 600)  # as the site issues it
    sha256, size = manifest_reference(manifest)  # the manifest by reference, as the site sends it
    return m.SnapshotAvailable(job_id=manifest.job_id, version=manifest.version, manifest_sha256=sha256,
                               manifest_bytes=size, url=url or server.url_for(manifest.version),
                               published_at=time.time(), credential=credential)


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
    session.connection.attach(socket)
    session.connection.welcomed.set()  # as if the site had welcomed it
    return session, socket


async def push(session: AgentSession, message: m._Msg) -> None:
    await session._dispatch(message.model_dump_json())


def submits(socket: RecordingSocket, *, leasing: bool | None = None) -> list[dict]:
    """The ``submit`` requests sent (``leasing``: only those that ask for a lease, or only those that do not)."""
    return [s for s in socket.of("submit") if leasing is None or bool(s["lease"]) == leasing]


def returned(socket: RecordingSocket) -> list[dict]:
    """The groups the agent returned, in order."""
    return [group for s in socket.of("submit") for group in s["groups"]]


def answering(socket: RecordingSocket, lease: m.Lease | m.NoWork | None = None, *, accept: bool = True,
              request: dict | None = None) -> m.Submitted:
    """The site's reply to the agent's latest submit (or ``request``): each group it returned accepted (or refused
    when not ``accept``), and ``lease`` for what it asked."""
    request = request or socket.of("submit")[-1]
    results = [m.Accepted(job_id=g["job_id"], lease_id=g["lease_id"], accepted=len(g["records"]) if accept else 0,
                          rejected=0 if accept else len(g["records"]), reasons=[] if accept else ["refused"])
               for g in request["groups"]]
    return m.Submitted(job_id=request["job_id"], results=results, lease=lease, ref_id=request["id"])


async def answer_each(session: AgentSession, socket: RecordingSocket, reply: m.NoWork, done, what: str,
                      timeout: float = 30.0) -> None:
    """Answer every submit not answered yet (the latest, and each one after it) with ``reply``, until ``done()``."""
    answered = {s["id"] for s in submits(socket)[:-1]}
    deadline = time.monotonic() + timeout
    while not done():
        for request in submits(socket):
            if request["id"] not in answered:
                answered.add(request["id"])
                await push(session, answering(socket, reply, request=request))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def generating(tmp_path: Path, store: SnapshotStore, server: SnapshotServer, base) -> tuple:
    """A session assigned to job 1 whose first lease ("1+2=") was generated and is being returned."""
    session, socket = make_session(tmp_path, [])
    await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
    await until(lambda: submits(socket), "the first lease request")
    lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
    await push(session, answering(socket, lease))
    await until(lambda: returned(socket), "a generated group")
    return session, socket


def test_nothing_is_leased_before_the_base_is_installed_then_records_carry_version_0(tmp_path, learner_side,
                                                                                       tiny_model_dir, monkeypatch):
    monkeypatch.setattr(rollout_loop, "UNPUBLISHED_BASE_WAIT_S", 0.2)  # the announcement is lost: it asks soon
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    built: list[str] = []

    async def scenario() -> None:
        session, socket = make_session(tmp_path, built)
        await push(session, assign(1, None))  # the learner has not published the base yet
        await until(lambda: socket.of("snapshot_request"), "the agent to ask for the base")
        await asyncio.sleep(0.5)
        assert submits(socket) == [] and built == []
        assert {r["which"] for r in socket.of("snapshot_request")} == {"base"}

        await push(session, snapshot(store, server, base))  # the site answers (or the learner publishes)
        await until(lambda: submits(socket), "a lease request once the base is in")
        installed = socket.of("snapshot_installed")
        assert [(r["version"], r["source"]) for r in installed] == [(0, "http")]
        assert built == [str(tmp_path / "cache" / base.sha256)]  # built from the cache, not the learner's path

        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        assert returned(socket)[0]["version"] == 0
        assert submits(socket)[-1]["lease"] >= 1  # the next lease rides on the groups' return
        session._stop_rollout()

    asyncio.run(scenario())


def test_an_agent_assigned_before_the_base_waits_for_its_announcement_before_asking(tmp_path, learner_side,
                                                                                    tiny_model_dir):
    """The assignment said the learner has not published the base: the agent does not ask the site for it at once
    (a fleet assigned together would all ask what the site just said it lacks), and the announcement installs it."""
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])  # its first ask: 7.5 to 15 s after this
        await push(session, assign(1, None))
        await asyncio.sleep(1.0)
        assert socket.of("snapshot_request") == [] and submits(socket) == []

        await push(session, snapshot(store, server, base))  # the learner publishes: the group's announcement
        await until(lambda: submits(socket), "a lease request once the base is in")
        assert [r["version"] for r in socket.of("snapshot_installed")] == [0]
        assert socket.of("snapshot_request") == []
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
        await until(lambda: submits(socket), "the first lease request")
        await push(session, snapshot(store, server, v1, url="http://127.0.0.1:9/v1/"))  # pruned, or down: fails
        await until(lambda: session.installs.wanted.get(1) == 1, "the failed install to be noted")
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=0.05)))  # the pending request's answer
        await until(lambda: any(r["which"] == "newest" for r in socket.of("snapshot_request")),
                    "the agent to ask for the newest version")
        leases = len(submits(socket))
        await asyncio.sleep(0.5)
        assert len(submits(socket)) == leases, "leased while its newest version failed to install"

        await push(session, snapshot(store, server, v1))  # the site's answer: the newest, which exists
        await until(lambda: len(submits(socket)) > leases, "leasing again once v1 is installed")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l2", group_id="g2", prompt="3+4=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        assert returned(socket)[0]["version"] == 1
        assert session.installs.job.engine.model.model.norm.weight.detach().equal(model.model.norm.weight.detach())
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
        await until(lambda: session.installs.ready(1), "job 1's base")
        first = session.installs.job
        with torch.no_grad():  # job 1 trained its engine
            first.engine.model.model.norm.weight.add_(5.0)
        first.version = 3
        unreachable = snapshot(other, server, base2, url="http://127.0.0.1:9/v0/")  # the cache has it
        await push(session, assign(2, unreachable, digest=base2.sha256))
        await until(lambda: session.installs.ready(2), "job 2's base")
        job = session.installs.job
        assert job is not first and job.job_id == 2 and job.version == 0
        assert session.installs.installed_version(1) is None
        fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        assert session.installs.job.engine.model.model.norm.weight.detach().equal(fresh.model.norm.weight.detach())
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
        assert built == [] and submits(socket) == [] and socket.of("snapshot_installed") == []
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_reply_that_never_comes_sends_the_request_again_and_a_late_one_is_discarded(tmp_path, learner_side,
                                                                                      tiny_model_dir, monkeypatch):
    """An agent whose request gets no reply (the site froze, or the agent did, SIGSTOP then SIGCONT) sends the same
    request again under the same id; past the request's deadline the loop gives up and starts again under a new
    id, and the reply that finally comes names the old request: it is discarded, not taken as the answer to the
    new one (replies were once paired by arrival order)."""
    import worker_agent.rollout_loop as rollout_loop
    import worker_agent.timing as timing

    monkeypatch.setattr(timing, "REPLY_FLOOR_S", 0.3)  # the reply timeout's floor and ceiling: 0.3 s, whatever
    monkeypatch.setattr(timing, "REPLY_CEILING_S", 0.3)  # the round trips measured
    monkeypatch.setattr(rollout_loop, "LEASE_DEADLINE_S", 1.0)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request")
        first = submits(socket)[0]["id"]
        await until(lambda: len(submits(socket)) >= 2, "the same request again")
        assert submits(socket)[1]["id"] == first and session.connection.resent >= 1
        await until(lambda: submits(socket)[-1]["id"] != first, "the loop to give up and start again", 10)
        assert session.rollout.failures >= 1
        late = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="old", group_id="g0", prompt="1+1=")])
        await push(session, m.Submitted(job_id=1, lease=late, ref_id=first))  # the answer to the abandoned request
        fresh = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="new", group_id="g1", prompt="2+2=")])
        await push(session, answering(socket, fresh))
        await until(lambda: returned(socket), "a generated group")
        assert [g["lease_id"] for g in returned(socket)] == ["new"]
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_refused_request_is_sent_again_after_retry_after_under_its_id_and_its_groups_counted_once(
        tmp_path, learner_side, tiny_model_dir):
    """The site refused a submit for its rate budget (unread, nothing applied): the agent holds every send for
    ``retry_after``, then sends the same request, groups and all, under the same id; the group is counted once."""
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = await generating(tmp_path, store, server, base)
        refused = submits(socket)[-1]
        await push(session, m.Rejected(reason="rate limit", ref="submit", ref_id=refused["id"], retry_after=0.4))
        refused_at = time.monotonic()
        await until(lambda: len(submits(socket)) > 2, "the same request again")
        assert time.monotonic() - refused_at >= 0.35
        again = submits(socket)[-1]
        assert again == refused and session.connection.refused == 1
        await push(session, answering(socket, m.NoWork(job_id=1, retry_after=30)))
        await until(lambda: session.rollout.generated == 2, "the group counted")
        await asyncio.sleep(0.2)
        assert session.rollout.generated == 2 and session.tally.groups == 1
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_request_cut_off_by_a_lost_connection_goes_again_once_the_agent_is_back(tmp_path, learner_side,
                                                                                   tiny_model_dir):
    """The socket closes while a batch of groups waits for its reply: the rollout loop is not stopped and the
    groups are not dropped; once a new socket is welcomed, the same request goes on it."""
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = await generating(tmp_path, store, server, base)
        pending = submits(socket)[-1]
        session.connection.detach()  # the connection is lost
        await asyncio.sleep(0.3)
        second = RecordingSocket()
        session.connection.attach(second)
        await push(session, m.Welcome(worker_id=7, messages_per_s=50, message_burst=200))
        await until(lambda: second.of("submit"), "the request on the new socket")
        assert second.of("submit")[0] == pending
        assert session.rollout_task is not None and not session.rollout_task.done()
        session._stop_rollout()

    asyncio.run(scenario())


class CrashingOnce:
    """A real engine whose first batch dies, as a CUDA error or an engine bug kills a rollout loop."""

    def __init__(self, engine) -> None:
        self.engine, self.crashes = engine, 1

    def generate(self, *args, **kwargs):
        if self.crashes:
            self.crashes -= 1
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.engine.generate(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.engine, name)


def test_a_crashed_rollout_loop_reports_failed_restarts_and_reports_generating_once_it_delivers(
        tmp_path, learner_side, tiny_model_dir):
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    def states() -> list[tuple[str, str]]:
        return [(h["state"], h["reason"]) for h in socket.of("heartbeat")]

    async def scenario() -> None:
        nonlocal socket
        session, socket = make_session(tmp_path, [])
        session.installs.engine_factory = lambda model_dir: CrashingOnce(make_engine("hf", model_dir, device="cpu",
                                                                                     seed=0))
        session.heartbeat_interval = 0.2
        heartbeats = asyncio.create_task(session._heartbeats())
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: any(state == "failed" for state, _ in states()), "a heartbeat saying the loop failed")
        reason = next(reason for state, reason in states() if state == "failed")
        assert reason == "RuntimeError: CUDA error: an illegal memory access was encountered"
        await until(lambda: len(submits(socket)) == 2, "the supervisor to restart the loop")
        assert session.rollout.failures == 1 and session.state() == "failed"  # not working again yet

        again = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l2", group_id="g2", prompt="2+2=")])
        await push(session, answering(socket, again))
        await until(lambda: returned(socket), "a generated group")
        more = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l3", group_id="g3", prompt="3+3=")])
        await push(session, answering(socket, more))  # l2 accepted, and the next lease
        await until(lambda: states()[-1] == ("generating", ""), "a heartbeat saying it generates again")
        # l3 generates while the next lease is asked for ahead, then its group goes back: the site has no more work
        await answer_each(session, socket, m.NoWork(job_id=1, retry_after=30),
                          lambda: "l3" in [g["lease_id"] for g in returned(socket)] and states()[-1] == ("idle", ""),
                          "l3's group returned and a heartbeat saying it has nothing to do")
        heartbeats.cancel()
        session._stop_rollout()

    socket = None
    asyncio.run(scenario())


def test_taking_a_lease_reports_generating_before_the_groups_it_bills_however_short_the_burst(
        tmp_path, learner_side, tiny_model_dir):
    """A burst of work shorter than the least gap between heartbeats is still billed: "generating" goes out on
    the lease (no heartbeat loop runs here, and the last report said "loading" a moment ago)."""
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> list[str]:
        session, socket = make_session(tmp_path, [])
        session.heartbeat_interval = 3600.0
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request")
        session.last_beat = ("loading", time.monotonic())  # reported just now: a plain change would wait
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        session._stop_rollout()
        return [f"{x['type']}:{x.get('state', len(x.get('groups', [])))}" for x in socket.sent
                if x["type"] in ("heartbeat", "submit")]

    assert asyncio.run(scenario()) == ["submit:0", "heartbeat:generating", "submit:1"]


def test_the_rollout_loop_sends_a_group_over_the_sites_limit_in_parts_and_counts_the_one_reply(tmp_path, learner_side,
                                                                                                tiny_model_dir):
    """The limit comes with the welcome; a generated group over it goes as ``trajectories_part`` frames under one
    request id, each under the limit, which join into the group the loop generated (the site's assembler)."""
    from marketplace.core.assembly import GroupAssembler, JobLimits

    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    limit = 560  # a group of 2 records of 2 tokens is about 600 bytes; one record and a part's header fit

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, m.Welcome(worker_id=7, max_message_bytes=limit))
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "a lease request once the base is in")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: len(socket.of("trajectories_part")) == 2, "the group's two parts")
        parts = socket.of("trajectories_part")
        assert returned(socket) == [] and all(len(text.encode()) <= limit for text in socket.frames)
        assembler, limits = GroupAssembler(), JobLimits(group_size=2, max_bytes=10**6, timeout_s=30)
        joined = [assembler.add(m.TrajectoriesPart.model_validate(p), frame_bytes=limit, limits=limits, now=0.0)
                  for p in parts][-1]
        assert [r.lease_id for r in joined.records] == ["l1", "l1"] and joined.version == 0
        request_id = parts[0]["id"]
        assert parts[1]["id"] == request_id
        await push(session, m.Accepted(job_id=1, lease_id="l1", accepted=2, rejected=0, ref_id=request_id))
        await until(lambda: session.rollout.generated == 2, "the accepted group to be counted")
        session._stop_rollout()

    asyncio.run(scenario())


def test_a_batch_goes_back_in_one_frame_with_the_next_lease_and_each_group_is_counted_once(tmp_path, learner_side,
                                                                                             tiny_model_dir):
    """Three leased prompts come back as one ``submit`` that also asks for the next lease; the one reply's verdicts
    count each group once (a refused one not at all), and a repeated or unknown reply counts nothing."""
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "the first lease request")
        lease = m.Lease(job_id=1, timeout=30, leases=[
            m.LeasedPrompt(lease_id=f"l{i}", group_id=f"g{i}", prompt=f"{i}+2=") for i in range(3)])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "the batch")
        batch = submits(socket)[-1]
        assert [g["lease_id"] for g in batch["groups"]] == ["l0", "l1", "l2"] and batch["lease"] >= 1
        reply = answering(socket, m.NoWork(job_id=1, retry_after=30))
        reply.results[1] = m.Accepted(job_id=1, lease_id="l1", accepted=0, rejected=2, reasons=["lease expired"])
        await push(session, reply)
        await push(session, reply)  # again: its request is answered already
        await push(session, m.Submitted(job_id=1, results=reply.results, ref_id="r999"))  # unknown
        await until(lambda: session.rollout.generated == 4, "two groups counted")
        await asyncio.sleep(0.2)
        assert session.rollout.generated == 4 and session.tally.groups == 2
        session._stop_rollout()

    asyncio.run(scenario())


def test_the_session_says_each_change_and_idles_quietly(tmp_path, learner_side, tiny_model_dir, caplog, monkeypatch):
    """The real session and reporter, driven through: not activated, assigned and generating (its group not yet
    answered), no prompts to lease (the site answers every lease request "no work"), released. Every change is
    said; a 5 s idle stretch at a 2 s summary period gives at most three lines."""
    monkeypatch.setattr(status, "GENERATING_HOLD_S", 0.5)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "echo2.agent" and r.module == "status"]

    async def said(text: str) -> None:
        await until(lambda: any(text in line for line in lines()), repr(text), 20)

    async def no_work_to_every_request(session, socket) -> None:
        answered = 0
        while True:
            requests = submits(socket)
            if len(requests) > answered and session.connection.waiting.get(requests[-1]["id"]):
                await push(session, answering(socket, m.NoWork(job_id=1, retry_after=0.2)))
                answered = len(requests)
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        reporter = asyncio.create_task(status.report(session, every=2.0, poll=0.1))
        await said("idle: not activated (waiting for the scheduler to pick this machine)")

        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: submits(socket), "a lease request")
        lease = m.Lease(job_id=1, timeout=30, leases=[m.LeasedPrompt(lease_id="l1", group_id="g1", prompt="1+2=")])
        await push(session, answering(socket, lease))
        await until(lambda: returned(socket), "a generated group")
        await said("generating for job 1 under v0")  # its group is on the way: still generating

        nothing = asyncio.create_task(no_work_to_every_request(session, socket))
        await said("idle: job 1 has no prompts to lease")
        assert session.tally.groups == 1 and session.tally.tokens >= 2

        before = len(lines())
        await asyncio.sleep(5.0)
        window = lines()[before:]
        assert 1 <= len(window) <= 3, window
        assert all(line.startswith("idle: job 1 has no prompts") and ", for " in line for line in window), window

        await push(session, m.Release(job_id=1, reason="job paused"))
        await said("idle: not activated (released from job 1: job paused)")
        for task in (nothing, reporter):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        session._stop_rollout()

    with caplog.at_level(logging.INFO, logger="echo2.agent"):
        asyncio.run(scenario())
    said_in_order = [line.split(" (")[0].split(":")[0] for line in lines()]
    assert said_in_order[0] == "idle" and "generating for job 1 under v0" in said_in_order
