"""Chain repair on one child's word (paper section 4.2, appendix D; issue 30): the reporter gets another relay of the
same version, with a fresh credential its new parent is told the fingerprint of, and nobody else moves."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from dataplane import credentials
from dataplane import messages as m
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.snapshot import Manifest, build_manifest, manifest_reference, split
from echo2_site.demo import free_port
from marketplace import services
from marketplace.infra import telemetry
from marketplace.models import Worker
from worker_agent.relaying import Relays

from .test_broadcast import make_workers, publish, pushes, running_job  # noqa: F401 (pushes: a fixture)
from .test_self_reports import live

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def report(child: int, parent: int, job, version: int = 1) -> None:
    services.relay_failed(worker=Worker.objects.get(pk=child), job_id=job.pk, version=version,
                          culprit_worker_id=parent, reason="connection refused")


def test_a_childs_word_moves_it_to_another_chains_tail_with_a_fresh_credential(pushes):  # noqa: F811
    workers = make_workers(6)
    job = running_job(workers, b0=2000)  # two chains of three
    live(*workers)
    publish(job, 1)
    (a, b, c), (d, e, f) = telemetry.load_chain_plan(job.pk, 1).chains
    before = {w: len(pushes[w]) for w in (a, d, e)}
    first = pushes[c][-1].credential
    report(c, b, job)
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((a, b), (d, e, f, c))
    moved = pushes[c][-1]
    assert moved.parent == Worker.objects.get(pk=f).relay_address and moved.parent_worker_id == f
    assert moved.children == []  # (c keeps no child: it was a tail)
    job.refresh_from_db()
    credentials.verify(job.transfer_secret, moved.credential, job_id=job.pk, version=1, worker_id=c, now=time.time())
    assert credentials.parse(moved.credential)[0].expires >= credentials.parse(first)[0].expires  # issued anew
    assert pushes[f][-1].children == [c]
    assert pushes[f][-1].child_credential_sha256 == {c: credentials.fingerprint(moved.credential)}
    assert pushes[b][-1].children == []  # the accused: its child is gone, its place kept
    assert Worker.objects.get(pk=b).relay_failures == 0
    assert {w: len(pushes[w]) for w in (a, d, e)} == before  # nobody else is told anything


def test_the_orphan_of_a_seed_takes_the_learners_spare_slot_once(pushes):  # noqa: F811
    workers = make_workers(4)
    job = running_job(workers, b0=2000)  # two chains of two: the learner serves two seeds and has one slot more
    live(*workers)
    publish(job, 1)
    (a, b), (c, d) = telemetry.load_chain_plan(job.pk, 1).chains
    Worker.objects.filter(pk=d).update(relay_address="")  # (d cannot serve: it takes no orphan)
    report(b, a, job)
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((a,), (c, d), (b,))
    assert pushes[b][-1].parent == job.learner_relay and pushes[b][-1].parent_worker_id is None
    report(d, c, job)  # the learner's slot is taken: the tail a relay (a, still receiving the version) takes it
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((a, d), (c,), (b,))
    assert pushes[d][-1].parent_worker_id == a and pushes[a][-1].children == [d]
    report(d, a, job)  # a second child of a says so: confirmed, a is excised and d takes its seat at the learner
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((d,), (c,), (b,))
    assert pushes[d][-1].parent == job.learner_relay and Worker.objects.get(pk=a).relay_failures == 1


# ---- end to end: real relays on loopback, the site's service, a relay process killed mid-version ----------------


def start_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """An event loop in a thread of its own: the relays' (the agents' and the learner's), while this thread plays
    the site (the database is this thread's)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="relays", daemon=True)
    thread.start()
    return loop, thread


def on_loop(loop, coro, timeout: float = 30.0):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


def dispatch(loop, relays: Relays, snap: m.SnapshotAvailable, manifest: Manifest) -> asyncio.Future | None:
    """What the agent's installer does with a ``snapshot`` message (``worker_agent.installs.Installer.install``): a
    version it already relays is rerouted (new parent and/or child), a new one received through the relay, as
    ``manifest`` describes it (the installer fetches it by the message's reference: here the learner's HTTP server
    is a closed port, so the test hands it over)."""
    assert (snap.manifest_sha256, snap.manifest_bytes) == manifest_reference(manifest)  # what a fetch would check

    async def go():
        key = (snap.job_id, snap.version)
        if key in relays:
            if snap.parent:
                relays.reroute(relays.get(key), snap)
            return None
        return asyncio.ensure_future(relays.receive(snap, manifest))
    return on_loop(loop, go())


def test_a_relay_killed_mid_version_its_child_finishes_from_another_relay_without_http(pushes, tmp_path):  # noqa: F811
    """Two chains, (w1, w3, w5) and (w2, w4); w3 runs as its own process and is SIGKILLed while its child w5 pulls
    from it. w5 reports it, the site (one child's word) gives w5 the tail w4 with a fresh credential and tells w4 its
    fingerprint; w5's relay switches parent mid-version and finishes from w4: nothing over HTTP (the fallback URL
    is a closed port, so an HTTP fetch would fail the transfer), no chunk it held fetched again."""
    workers = make_workers(5, bw=1_000_000)
    for w in workers:
        Worker.objects.filter(pk=w.pk).update(relay_address=f"127.0.0.1:{free_port()}")
    workers = [Worker.objects.get(pk=w.pk) for w in workers]
    address = {w.pk: w.relay_address for w in workers}
    loop, thread = start_loop()
    origin_hub, reports, agents, killed = RelayHub(), queue.Queue(), {}, None
    try:
        learner_port = on_loop(loop, origin_hub.start("127.0.0.1", 0))
        job = running_job(workers, b0=2_000_000, learner_relay=f"127.0.0.1:{learner_port}")  # two chains
        live(*workers)
        payload = os.urandom(16 * 64 * 1024)
        manifest = build_manifest(payload, job_id=job.pk, version=1, chunk_bytes=64 * 1024)
        services.snapshot_publish(job=job, version=1, url=f"http://127.0.0.1:{free_port()}/v1/",
                                  manifest=manifest.model_dump(mode="json"))
        (w1, w3, w5), (w2, w4) = telemetry.load_chain_plan(job.pk, 1).chains  # (their names: these roles)
        job.refresh_from_db()
        origin = SnapshotRelay(manifest, worker_id=0, chunks=dict(enumerate(split(payload, 64 * 1024))),
                               max_children=3, secret=job.transfer_secret)
        loop.call_soon_threadsafe(origin_hub.register, origin)

        async def report(message):
            reports.put(message)

        for wid in (w1, w2, w4, w5):  # the agents' relays, as worker_agent.installs runs them
            agents[wid] = Relays(worker_id=wid, bandwidth_bps=None, listen=address[wid], report=report)
        # w3: a relay process (its uplink slow, so w5 is still pulling when it dies)
        snap3 = pushes[w3][-1]
        (tmp_path / "manifest.json").write_text(manifest.model_dump_json())
        host, _, port = snap3.parent.rpartition(":")
        killed = subprocess.Popen(
            [sys.executable, "-m", "dataplane.broadcast.process", "--manifest", str(tmp_path / "manifest.json"),
             "--worker-id", str(w3), "--listen", address[w3], "--parent", snap3.parent, "--credential",
             snap3.credential, "--child", f"{w5}={snap3.child_credential_sha256[w5]}", "--uplink-bps", "150000"],
            stdin=subprocess.PIPE, stdout=(tmp_path / "w3.log").open("w"), start_new_session=True)
        deadline = time.monotonic() + 30
        while '"listening"' not in (tmp_path / "w3.log").read_text():
            assert time.monotonic() < deadline and killed.poll() is None, (tmp_path / "w3.log").read_text()
            time.sleep(0.05)
        receiving = {wid: dispatch(loop, agents[wid], pushes[wid][-1], manifest) for wid in (w1, w2, w4, w5)}
        relay5 = on_loop(loop, wait_for_relay(agents[w5], job.pk))

        deadline = time.monotonic() + 30
        while on_loop(loop, held(relay5)) < 4:  # w5 holds some chunks from w3
            assert time.monotonic() < deadline, ("w5 never got 4 chunks from w3", (tmp_path / "w3.log").read_text(),
                                                 {w: pushes[w][-1] for w in (w1, w3, w5)},
                                                 {w: t.done() and t.exception() for w, t in receiving.items()})
            time.sleep(0.05)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(10)

        failed = reports.get(timeout=30)  # w5's relay reports its parent (worker_agent.relaying.Relays._event)
        assert isinstance(failed, m.RelayFailed) and failed.culprit_worker_id == w3
        sent = {wid: len(pushes.get(wid, [])) for wid in (w1, w2, w4, w5)}
        services.relay_failed(worker=Worker.objects.get(pk=w5), job_id=job.pk, version=1,
                              culprit_worker_id=failed.culprit_worker_id, reason=failed.reason)
        assert telemetry.load_chain_plan(job.pk, 1).chains == ((w1, w3), (w2, w4, w5))
        assert {wid for wid in sent if len(pushes[wid]) > sent[wid]} == {w4, w5}  # only they are told
        for wid in (w4, w5):
            dispatch(loop, agents[wid], pushes[wid][-1], manifest)

        ordered, source = on_loop(loop, finished(receiving[w5]), timeout=60)[1:]
        assert b"".join(ordered) == payload and source == "parent"
        stats = relay5.stats
        assert stats.from_fallback == 0 and stats.parent_switches == 1
        assert stats.resumed_with >= 4  # what it held when w4 accepted it: kept, not fetched again
        assert stats.from_parent == len(manifest.chunks)  # every chunk stored once
        assert agents[w4].get((job.pk, 1)).stats.children_served == 1
    finally:
        if killed is not None and killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
        for relays in agents.values():
            if relays.hub is not None:
                on_loop(loop, relays.hub.close())
        on_loop(loop, origin_hub.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


async def wait_for_relay(relays: Relays, job_id: int) -> SnapshotRelay:
    for _ in range(200):
        if (relay := relays.get((job_id, 1))) is not None:
            return relay
        await asyncio.sleep(0.05)
    raise AssertionError("the agent never started its relay")


async def held(relay: SnapshotRelay) -> int:
    return len(relay.have)


async def finished(task: asyncio.Future):
    return await asyncio.wait_for(task, 50)


def test_a_child_is_not_planned_again_under_the_parent_it_reported(pushes):  # noqa: F811
    """A relay that died without its socket closing (a crashed host) stays in the plan until the worker timeout; the
    child that reported it is planned under another relay from the next publication on, not sent to it again."""
    workers = make_workers(4)
    job = running_job(workers, b0=2000)  # two chains of two
    live(*workers)
    publish(job, 1)
    (a, b), (c, d) = telemetry.load_chain_plan(job.pk, 1).chains
    report(b, a, job)
    publish(job, 2)
    plan = telemetry.load_chain_plan(job.pk, 2)
    assert all((a, b) != chain[i - 1:i + 1] for chain in plan.chains for i in range(1, len(chain))), plan.chains
    assert pushes[b][-1].version == 2 and pushes[b][-1].parent_worker_id != a
    assert {w for chain in plan.chains for w in chain} == {a, b, c, d} and Worker.objects.get(pk=a).relay_failures == 0
