"""The manifest down the chain, on real sockets: relays that start with only the manifest's reference (the sha256 and
size the site announced) take it from their parent's ``accept``, hop by hop, a child that knocks before its parent
has it being told to wait (``idle``) rather than refused; a parent that sends another manifest is refused and
reported, and the child fetches the manifest and the chunks from the HTTP fallback (a real HTTP server, counting
what it is asked for); a child held for a manifest its parent gave up on is refused at once."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay
from dataplane.broadcast.store import write_version
from dataplane.credentials import issue, new_secret
from dataplane.snapshot import build_manifest, canonical_manifest, manifest_reference, split

JOB, VERSION, CHUNK = 3, 5, 4096
SECRET = new_secret()
PAYLOAD = os.urandom(12 * CHUNK)
MANIFEST = build_manifest(PAYLOAD, job_id=JOB, version=VERSION, chunk_bytes=CHUNK)
CHUNKS = dict(enumerate(split(PAYLOAD, CHUNK)))
A, B = 7, 8


def cred(worker_id: int) -> str:
    return issue(SECRET, job_id=JOB, worker_id=worker_id, lowest=VERSION, highest=VERSION,
                 expires=int(time.time()) + 600)


def by_reference(worker_id: int, events: list[dict], **kwargs) -> SnapshotRelay:
    """A relay that knows only what the site's message says of the manifest: its reference."""
    return SnapshotRelay(None, worker_id=worker_id, reference=manifest_reference(MANIFEST), job_id=JOB,
                         version=VERSION, credential=cred(worker_id), on_event=events.append,
                         timeouts=RelayTimeouts(give_up=30, assign_wait=1.0), **kwargs)


class CountingServer:
    """The learner's store layout over plain HTTP; counts the requests for each path."""

    def __init__(self, root) -> None:
        self.requests: dict[str, int] = {}
        lock, requests = threading.Lock(), self.requests

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with lock:
                    requests[self.path] = requests.get(self.path, 0) + 1
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v{VERSION}/"

    def manifests(self) -> int:
        return self.requests.get(f"/v{VERSION}/manifest.json", 0)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ForgingRelay(SnapshotRelay):
    """A lying parent: it holds the real chunks but sends its children a manifest of its own making, well formed,
    one chunk's sha256 changed (only the reference tells it from the one the site checked)."""

    def manifest_json(self) -> bytes:
        forged = json.loads(canonical_manifest(self.manifest))
        forged["chunks"][0]["sha256"] = "0" * 64
        return json.dumps(forged).encode()


async def hub_of(relay: SnapshotRelay) -> tuple[RelayHub, int]:
    hub = RelayHub(assign_wait=1.0)
    hub.register(relay)
    return hub, await hub.start()


def test_relays_that_start_without_the_manifest_take_it_down_the_chain_hop_by_hop() -> None:
    """origin -> A -> B, neither A nor B given the manifest nor any fallback: B knocks while A has no parent yet, is
    kept waiting (no failure), and both install every chunk from their parents once A is routed."""

    async def main() -> tuple[SnapshotRelay, SnapshotRelay, SnapshotRelay, list[dict], list[dict]]:
        origin = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=0, secret=SECRET)
        events_a: list[dict] = []
        events_b: list[dict] = []
        a, b = by_reference(A, events_a), by_reference(B, events_b)
        a.assign_children({B: None})
        a.secret = SECRET  # (an agent's relay checks the site's fingerprint; the secret is the shorter way here)
        origin_hub, origin_port = await hub_of(origin)
        a_hub, a_port = await hub_of(a)  # registered before it has its manifest, as an agent's relay is
        b.set_parent("127.0.0.1", a_port)
        receiving_b = asyncio.create_task(b.receive())
        await asyncio.sleep(1.5)  # B is held by A, which has nothing yet: longer than A's assign_wait
        assert a.serving and b.manifest is None
        a.set_parent("127.0.0.1", origin_port)
        got_a, got_b = await asyncio.wait_for(asyncio.gather(a.receive(), receiving_b), 30)
        assert got_a == got_b == PAYLOAD
        await origin_hub.close()
        await a_hub.close()
        return origin, a, b, events_a, events_b

    origin, a, b, events_a, events_b = asyncio.run(main())
    assert (a.manifest_from, b.manifest_from) == ("parent", "parent")
    assert a.manifest == b.manifest == MANIFEST
    assert (origin.stats.manifests_sent, a.stats.manifests_sent) == (1, 1)
    assert a.stats.from_parent == b.stats.from_parent == len(CHUNKS)
    assert not [e for e in events_a + events_b if e["event"] == "parent_failed"]


