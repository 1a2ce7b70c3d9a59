"""The relay's HTTP fallback keeps several chunk requests in flight (bounded), within its downlink bucket, against a
real HTTP server that answers each request after a delay (a long link's round trip)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dataplane.broadcast.framing import TransferError
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.ratelimit import TokenBucket
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay
from dataplane.broadcast.store import write_version
from dataplane.credentials import issue, new_secret
from dataplane.snapshot import build_manifest, split

JOB, VERSION, CHUNKS, CHUNK = 1, 2, 8, 40_000


class SlowServer:
    """Serves a store's files, each request after ``delay`` s; counts the requests waiting at once."""

    def __init__(self, root, delay: float) -> None:
        counts = self.counts = {"now": 0, "most": 0, "requests": 0}
        lock = threading.Lock()

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                with lock:
                    counts["now"] += 1
                    counts["requests"] += 1
                    counts["most"] = max(counts["most"], counts["now"])
                time.sleep(delay)
                with lock:  # before the answer goes out: the client may ask again as soon as it has it
                    counts["now"] -= 1
                super().do_GET()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, version: int) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v{version}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def store(tmp_path):
    payload = os.urandom(CHUNKS * CHUNK)
    manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=CHUNK)
    write_version(tmp_path, manifest, payload)
    return tmp_path, manifest, payload


def receive(manifest, url: str, *, in_flight: int, downlink: TokenBucket | None = None) -> tuple[SnapshotRelay, bytes]:
    async def main() -> tuple[SnapshotRelay, bytes]:
        relay = SnapshotRelay(manifest, worker_id=7, fallback_url=url, downlink=downlink,
                              timeouts=RelayTimeouts(fallback_in_flight=in_flight, give_up=20))
        return relay, await asyncio.wait_for(relay.receive(), 30)

    return asyncio.run(main())


def test_the_fallback_keeps_several_requests_in_flight_and_no_more_than_its_bound(store):
    root, manifest, payload = store
    server = SlowServer(root, delay=0.25)
    try:
        relay, got = receive(manifest, server.url(VERSION), in_flight=4)
    finally:
        server.close()
    assert got == payload and relay.stats.from_fallback == CHUNKS
    assert server.counts["most"] == 4 and server.counts["requests"] == CHUNKS  # 4 at once, never 5


def test_one_in_flight_is_the_old_one_request_at_a_time(store):
    root, manifest, payload = store
    server = SlowServer(root, delay=0.05)
    try:
        _, got = receive(manifest, server.url(VERSION), in_flight=1)
    finally:
        server.close()
    assert got == payload and server.counts["most"] == 1


def test_requests_in_flight_stay_within_the_downlink_bucket(store):
    root, manifest, payload = store
    server = SlowServer(root, delay=0.0)
    rate, burst = 400_000.0, 20_000.0  # 320 kB at 400 kB/s: at least (320 - 20) / 400 = 0.75 s
    try:
        started = time.monotonic()
        _, got = receive(manifest, server.url(VERSION), in_flight=4, downlink=TokenBucket(rate, burst))
        took = time.monotonic() - started
    finally:
        server.close()
    assert got == payload
    assert took >= (CHUNKS * CHUNK - burst) / rate * 0.95


def test_a_chunk_the_fallback_cannot_give_fails_the_transfer_with_its_reason(store):
    root, manifest, _ = store
    (root / f"v{VERSION}" / "chunks" / "5").unlink()
    server = SlowServer(root, delay=0.0)
    try:
        with pytest.raises(TransferError, match="fallback: .*chunk 5.*404"):
            receive(manifest, server.url(VERSION), in_flight=4)
    finally:
        server.close()


def test_a_parent_the_site_routes_us_to_during_the_fallback_takes_the_rest(store):
    """A chain repair after the fallback started (the old parent failed its retries): the relay leaves the slow
    fallback for the new parent, keeps what it fetched, and every chunk is stored once."""
    root, manifest, payload = store
    server = SlowServer(root, delay=0.4)
    secret = new_secret()
    chunks = dict(enumerate(split(payload, CHUNK)))

    async def main() -> tuple[SnapshotRelay, bytes]:
        origin = SnapshotRelay(manifest, chunks=chunks, worker_id=0, secret=secret)
        hub = RelayHub(assign_wait=1.0)
        hub.register(origin)
        port = await hub.start()
        credential = issue(secret, job_id=JOB, worker_id=7, lowest=VERSION, highest=VERSION,
                           expires=int(time.time()) + 600)
        relay = SnapshotRelay(manifest, worker_id=7, fallback_url=server.url(VERSION), credential=credential,
                              timeouts=RelayTimeouts(fallback_in_flight=1, give_up=20))
        receiving = asyncio.create_task(relay.receive())
        deadline = time.monotonic() + 10
        while relay.stats.from_fallback < 1:  # the fallback is under way, one slow request at a time
            assert time.monotonic() < deadline, "the fallback never delivered a chunk"
            await asyncio.sleep(0.02)
        relay.set_parent("127.0.0.1", port)
        got = await asyncio.wait_for(receiving, 30)
        await hub.close()
        return relay, got

    try:
        relay, got = asyncio.run(main())
    finally:
        server.close()
    assert got == payload
    assert relay.stats.fallbacks_interrupted == 1
    assert relay.stats.from_fallback >= 1 and relay.stats.from_parent >= 1
    assert relay.stats.from_fallback + relay.stats.from_parent == CHUNKS  # nothing fetched twice into the store
