"""The on-disk snapshot layout: a version written is read back byte for byte, appears whole or not at all,
and pruning keeps the newest versions."""

from __future__ import annotations

import os

import pytest

from dataplane.broadcast import store
from dataplane.snapshot import SnapshotError, assemble, build_manifest


def publish(root, version: int, size: int = 10_000) -> bytes:
    payload = os.urandom(size)
    store.write_version(root, build_manifest(payload, job_id=1, version=version, chunk_bytes=4096), payload)
    return payload


def test_a_written_version_reads_back_as_the_same_payload(tmp_path):
    payload = publish(tmp_path, 3)

    path = store.version_dir(tmp_path, 3)
    manifest, chunks = store.read_version(path)

    assert path == tmp_path / "v3"
    assert sorted(p.name for p in (path / "chunks").iterdir()) == ["0", "1", "2"]
    assert manifest.version == 3 and assemble(manifest, chunks) == payload


def test_a_rewritten_version_replaces_the_old_one_and_leaves_no_temp_directory(tmp_path):
    publish(tmp_path, 1, size=9000)
    payload = publish(tmp_path, 1, size=100)

    manifest, chunks = store.read_version(tmp_path / "v1")

    assert assemble(manifest, chunks) == payload and len(chunks) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]


def test_a_half_written_version_is_not_listed(tmp_path):
    publish(tmp_path, 1)
    (tmp_path / ".v2.tmp" / "chunks").mkdir(parents=True)  # a writer that died before its rename

    assert store.list_versions(tmp_path) == [1]


def test_a_payload_that_does_not_match_its_manifest_is_refused(tmp_path):
    payload = os.urandom(10_000)
    manifest = build_manifest(payload, job_id=1, version=2, chunk_bytes=4096)

    with pytest.raises(SnapshotError, match="version 2: payload of 9999 bytes"):
        store.write_version(tmp_path, manifest, payload[:-1])
    assert store.list_versions(tmp_path) == []


def test_pruning_keeps_the_newest_versions(tmp_path):
    for version in (2, 10, 3, 11):
        publish(tmp_path, version, size=10)

    assert store.prune_versions(tmp_path, keep=2) == [2, 3]
    assert store.list_versions(tmp_path) == [10, 11]


def test_a_missing_version_is_a_snapshot_error_naming_the_directory(tmp_path):
    with pytest.raises(SnapshotError, match="v7"):
        store.read_version(tmp_path / "v7")
