"""Who a relay serves, on real sockets: the learner's hub (it holds the job's secret) and an agent relay (it holds
only the sha256 of the credential the site gave its child) refuse a hello with no, a wrong, an expired, another
worker's, another job's or another version's credential, count it and log it with the peer's address; an
impostor claiming the assigned child's id never disturbs the real child, which completes and verifies."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time

import pytest

from dataplane.broadcast import framing
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.ratelimit import bucket
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.credentials import fingerprint, issue, new_secret
from dataplane.snapshot import build_manifest, split

JOB, VERSION, CHILD = 4, 2, 7
SECRET = new_secret()
PAYLOAD = os.urandom(600_000)
MANIFEST = build_manifest(PAYLOAD, job_id=JOB, version=VERSION, chunk_bytes=20_000)
CHUNKS = dict(enumerate(split(PAYLOAD, 20_000)))


def cred(worker_id: int = CHILD, *, job_id: int = JOB, version: int = VERSION, ttl: int = 600,
         secret: str = SECRET) -> str:
    return issue(secret, job_id=job_id, worker_id=worker_id, lowest=version, highest=version,
                 expires=int(time.time()) + ttl)


async def hello(port: int, credential: str | None, *, worker_id: int = CHILD) -> framing.Frame:
    """Knock on ``port`` as ``worker_id`` with ``credential``; the first answer."""
    reader, writer = await framing.open_peer("127.0.0.1", port, timeout=5)
    try:
        await framing.write_frame(writer, framing.hello(job_id=JOB, version=VERSION, worker_id=worker_id, have=[],
                                                        credential=credential), peer="relay", timeout=5)
        return await framing.read_frame(reader, peer="relay", timeout=10)
    finally:
        writer.close()


def bad() -> list[tuple[str | None, str | None]]:
    """(credential presented as worker CHILD, the reason's tail), made when a test runs: made at import, with a
    600 s lifetime, they had expired when the file ran more than 10 minutes after collection (a loaded CI)."""
    return [
        (None, "no credential"),
        ("e2t1.garbage", "malformed credential"),
        (cred(secret="not the job's secret"), None),  # learner: bad signature; agent relay: not the one issued
        (cred(ttl=-5), "expired"),
        (cred(worker_id=CHILD + 1), None),  # another worker's (valid for that worker)
        (cred(job_id=JOB + 1), None),  # another job's
        (cred(version=VERSION + 1), None),  # another version's
    ]


async def knock_all(relay: SnapshotRelay) -> list[str]:
    hub = RelayHub(assign_wait=0.2)
    hub.register(relay)
    port = await hub.start()
    try:
        reasons = []
        for credential, _ in bad():
            frame = await hello(port, credential)
            assert frame.type == "refuse", credential
            reasons.append(frame.header["reason"])
        assert (await hello(port, cred())).type == "accept"  # the genuine credential still gets in
        return reasons
    finally:
        await hub.close()


def test_the_learner_hub_refuses_every_credential_but_a_valid_one_counts_and_logs_them(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="echo2.relay")
    relay = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=0, max_children=4, secret=SECRET)
    reasons = asyncio.run(knock_all(relay))
    assert reasons == [
        f"worker {CHILD}: no credential",
        f"worker {CHILD}: malformed credential",
        f"worker {CHILD}: bad credential signature",
        reasons[3],
        f"worker {CHILD}: credential of worker {CHILD + 1}, not of worker {CHILD}",
        f"worker {CHILD}: credential for job {JOB + 1}, not job {JOB}",
        f"worker {CHILD}: credential covers versions {VERSION + 1}..{VERSION + 1}, not {VERSION}",
    ]
    assert reasons[3].startswith(f"worker {CHILD}: credential expired ")
    assert relay.stats.refused == len(bad()) and relay.stats.children_served == 1
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == len(bad()) and all("127.0.0.1:" in line for line in refusals)


def test_an_agent_relay_admits_only_the_credential_the_site_issued_to_that_child(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="echo2.relay")
    relay = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=3)  # no secret: it relies on the site's fingerprint
    genuine = cred()
    relay.assign_children({CHILD: fingerprint(genuine)})

    async def run() -> list[str]:
        reasons = await knock_all_with(relay, genuine)
        expired = cred(ttl=-5)  # the site's own token, but too old
        relay.assign_children({CHILD: fingerprint(expired)})
        reasons.append(await refusal(relay, expired))
        return reasons

    reasons = asyncio.run(run())
    not_issued = f"worker {CHILD}: credential is not the one the site issued to worker {CHILD}"
    assert reasons[:2] == [f"worker {CHILD}: no credential", f"worker {CHILD}: malformed credential"]
    assert reasons[2:-1] == [not_issued] * (len(bad()) - 2)
    assert reasons[-1].startswith(f"worker {CHILD}: credential expired ")
    assert relay.stats.refused == len(bad()) + 1 and relay.stats.children_served == 1
    assert sum("127.0.0.1:" in r.getMessage() for r in caplog.records) == len(bad()) + 1


async def knock_all_with(relay: SnapshotRelay, genuine: str) -> list[str]:
    reasons = []
    for credential, _ in bad():
        reasons.append(await refusal(relay, credential))
    hub = RelayHub(assign_wait=0.2)
    hub.register(relay)
    port = await hub.start()
    try:
        assert (await hello(port, genuine)).type == "accept"
    finally:
        await hub.close()
    return reasons


async def refusal(relay: SnapshotRelay, credential: str | None, *, worker_id: int = CHILD) -> str:
    hub = RelayHub(assign_wait=0.2)
    hub.register(relay)
    port = await hub.start()
    try:
        frame = await hello(port, credential, worker_id=worker_id)
    finally:
        await hub.close()
    assert frame.type == "refuse"
    return frame.header["reason"]


def test_a_relay_that_holds_nothing_to_check_against_admits_no_one() -> None:
    relay = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=3)  # neither the secret nor an assignment
    reason = asyncio.run(refusal(relay, cred()))
    assert reason == f"worker {CHILD}: worker 3 holds no credential of worker {CHILD} to check against"


@pytest.mark.parametrize("impostor_credential", [None, "forged", cred(worker_id=CHILD + 1)])
def test_an_impostor_claiming_the_childs_id_never_closes_its_stream(impostor_credential) -> None:
    async def run() -> tuple[bytes, str, SnapshotRelay, SnapshotRelay]:
        genuine = cred()
        parent = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=3, uplink=bucket(600_000))  # ~1 s to send all
        parent.assign_children({CHILD: fingerprint(genuine)})
        hub = RelayHub(assign_wait=0.2)
        hub.register(parent)
        port = await hub.start()
        child = SnapshotRelay(MANIFEST, worker_id=CHILD, credential=genuine)
        child.set_parent("127.0.0.1", port)
        receiving = asyncio.create_task(child.receive())
        while child.stats.from_parent < 3:  # the real child is streaming
            await asyncio.sleep(0.02)
        frame = await hello(port, impostor_credential)  # the impostor claims the same worker id
        payload = await asyncio.wait_for(receiving, 30)
        await hub.close()
        return payload, frame.header.get("reason", ""), parent, child

    payload, reason, parent, child = asyncio.run(run())
    assert hashlib.sha256(payload).hexdigest() == MANIFEST.sha256 and payload == PAYLOAD
    assert reason.startswith(f"worker {CHILD}: ")
    assert child.stats.parent_failures == 0 and child.stats.from_parent == len(CHUNKS)  # one unbroken stream
    assert parent.stats.refused == 1 and parent.stats.children_served == 1 and parent.stats.child_failures == 0


def test_a_child_with_its_credential_may_replace_its_own_stale_session() -> None:
    async def run() -> list[str]:
        genuine = cred()
        parent = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=3, uplink=bucket(300_000))
        parent.assign_children({CHILD: fingerprint(genuine)})
        hub = RelayHub(assign_wait=0.2)
        hub.register(parent)
        port = await hub.start()
        first = await hello(port, genuine)
        second = await hello(port, genuine)  # the same child reconnecting (its first stream is dead to it)
        await hub.close()
        return [first.type, second.type]

    assert asyncio.run(run()) == ["accept", "accept"]
