"""Snapshots: chunked payloads round-trip through their manifest; a corrupt or missing chunk is refused."""

from __future__ import annotations

import hashlib
import json

import pytest

from dataplane.snapshot import SnapshotError, assemble, build_manifest, parse_manifest, split, verify_chunk

PAYLOAD = bytes(range(256)) * 10 + b"tail"  # 2564 bytes: chunks of 1000, 1000 and 564


def test_manifest_describes_each_chunk() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)

    assert (manifest.job_id, manifest.version, manifest.total_bytes, manifest.chunk_bytes) == (7, 3, 2564, 1000)
    assert [c.size for c in manifest.chunks] == [1000, 1000, 564]
    assert [c.index for c in manifest.chunks] == [0, 1, 2]
    assert manifest.chunks[2].sha256 == hashlib.sha256(PAYLOAD[2000:]).hexdigest()
    assert manifest.sha256 == hashlib.sha256(PAYLOAD).hexdigest()


def test_round_trip_through_json_manifest_verify_and_assemble() -> None:
    sent = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    received = parse_manifest(json.loads(json.dumps(sent.model_dump(mode="json"))))
    assert received == sent

    chunks = dict(enumerate(split(PAYLOAD, 1000)))
    for index, data in chunks.items():
        verify_chunk(received, index, data)

    assert assemble(received, chunks) == PAYLOAD


def test_payload_of_exactly_one_chunk_and_empty_payload_round_trip() -> None:
    exact = build_manifest(b"x" * 1000, job_id=1, version=0, chunk_bytes=1000)
    assert len(exact.chunks) == 1
    assert assemble(exact, {0: b"x" * 1000}) == b"x" * 1000

    empty = build_manifest(b"", job_id=1, version=0, chunk_bytes=1000)
    assert [c.size for c in empty.chunks] == [0]
    verify_chunk(empty, 0, b"")
    assert assemble(empty, {0: b""}) == b""


def test_corrupted_chunk_fails_verification() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    chunk = bytearray(split(PAYLOAD, 1000)[1])
    chunk[500] ^= 0xFF

    with pytest.raises(SnapshotError, match=r"^chunk 1 of version 3: sha256 mismatch$"):
        verify_chunk(manifest, 1, bytes(chunk))


def test_truncated_or_misplaced_chunk_fails_verification() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    parts = split(PAYLOAD, 1000)

    with pytest.raises(SnapshotError, match="chunk 2"):
        verify_chunk(manifest, 2, parts[2][:-1])
    with pytest.raises(SnapshotError, match="chunk 0"):
        verify_chunk(manifest, 0, parts[1])  # right size, wrong place
    with pytest.raises(SnapshotError, match=r"^chunk 3: manifest has 3 chunks$"):
        verify_chunk(manifest, 3, parts[2])
    with pytest.raises(SnapshotError, match="chunk -1"):
        verify_chunk(manifest, -1, parts[2])


def test_missing_chunk_fails_assembly() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    parts = split(PAYLOAD, 1000)

    with pytest.raises(SnapshotError, match=r"^version 3: missing chunks \[1\]$"):
        assemble(manifest, {0: parts[0], 2: parts[2]})


def test_swapped_chunks_fail_assembly() -> None:
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    parts = split(PAYLOAD, 1000)

    with pytest.raises(SnapshotError, match=r"^version 3: payload sha256 mismatch$"):
        assemble(manifest, {0: parts[1], 1: parts[0], 2: parts[2]})


def test_malformed_manifest_is_refused_in_one_line() -> None:
    raw = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000).model_dump(mode="json")
    raw["chunks"][0]["sha256"] = "abc"

    with pytest.raises(SnapshotError, match=r"^manifest: ") as err:
        parse_manifest(raw)
    assert "\n" not in str(err.value)