def test_a_parent_that_sends_another_manifest_is_refused_and_the_child_fetches_its_own(tmp_path) -> None:
    write_version(tmp_path, MANIFEST, PAYLOAD)
    server = CountingServer(tmp_path)

    async def main() -> tuple[SnapshotRelay, list[dict]]:
        liar = ForgingRelay(MANIFEST, chunks=CHUNKS, worker_id=A, secret=SECRET)
        hub, port = await hub_of(liar)
        events: list[dict] = []
        child = by_reference(B, events, fallback_url=server.url())
        child.set_parent("127.0.0.1", port)
        got = await asyncio.wait_for(child.receive(), 30)
        assert got == PAYLOAD
        await hub.close()
        return child, events

    try:
        child, events = asyncio.run(main())
    finally:
        server.close()
    failed = [e for e in events if e["event"] == "parent_failed"]
    assert len(failed) == 1, failed  # reported once, never knocked on again
    assert "refused: it hashes to" in failed[0]["reason"]
    assert f"not to the {manifest_reference(MANIFEST).sha256[:12]}" in failed[0]["reason"]
    assert child.stats.manifests_refused == 1
    assert child.manifest_from == "fallback" and child.manifest == MANIFEST
    assert server.manifests() == 1
    assert child.stats.from_fallback == len(CHUNKS) and child.stats.from_parent == 0


def test_a_child_held_for_a_manifest_is_refused_once_its_parent_gives_the_version_up() -> None:
    async def main() -> tuple[list[dict], float]:
        a = by_reference(A, [])
        a.secret = SECRET
        hub, port = await hub_of(a)
        events: list[dict] = []
        b = by_reference(B, events)
        b.set_parent("127.0.0.1", port)
        receiving = asyncio.create_task(b.receive())
        await asyncio.sleep(1.0)
        assert a.serving  # held, told to wait
        started = time.monotonic()
        a.abandon("worker 7 no longer relays job 3 version 5")
        while not any(e["event"] == "parent_failed" for e in events):
            await asyncio.sleep(0.02)
        took = time.monotonic() - started
        receiving.cancel()
        await hub.close()
        return events, took

    events, took = asyncio.run(main())
    failed = next(e for e in events if e["event"] == "parent_failed")
    assert "no longer relays job 3 version 5" in failed["reason"]
    assert took < 5, took  # told at once, not after the child's give_up (30 s here)


def test_an_accept_carries_the_manifest_only_to_a_child_that_asks() -> None:
    """A child that holds the manifest (it asks for none) gets the accept of old: no payload."""

    async def main() -> tuple[SnapshotRelay, SnapshotRelay]:
        origin = SnapshotRelay(MANIFEST, chunks=CHUNKS, worker_id=0, secret=SECRET)
        hub, port = await hub_of(origin)
        child = SnapshotRelay(MANIFEST, worker_id=B, credential=cred(B), timeouts=RelayTimeouts(give_up=30))
        child.set_parent("127.0.0.1", port)
        assert await asyncio.wait_for(child.receive(), 30) == PAYLOAD
        await hub.close()
        return origin, child

    origin, child = asyncio.run(main())
    assert origin.stats.manifests_sent == 0 and origin.stats.children_served == 1
    assert child.manifest_from == "given"

