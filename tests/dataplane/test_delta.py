"""Lossless deltas (dataplane/delta.py): a payload XORed with its base and compressed rebuilds bit for bit, in
chunks verified like any snapshot's; a corrupt chunk, a wrong base, a truncated or over-long stream are refused
with a reason, never installed."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
import zstandard

from dataplane.delta import ENCODING, DeltaEncoder, apply_delta, check_base, xor
from dataplane.snapshot import ChunkCutter, Manifest, SnapshotError, build_manifest, parse_manifest, split, verify_chunk

CHUNK = 4096


def cut(payload: bytes, version: int) -> tuple[Manifest, list[bytes]]:
    chunks: list[bytes] = []
    cutter = ChunkCutter(CHUNK, lambda index, data: chunks.append(data))
    for start in range(0, len(payload), 1000):  # written piece by piece, as the learner writes tensors
        cutter.write(payload[start:start + 1000])
    return Manifest(job_id=1, version=version, dtype="bf16", **cutter.finish()), chunks


def encode(new: bytes, base: bytes, *, version: int = 2, base_version: int = 1) -> tuple[Manifest, list[bytes],
                                                                                         Manifest, list[bytes]]:
    """The delta of ``new`` against ``base`` as the learner builds it: (delta manifest, delta chunks, base's)."""
    base_manifest, base_chunks = cut(base, base_version)
    delta_chunks: list[bytes] = []
    delta_cutter = ChunkCutter(CHUNK, lambda index, data: delta_chunks.append(data))
    encoder = DeltaEncoder(iter(base_chunks), delta_cutter.write)
    full_cutter = ChunkCutter(CHUNK, lambda index, data: encoder.add(data))
    full_cutter.write(new)
    full = Manifest(job_id=1, version=version, dtype="bf16", **full_cutter.finish())
    encoder.finish()
    delta = Manifest(job_id=1, version=version, dtype="bf16", **delta_cutter.finish(), kind="delta",
                     base_version=base_version, base_sha256=base_manifest.sha256, encoding=ENCODING, full=full)
    return delta, delta_chunks, base_manifest, base_chunks


def bf16_step(words: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A small update as bf16 sees one: ``fraction`` of the weights move by one unit in the last place."""
    rng = np.random.default_rng(seed)
    moved = words.copy()
    where = rng.random(words.size) < fraction
    moved[where] += rng.choice(np.array([1, 0xFFFF], dtype=np.uint16), where.sum())  # +1 or -1 ulp (mod 2^16)
    return moved


def test_the_cutter_cuts_as_build_manifest_does_however_the_bytes_are_written():
    payload = os.urandom(3 * CHUNK + 123)
    manifest, chunks = cut(payload, 3)
    assert manifest == build_manifest(payload, job_id=1, version=3, chunk_bytes=CHUNK).model_copy(
        update={"dtype": "bf16"})
    assert chunks == split(payload, CHUNK)
    empty, parts = cut(b"", 1)
    assert parts == [b""] and [c.size for c in empty.chunks] == [0]


@pytest.mark.parametrize("size", [1, CHUNK, 5 * CHUNK + 17])
def test_random_bytes_rebuild_bit_for_bit(size):
    base, new = os.urandom(size), os.urandom(size)
    delta, delta_chunks, base_manifest, base_chunks = encode(new, base)
    rebuilt = apply_delta(delta, delta_chunks, base_manifest, base_chunks)
    assert b"".join(rebuilt) == new and [len(c) for c in rebuilt] == [c.size for c in delta.full.chunks]


def test_a_small_bf16_update_is_a_small_delta_and_rebuilds_exactly():
    words = np.random.default_rng(0).integers(0x3C00, 0x3F80, 200_000, dtype=np.uint16)  # bf16 weights near 0.01-1
    stepped = bf16_step(words, 0.03, seed=1)
    delta, delta_chunks, base_manifest, base_chunks = encode(stepped.tobytes(), words.tobytes())
    assert delta.total_bytes < 0.12 * delta.full.total_bytes  # 3 % of the weights moved
    rebuilt = np.frombuffer(b"".join(apply_delta(delta, delta_chunks, base_manifest, base_chunks)), dtype=np.uint16)
    assert np.array_equal(rebuilt, stepped)
    same, same_chunks, *_ = encode(words.tobytes(), words.tobytes())
    assert same.total_bytes < 200  # nothing moved: a few bytes of zstd


def test_the_delta_travels_through_its_manifest_and_each_chunk_verifies():
    delta, delta_chunks, *_ = encode(os.urandom(3 * CHUNK), os.urandom(3 * CHUNK))
    received = parse_manifest(delta.model_dump(mode="json"))
    assert received == delta and received.kind == "delta" and received.full.kind == "full"
    for index, data in enumerate(delta_chunks):
        verify_chunk(received, index, data)
    with pytest.raises(SnapshotError, match=r"^chunk 0 of version 2: sha256 mismatch$"):
        verify_chunk(received, 0, bytes([delta_chunks[0][0] ^ 1]) + delta_chunks[0][1:])


def test_a_wrong_base_is_refused_naming_both_versions():
    base, new = os.urandom(2 * CHUNK), os.urandom(2 * CHUNK)
    delta, delta_chunks, base_manifest, base_chunks = encode(new, base, version=5, base_version=4)
    other, other_chunks = cut(os.urandom(2 * CHUNK), 4)  # version 4, but other bytes
    with pytest.raises(SnapshotError, match=r"^version 5 is a delta against version 4 \(sha256 .*\), not against "
                                            r"the full version 4"):
        apply_delta(delta, delta_chunks, other, other_chunks)
    older, older_chunks = cut(base, 3)
    with pytest.raises(SnapshotError, match="not against the full version 3"):
        check_base(delta, older)
    with pytest.raises(SnapshotError, match="is a full snapshot, not a delta"):
        check_base(base_manifest, base_manifest)


def test_base_chunks_that_are_not_the_ones_hashed_are_caught_by_the_learners_digest():
    base, new = os.urandom(2 * CHUNK), os.urandom(2 * CHUNK)
    delta, delta_chunks, base_manifest, base_chunks = encode(new, base)
    damaged = [base_chunks[0], bytes(CHUNK)]  # the held copy rotted: the manifest's sha256 no longer holds
    with pytest.raises(SnapshotError, match=r"^version 2: the rebuilt payload's sha256 is not the learner's$"):
        apply_delta(delta, delta_chunks, base_manifest, damaged)
    with pytest.raises(SnapshotError, match="do not match its manifest"):
        apply_delta(delta, delta_chunks, base_manifest, base_chunks[:1])


def test_a_stream_that_is_corrupt_short_or_too_long_is_refused():
    base, new = os.urandom(2 * CHUNK), os.urandom(2 * CHUNK)
    delta, delta_chunks, base_manifest, base_chunks = encode(new, base)
    stream = b"".join(delta_chunks)
    with pytest.raises(SnapshotError, match="does not decompress"):
        apply_delta(delta, [b"not a zstd frame" + stream[16:]], base_manifest, base_chunks)
    with pytest.raises(SnapshotError, match="rebuilt payload's sha256 is not the learner's"):
        apply_delta(delta, [stream[:-100] + bytes(100)], base_manifest, base_chunks)  # damaged, still zstd
    short = zstandard.ZstdCompressor().compress(xor(new, base)[:CHUNK])
    with pytest.raises(SnapshotError, match="ends before chunk 1"):
        apply_delta(delta, [short], base_manifest, base_chunks)
    bomb = zstandard.ZstdCompressor().compress(xor(new, base) + bytes(100 * CHUNK))  # would expand past the full
    with pytest.raises(SnapshotError, match="longer than the full payload"):
        apply_delta(delta, [bomb], base_manifest, base_chunks)


def test_the_encoder_refuses_payloads_of_other_lengths():
    base_chunks = split(os.urandom(2 * CHUNK), CHUNK)
    encoder = DeltaEncoder(iter(base_chunks), lambda data: None)
    encoder.add(os.urandom(CHUNK))
    with pytest.raises(SnapshotError, match="base has more chunks"):
        encoder.finish()
    encoder = DeltaEncoder(iter(base_chunks), lambda data: None)
    with pytest.raises(SnapshotError, match="cannot XOR 10 bytes with 4096"):
        encoder.add(b"0123456789")


def test_old_manifests_read_as_full_and_a_half_described_delta_is_refused_in_one_line():
    old = build_manifest(b"weights", job_id=1, version=2).model_dump(mode="json")
    for key in ("kind", "dtype", "base_version", "base_sha256", "encoding", "full"):
        old.pop(key)  # what a learner before deltas sent
    assert parse_manifest(old).kind == "full" and parse_manifest(old).dtype is None
    delta, *_ = encode(os.urandom(CHUNK), os.urandom(CHUNK))
    raw = delta.model_dump(mode="json")
    cases = {
        "manifest: a delta needs base_sha256": raw | {"base_sha256": None},
        "manifest: encoding: Input should be 'xor-zstd'": raw | {"encoding": "xor-gzip"},
        "manifest: kind: Input should be 'full' or 'delta'": raw | {"kind": "patch"},
        "manifest: base_version: a delta of version 2 applies to an earlier version, not 2": raw | {"base_version": 2},
        "manifest: full: must be the full snapshot of job 1 version 2": raw | {"full": raw["full"] | {"version": 3}},
        "manifest: a full snapshot has no base_version, encoding (only a delta does)":
            raw["full"] | {"base_version": 1, "encoding": "xor-zstd"},
    }
    for reason, bad in cases.items():
        with pytest.raises(SnapshotError) as err:
            parse_manifest(bad)
        assert str(err.value).startswith(reason) and "\n" not in str(err.value), str(err.value)
    assert hashlib.sha256(b"weights").hexdigest() == old["sha256"]