def test_fetch_chunk_refetches_a_bad_copy_and_names_the_chunk_when_it_stays_bad(tmp_path):
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from dataplane.snapshot import SnapshotError, build_manifest, fetch_chunk

    payload = bytes(range(256)) * 8
    manifest = build_manifest(payload, job_id=1, version=3, chunk_bytes=512)
    (tmp_path / "chunks").mkdir()
    for i in range(4):
        (tmp_path / "chunks" / str(i)).write_bytes(payload[i * 512:(i + 1) * 512])
    (tmp_path / "chunks" / "2").write_bytes(b"corrupt")
    served: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            served.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        assert fetch_chunk(base, manifest, 1, timeout=5) == payload[512:1024]
        with pytest.raises(SnapshotError, match="chunk 2 of version 3"):
            fetch_chunk(base, manifest, 2, timeout=5, retries=2)
        assert sum(p.endswith("/chunks/2") for p in served) == 3  # the first try and two re-fetches
    finally:
        server.shutdown()


def test_fetch_payload_returns_the_whole_verified_snapshot_and_nothing_when_a_chunk_stays_bad(tmp_path):
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from dataplane.broadcast.store import write_version
    from dataplane.snapshot import fetch_payload

    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    write_version(tmp_path, manifest, PAYLOAD)
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v3/"
    try:
        assert fetch_payload(base, manifest, timeout=5) == PAYLOAD
        (tmp_path / "v3" / "chunks" / "1").write_bytes(b"x" * 1000)
        with pytest.raises(SnapshotError, match="chunk 1 of version 3"):
            fetch_payload(base, manifest, timeout=5, retries=1)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("change", "reason"), [
    (lambda raw: raw.update(total_bytes=3001), "manifest: 3 chunks, but 3001 bytes in chunks of 1000 make 4"),
    (lambda raw: raw["chunks"].reverse(), "manifest: chunk 0 must have index 0 and size 1000, not index 2"),
    (lambda raw: raw["chunks"][1].update(size=999), "manifest: chunk 1 must have index 1 and size 1000"),
    (lambda raw: raw.update(sha256="A" * 64), "manifest: sha256: String should match pattern"),
    (lambda raw: raw["chunks"][2].update(sha256="g" * 64), "manifest: chunks.2.sha256: String should match pattern"),
    (lambda raw: raw.update(chunks=[]), "manifest: chunks: List should have at least 1 item"),
    (lambda raw: raw.pop("job_id"), "manifest: job_id: Field required"),
])
def test_a_manifest_of_the_wrong_shape_is_refused_naming_the_field(change, reason) -> None:
    raw = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000).model_dump(mode="json")
    change(raw)
    with pytest.raises(SnapshotError) as err:
        parse_manifest(raw)
    assert str(err.value).startswith(reason) and "\n" not in str(err.value)


def test_the_learners_whole_payload_digest_is_what_a_receiver_checks() -> None:
    # Every chunk matches its own hash, but the learner's digest of the whole payload does not: refused.
    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    other = parse_manifest(manifest.model_dump(mode="json") | {"sha256": hashlib.sha256(b"other").hexdigest()})
    chunks = dict(enumerate(split(PAYLOAD, 1000)))
    for index, data in chunks.items():
        verify_chunk(other, index, data)
    with pytest.raises(SnapshotError, match=r"^version 3: payload sha256 mismatch$"):
        assemble(other, chunks)
    assert hashlib.sha256(assemble(manifest, chunks)).hexdigest() == manifest.sha256


def test_fetch_chunk_shows_its_credential_and_takes_a_refusal_as_final(tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from dataplane.snapshot import fetch_chunk

    manifest = build_manifest(PAYLOAD, job_id=7, version=3, chunk_bytes=1000)
    seen: list[str | None] = []

    class Gate(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer good"
            body = split(PAYLOAD, 1000)[0] if ok else b"credential expired 3 s ago\n"
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/v3/"
    try:
        assert fetch_chunk(base, manifest, 0, timeout=5, credential="good") == PAYLOAD[:1000]
        with pytest.raises(SnapshotError, match=r"chunk 0 of version 3 from .*: 403 credential expired 3 s ago$"):
            fetch_chunk(base, manifest, 0, timeout=5, retries=3, credential="stale")
        assert seen == ["Bearer good", "Bearer stale"]  # shown every time; the refusal was not asked again
    finally:
        server.shutdown()
