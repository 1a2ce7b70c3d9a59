"""A manifest by reference: the site names it by the sha256 of its canonical JSON, and an agent fetches it from the
learner's snapshot server with its credential, keeping only what hashes to that reference."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dataplane.broadcast.store import MANIFEST, version_dir, write_version
from dataplane.credentials import issue, new_secret
from dataplane.snapshot import (
    SnapshotError,
    build_manifest,
    fetch_manifest,
    manifest_reference,
    parse_manifest,
)
from learner.serving import SnapshotServer
from learner.snapshots import SnapshotStore

PAYLOAD = bytes(range(256)) * 40


@pytest.fixture
def learner(tmp_path):
    """A learner's snapshot server with version 3 of job 7 on disk, its secret set, and a credential for it."""
    store = SnapshotStore(tmp_path / "snapshots", job_id=7, chunk_bytes=1000)
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    write_version(store.root, manifest, PAYLOAD)
    secret = new_secret()
    server = SnapshotServer(store, secret=secret).start()
    credential = issue(secret, job_id=7, worker_id=2, lowest=3, highest=3, expires=int(time.time()) + 600)
    yield manifest, server, credential, store.root
    server.stop()


def test_the_reference_is_the_same_whoever_serialized_the_manifest() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    stored = parse_manifest(json.loads(manifest.model_dump_json())).model_dump(mode="json")  # as the site keeps it
    reordered = dict(reversed(list(stored.items())))  # PostgreSQL's jsonb orders keys its own way
    assert manifest_reference(manifest) == manifest_reference(stored) == manifest_reference(reordered)
    older = {k: v for k, v in stored.items() if k not in ("kind", "dtype")}  # an older learner's: defaults left out
    assert manifest_reference(parse_manifest(older)) == manifest_reference(manifest)
    other = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=500)  # the same payload, cut otherwise
    assert manifest_reference(other).sha256 != manifest_reference(manifest).sha256


def test_an_agent_gets_the_manifest_the_reference_names_from_the_learners_server(learner) -> None:
    manifest, server, credential, _ = learner
    assert fetch_manifest(server.url_for(3), manifest_reference(manifest), credential=credential, timeout=5) == manifest


def test_a_served_manifest_of_other_bytes_is_refused_naming_both_digests(learner) -> None:
    manifest, server, credential, root = learner
    served = json.loads((version_dir(root, 3) / MANIFEST).read_text())
    served["chunks"][1]["sha256"] = "0" * 64  # well formed, but not what the site checked and announced
    (version_dir(root, 3) / MANIFEST).write_text(json.dumps(served))
    reference = manifest_reference(manifest)
    got = manifest_reference(parse_manifest(served))
    reason = (rf"^manifest {reference.sha256[:12]}\.\.\. from http://.*/v3/manifest\.json: refused: it hashes to "
              rf"{got.sha256[:12]}\.\.\. \({got.size} bytes\), not to the {reference.sha256[:12]}\.\.\. "
              rf"\({reference.size} bytes\) the site announced$")
    with pytest.raises(SnapshotError, match=reason):
        fetch_manifest(server.url_for(3), reference, credential=credential, timeout=5)


def test_a_refusal_is_final_and_a_body_past_the_announced_size_is_cut_off(learner) -> None:
    manifest, server, credential, root = learner
    reference = manifest_reference(manifest)
    began = time.monotonic()
    with pytest.raises(SnapshotError, match=r"manifest\.json: 403 ") as refused:
        fetch_manifest(server.url_for(3), reference, credential="e2t1.bogus", timeout=5, backoff_s=5.0)
    assert refused.value.status == 403 and time.monotonic() - began < 4  # not tried again after a 5 s backoff
    (version_dir(root, 3) / MANIFEST).write_text(" " * (reference.size + (64 << 10) + 1))
    with pytest.raises(SnapshotError, match=rf"announced {reference.size + (64 << 10) + 1} bytes, "
                                            rf"{reference.size + (64 << 10)} were declared$"):
        fetch_manifest(server.url_for(3), reference, credential=credential, timeout=5, retries=0)


def test_a_failed_server_is_tried_again_after_a_backoff_and_given_up_naming_the_url() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    body = manifest.model_dump_json().encode()
    answers = [503, 503, 200]
    asked: list[float] = []

    class Flaky(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(time.monotonic())
            status = answers.pop(0) if answers else 503
            reply = body if status == 200 else b"busy\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v3/"
    try:
        got = fetch_manifest(url, manifest_reference(manifest), timeout=5, retries=3, backoff_s=0.1)
        assert got == manifest and len(asked) == 3
        assert asked[1] - asked[0] >= 0.05 and asked[2] - asked[1] >= 0.1  # 0.1 s then 0.2 s, each at least half
        asked.clear()
        with pytest.raises(SnapshotError, match=rf"from {url}manifest\.json: 503 busy$"):
            fetch_manifest(url, manifest_reference(manifest), timeout=5, retries=2, backoff_s=0.05)
        assert len(asked) == 3  # the first try and two more
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(SnapshotError, match=rf"from {url}manifest\.json: .*(refused|Connection)"):
        fetch_manifest(url, manifest_reference(manifest), timeout=2, retries=1, backoff_s=0.05)


def test_a_server_trickling_the_manifest_is_given_up_after_each_tries_bound() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    stop = threading.Event()
    asked: list[float] = []

    class Trickle(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(time.monotonic())
            self.send_response(200)
            self.end_headers()  # no length: a byte every 0.1 s, never the end
            while not stop.wait(0.1):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v3/"
    try:
        began = time.monotonic()
        with pytest.raises(SnapshotError, match=r"manifest\.json: \d+ of the body's bytes by the deadline$"):
            fetch_manifest(url, manifest_reference(manifest), timeout=0.5, retries=1, backoff_s=0.05)
        assert len(asked) == 2 and time.monotonic() - began < 3  # each try cut at its 0.5 s, then one more
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
