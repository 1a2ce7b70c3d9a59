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
