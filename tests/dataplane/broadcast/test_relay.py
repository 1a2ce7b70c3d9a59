"""Snapshot relays as real processes on loopback: a chain delivers byte-identical snapshots, survives a killed
middle relay once repaired, re-fetches a corrupted chunk, and refuses peers outside their assignment. Every
relay holds the credentials the site would hand out (the origin the job's secret, each child its token, each
parent the sha256 of its child's token)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dataplane.broadcast import framing
from dataplane.broadcast.chains import ChainPlan, repair
from dataplane.broadcast.driver import RelayProcess
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.broadcast.store import read_version, write_version
from dataplane.credentials import fingerprint, issue, new_secret
from dataplane.snapshot import build_manifest

ROOT = Path(__file__).resolve().parents[3]
JOB, VERSION = 1, 3
RELAY = "dataplane.broadcast.process"
CORRUPTING_RELAY = "tests.dataplane.broadcast.corrupting_relay"  # the same process, its relay flips bytes
SECRET = new_secret()


def cred(worker_id: int, *, ttl: int = 3600) -> str:
    """The credential the site would give ``worker_id`` for this version (``ttl`` differs: a re-issued one)."""
    return issue(SECRET, job_id=JOB, worker_id=worker_id, lowest=VERSION, highest=VERSION,
                 expires=int(time.time()) + ttl)


def child_arg(worker_id: int, token: str) -> list[str]:
    return ["--child", f"{worker_id}={fingerprint(token)}"]


class RelayProc(RelayProcess):
    """A relay process of the test (``dataplane.broadcast.driver``), listening once constructed."""

    def __init__(self, *args: str, module: str = RELAY) -> None:
        super().__init__(args, module=module, cwd=ROOT)
        self.port = self.wait("listening")["port"]


@pytest.fixture
def snapshot(tmp_path):
    payload = os.urandom(1_500_000)
    manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=50_000)
    directory = write_version(tmp_path / "snap", manifest, payload)
    (tmp_path / "manifest.json").write_text(manifest.model_dump_json())
    return {"payload": payload, "dir": directory, "manifest": tmp_path / "manifest.json", "tmp": tmp_path}


@pytest.fixture
def procs():
    started: list[RelayProc] = []

    def start(*args: str, module: str = RELAY) -> RelayProc:
        started.append(RelayProc(*args, module=module))
        return started[-1]

    yield start
    for proc in started:
        proc.stop()


def relay_args(snapshot, worker_id: int, parent: int | None, *extra: str, child: int | None = None,
               tokens: dict[int, str] | None = None) -> list[str]:
    """A relay that receives as ``worker_id`` (showing its token from ``tokens``, default :func:`cred`) and
    serves ``child`` (knowing the sha256 of the child's token)."""
    tokens = tokens if tokens is not None else {}
    token = tokens.setdefault(worker_id, cred(worker_id))
    args = ["--manifest", str(snapshot["manifest"]), "--worker-id", str(worker_id), "--stall-timeout", "5",
            "--out", str(snapshot["tmp"] / f"w{worker_id}.bin"), f"--credential={token}", *extra]
    if child is not None:
        args += child_arg(child, tokens.setdefault(child, cred(child)))
    return args + (["--parent", f"127.0.0.1:{parent}"] if parent else [])


def origin_args(snapshot, *extra: str) -> list[str]:
    return ["--from-dir", str(snapshot["dir"]), f"--job-secret={SECRET}", *extra]


def test_chain_of_four_relays_delivers_byte_identical_snapshots(snapshot, procs):
    origin = procs(*origin_args(snapshot, "--uplink-bps", "8e6"))
    parent = origin.port
    chain, tokens = [], {}
    for worker_id in (1, 2, 3, 4):
        child = worker_id + 1 if worker_id < 4 else None
        chain.append(procs(*relay_args(snapshot, worker_id, parent, "--downlink-bps", "8e6", child=child,
                                       tokens=tokens)))
        parent = chain[-1].port
    for worker_id, relay in enumerate(chain, start=1):
        installed = relay.wait("installed")
        assert installed["sha256"] == hashlib.sha256(snapshot["payload"]).hexdigest()
        assert (snapshot["tmp"] / f"w{worker_id}.bin").read_bytes() == snapshot["payload"]
        assert installed["stats"]["from_parent"] == 30 and installed["stats"]["from_fallback"] == 0


def test_killed_middle_relay_is_repaired_and_every_survivor_installs(snapshot, procs):
    origin = procs(*origin_args(snapshot))
    rate = ["--downlink-bps", "1e6", "--uplink-bps", "1e6"]  # 1.5 MB at 1 MB/s: ~1.5 s, time to kill mid-way
    tokens: dict[int, str] = {}
    w1 = procs(*relay_args(snapshot, 1, origin.port, *rate, child=2, tokens=tokens))
    w2 = procs(*relay_args(snapshot, 2, w1.port, *rate, child=3, tokens=tokens))
    w3 = procs(*relay_args(snapshot, 3, w2.port, *rate, "--progress", child=4, tokens=tokens))
    w4 = procs(*relay_args(snapshot, 4, w3.port, *rate, tokens=tokens))

    w3.wait("chunk", when=lambda e: e["have"] >= 3)
    w2.proc.send_signal(signal.SIGKILL)
    lost = w3.wait("parent_failed")
    assert f"127.0.0.1:{w2.port}" in lost["reason"]

    plan, moves = repair(ChainPlan(chains=((1, 2, 3, 4),)), 2)
    assert plan.chains == ((1, 3, 4),) and moves == [(3, 1)]
    ports = {1: w1.port}
    for child, new_parent in moves:  # the site re-issues the orphan's credential with its new parent
        fresh = cred(child, ttl=3000)
        w1.send(cmd="children", worker_ids=[child], sha256={str(child): fingerprint(fresh)})
        w3.send(cmd="parent", host="127.0.0.1", port=ports[new_parent], credential=fresh)

    digest = hashlib.sha256(snapshot["payload"]).hexdigest()
    for worker_id, relay in ((1, w1), (3, w3), (4, w4)):
        assert relay.wait("installed")["sha256"] == digest
        assert (snapshot["tmp"] / f"w{worker_id}.bin").read_bytes() == snapshot["payload"]
    stats = w3.wait("installed")["stats"]
    assert stats["parent_switches"] == 1 and stats["resumed_with"] >= 3 and stats["from_fallback"] == 0


def test_corrupted_chunk_is_detected_and_fetched_again_from_the_parent(snapshot, procs):
    origin = procs(*origin_args(snapshot))
    tokens: dict[int, str] = {}
    w1 = procs(*relay_args(snapshot, 1, origin.port, child=2, tokens=tokens), "--corrupt-chunk", "3",
               module=CORRUPTING_RELAY)
    w2 = procs(*relay_args(snapshot, 2, w1.port, tokens=tokens))
    bad = w2.wait("bad_chunk")
    assert bad["index"] == 3 and "sha256 mismatch" in bad["reason"]
    installed = w2.wait("installed")
    assert (snapshot["tmp"] / "w2.bin").read_bytes() == snapshot["payload"]
    assert installed["stats"]["bad_chunks"] == 1 and installed["stats"]["from_fallback"] == 0


def test_relay_that_keeps_corrupting_is_bypassed_through_the_learner_fallback(snapshot, procs):
    handler = partial(SimpleHTTPRequestHandler, directory=str(snapshot["dir"].parent))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        origin = procs(*origin_args(snapshot))
        tokens: dict[int, str] = {}
        w1 = procs(*relay_args(snapshot, 1, origin.port, child=2, tokens=tokens), "--corrupt-chunk", "3",
                   "--corrupt-times", "100", module=CORRUPTING_RELAY)
        url = f"http://127.0.0.1:{server.server_address[1]}/v{VERSION}/"
        w2 = procs(*relay_args(snapshot, 2, w1.port, "--fallback-url", url, tokens=tokens))
        installed = w2.wait("installed")
        assert (snapshot["tmp"] / "w2.bin").read_bytes() == snapshot["payload"]
        assert installed["stats"]["bad_chunks"] == 3 and installed["stats"]["from_fallback"] == 1
    finally:
        server.shutdown()
        server.server_close()


def ask_relay(port: int, version: int, worker_id: int, credential: str) -> framing.Frame:
    """Say hello to the relay on ``port`` as ``worker_id`` asking for ``version``; its first reply."""
    async def hello() -> framing.Frame:
        reader, writer = await framing.open_peer("127.0.0.1", port, timeout=5)
        await framing.write_frame(writer, framing.hello(job_id=JOB, version=version, worker_id=worker_id, have=[],
                                                        credential=credential), peer="relay", timeout=5)
        frame = await framing.read_frame(reader, peer="relay", timeout=10)
        writer.close()
        return frame

    return asyncio.run(hello())


def test_a_child_that_knocks_before_its_parent_is_told_is_served_once_it_is(snapshot, procs):
    # The site pushes "serve child 2" to the parent and "pull from worker 1" to the child at the same
    # time; the child may arrive first. The parent holds it until the assignment lands.
    w1 = procs("--from-dir", str(snapshot["dir"]), "--worker-id", "1", *child_arg(3, cred(3)))
    token = cred(2)
    threading.Timer(0.5, lambda: w1.send(cmd="children", worker_ids=[2],
                                         sha256={"2": fingerprint(token)})).start()
    started = time.monotonic()
    assert ask_relay(w1.port, VERSION, 2, token).type == "accept"
    assert 0.4 < time.monotonic() - started < 5


def test_hub_holds_a_child_asking_for_a_version_until_it_is_registered(snapshot):
    async def main() -> framing.Frame:
        hub = RelayHub(assign_wait=5.0)
        port = await hub.start()
        manifest, chunks = read_version(snapshot["dir"])
        relay = SnapshotRelay(manifest, chunks=chunks, worker_id=1, secret=SECRET)
        asyncio.get_running_loop().call_later(0.3, hub.register, relay)  # the site's message lands later
        reader, writer = await framing.open_peer("127.0.0.1", port, timeout=5)
        await framing.write_frame(writer, framing.hello(job_id=JOB, version=VERSION, worker_id=2, have=[],
                                                        credential=cred(2)), peer="hub", timeout=5)
        frame = await framing.read_frame(reader, peer="hub", timeout=10)
        writer.close()
        await hub.close()
        return frame

    assert asyncio.run(main()).type == "accept"


def test_peer_asking_for_an_unassigned_version_or_not_its_child_is_refused(snapshot, procs):
    w1 = procs("--from-dir", str(snapshot["dir"]), "--worker-id", "1", *child_arg(2, cred(2)), "--assign-wait",
               "0.2")

    async def ask(version: int, worker_id: int) -> str:
        reader, writer = await framing.open_peer("127.0.0.1", w1.port, timeout=5)
        await framing.write_frame(writer, framing.hello(job_id=JOB, version=version, worker_id=worker_id, have=[],
                                                        credential=cred(worker_id)), peer="w1", timeout=5)
        frame = await framing.read_frame(reader, peer="w1", timeout=5)
        with pytest.raises(framing.PeerClosed):  # the refuser hangs up after giving its reason
            await framing.read_frame(reader, peer="w1", timeout=5)
        writer.close()
        assert frame.type == "refuse"
        return frame.header["reason"]

    reason = asyncio.run(ask(VERSION + 1, 2))
    assert f"not assigned job {JOB} version {VERSION + 1}" in reason
    assert f"version {VERSION} " not in reason + " "  # never what the hub does serve
    assert "worker 9 is not an assigned child of worker 1" in asyncio.run(ask(VERSION, 9))


def test_child_refuses_a_parent_that_sends_another_version(snapshot, procs):
    reasons: list[str] = []

    async def fake_parent() -> None:
        async def handle(reader, writer):
            if done.is_set():  # the child retries after refusing us; one conversation is enough
                writer.close()
                return
            await framing.read_frame(reader, peer="child", timeout=10)
            await framing.write_frame(writer, framing.accept(job_id=JOB, version=VERSION, chunks=30),
                                      peer="child", timeout=5)
            data = b"x" * 10
            await framing.write_frame(writer, framing.chunk(job_id=JOB, version=VERSION + 7, index=0, size=10,
                                                            sha256=hashlib.sha256(data).hexdigest()),
                                       data, peer="child", timeout=5)
            reasons.append((await framing.read_frame(reader, peer="child", timeout=10)).header["reason"])
            writer.close()
            done.set()

        done = asyncio.Event()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        child = await asyncio.to_thread(procs, *relay_args(snapshot, 5, server.sockets[0].getsockname()[1]))
        await asyncio.wait_for(done.wait(), 30)
        failed = await asyncio.to_thread(child.wait, "parent_failed")
        assert "refused" in failed["reason"]
        server.close()

    asyncio.run(fake_parent())
    assert reasons == [f"worker 5 was assigned job {JOB} version {VERSION}, not job {JOB} version {VERSION + 7}"]


def test_a_frozen_relay_is_bypassed_within_seconds_through_the_fallback(snapshot, procs):
    """SIGSTOP keeps the parent's socket open but sends nothing: its child notices in ``stall`` seconds
    (no idle frames either), takes the rest from the learner's HTTP fallback at once, and reports it."""
    handler = partial(SimpleHTTPRequestHandler, directory=str(snapshot["dir"].parent))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v{VERSION}/"
    tokens: dict[int, str] = {}
    origin = procs(*origin_args(snapshot))
    w1 = procs(*relay_args(snapshot, 1, origin.port, "--uplink-bps", "3e5", child=2, tokens=tokens))
    stall = ["--stall-timeout", "1.5", "--progress"]
    w2 = procs(*[a for a in relay_args(snapshot, 2, w1.port, "--fallback-url", url, tokens=tokens)
                 if a != "--stall-timeout" and a != "5"] + stall)
    try:
        w2.wait("chunk", when=lambda e: e["have"] >= 3)
        w1.proc.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        failed = w2.wait("parent_failed")
        assert "stalled" in failed["reason"]
        installed = w2.wait("installed")
        took = time.monotonic() - frozen_at
        assert (snapshot["tmp"] / "w2.bin").read_bytes() == snapshot["payload"]
        assert installed["stats"]["from_fallback"] > 0 and installed["stats"]["from_parent"] >= 3
        assert installed["stats"]["parent_failures"] == 1  # not knocked on again: straight to the fallback
        assert took < 15, f"{took:.1f} s to get past a frozen parent"
    finally:
        w1.proc.send_signal(signal.SIGCONT)
        server.shutdown()
        server.server_close()


def test_a_parent_waiting_for_its_own_parent_keeps_its_child_with_idle_frames(tmp_path, procs):
    """Store-and-forward per chunk: a slow upstream leaves gaps longer than the child's stall timeout
    between chunks; the idle frames keep the child from taking a live parent for a frozen one."""
    payload = os.urandom(200_000)
    manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=50_000)
    directory = write_version(tmp_path / "snap", manifest, payload)
    (tmp_path / "manifest.json").write_text(manifest.model_dump_json())
    small = {"payload": payload, "dir": directory, "manifest": tmp_path / "manifest.json", "tmp": tmp_path}
    tokens: dict[int, str] = {}
    origin = procs(*origin_args(small, "--uplink-bps", "25000"))  # a 50 KB chunk every 2 s
    w1 = procs(*relay_args(small, 1, origin.port, child=2, tokens=tokens))
    w2 = procs(*[a for a in relay_args(small, 2, w1.port, tokens=tokens) if a not in ("--stall-timeout", "5")],
               "--stall-timeout", "1.0")
    installed = w2.wait("installed", timeout=60)
    assert (tmp_path / "w2.bin").read_bytes() == payload
    assert installed["stats"]["from_parent"] == 4 and installed["stats"]["parent_failures"] == 0
