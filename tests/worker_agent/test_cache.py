"""The agent's cache of base snapshots: by digest, checked on use, least recently used evicted beyond its size."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from dataplane import basemodel
from worker_agent.cache import BaseCache, CacheError


def base(tmp_path: Path, name: str, size: int) -> tuple[str, bytes]:
    """A checkpoint directory of about ``size`` bytes; returns (digest, payload)."""
    directory = tmp_path / "learner" / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(f'{{"name": "{name}"}}')
    (directory / "model.safetensors").write_bytes(os.urandom(size))
    payload = basemodel.pack(directory)
    return hashlib.sha256(payload).hexdigest(), payload


def test_least_recently_used_bases_are_evicted_beyond_the_limit(tmp_path):
    a, b, c = (base(tmp_path, name, 40_000) for name in "abc")
    cache = BaseCache(tmp_path / "cache", max_bytes=100_000)  # room for two
    cache.put(*a)
    time.sleep(0.01)
    cache.put(*b)
    time.sleep(0.01)
    assert cache.get(a[0]) is not None  # a used again: b is now the least recently used
    time.sleep(0.01)
    cache.put(*c)
    assert [e.digest for e in cache.entries()] == [a[0], c[0]]
    assert cache.get(b[0]) is None


def test_the_base_in_use_is_kept_even_when_larger_than_the_limit(tmp_path):
    small, large = base(tmp_path, "small", 10_000), base(tmp_path, "large", 50_000)
    cache = BaseCache(tmp_path / "cache", max_bytes=20_000)
    cache.put(*small)
    path = cache.put(*large)
    assert [e.digest for e in cache.entries()] == [large[0]] and (path / "model.safetensors").is_file()


def test_an_entry_serves_the_exact_files_and_a_damaged_one_is_dropped(tmp_path):
    digest, payload = base(tmp_path, "a", 5_000)
    cache = BaseCache(tmp_path / "cache", max_bytes=10**6)
    path = cache.put(digest, payload)
    assert path == tmp_path / "cache" / digest
    assert (path / "model.safetensors").read_bytes() == (tmp_path / "learner" / "a" / "model.safetensors").read_bytes()
    assert cache.payload(digest) == payload  # re-packed for a chain child: the bytes the learner published
    (path / "model.safetensors").write_bytes(b"tampered")
    assert cache.get(digest) is None and not path.exists()


def test_two_jobs_sharing_a_digest_share_one_entry(tmp_path):
    digest, payload = base(tmp_path, "a", 5_000)
    cache = BaseCache(tmp_path / "cache", max_bytes=10**6)
    first = cache.put(digest, payload)
    again = BaseCache(tmp_path / "cache", max_bytes=10**6).put(digest, payload)  # another job, or another agent
    assert first == again and len(cache.entries()) == 1 and cache.get(digest) == first
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_a_payload_must_hash_to_its_digest_and_a_digest_must_be_hex(tmp_path):
    digest, payload = base(tmp_path, "a", 1_000)
    cache = BaseCache(tmp_path / "cache", max_bytes=10**6)
    with pytest.raises(CacheError, match="does not hash"):
        cache.put(digest, payload + b"\0")
    with pytest.raises(CacheError, match="not a sha256"):
        cache.get("../../etc")
    assert cache.entries() == []
