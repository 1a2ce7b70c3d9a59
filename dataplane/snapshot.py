"""Policy snapshots: safetensors bytes cut into chunks, described by an immutable manifest.

The manifest carries the version, total size and each chunk's sha256, so a receiver verifies every
chunk on arrival and installs only a complete, verified snapshot.
"""

from __future__ import annotations

import hashlib
import urllib.request
from typing import Any

from pydantic import BaseModel, Field

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


class SnapshotError(ValueError):
    pass


class ChunkInfo(BaseModel):
    index: int = Field(ge=0)
    size: int = Field(ge=0)
    sha256: str = Field(min_length=64, max_length=64)


class Manifest(BaseModel):
    job_id: int
    version: int = Field(ge=0)
    format: str = Field(default="safetensors", max_length=32, description="safetensors (weights), or "
                        "checkpoint-tar for a job's base, version 0 (dataplane.basemodel).")
    total_bytes: int = Field(ge=0)
    chunk_bytes: int = Field(ge=1)
    chunks: list[ChunkInfo]
    sha256: str = Field(description="sha256 of the whole payload.")


def build_manifest(payload: bytes, *, job_id: int, version: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   format: str = "safetensors") -> Manifest:  # noqa: A002 - the manifest's field
    chunks = [
        ChunkInfo(index=i, size=len(part), sha256=hashlib.sha256(part).hexdigest())
        for i, part in enumerate(split(payload, chunk_bytes))
    ]
    return Manifest(job_id=job_id, version=version, format=format, total_bytes=len(payload), chunk_bytes=chunk_bytes,
                    chunks=chunks, sha256=hashlib.sha256(payload).hexdigest())


def split(payload: bytes, chunk_bytes: int) -> list[bytes]:
    return [payload[i : i + chunk_bytes] for i in range(0, len(payload), chunk_bytes)] or [b""]


def verify_chunk(manifest: Manifest, index: int, data: bytes) -> None:
    if not 0 <= index < len(manifest.chunks):
        raise SnapshotError(f"chunk {index}: manifest has {len(manifest.chunks)} chunks")
    info = manifest.chunks[index]
    if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
        raise SnapshotError(f"chunk {index} of version {manifest.version}: sha256 mismatch")


def assemble(manifest: Manifest, chunks: dict[int, bytes]) -> bytes:
    """Join verified chunks; raise unless every chunk is present and the whole payload hashes right."""
    missing = [c.index for c in manifest.chunks if c.index not in chunks]
    if missing:
        raise SnapshotError(f"version {manifest.version}: missing chunks {missing[:5]}")
    payload = b"".join(chunks[c.index] for c in manifest.chunks)
    if hashlib.sha256(payload).hexdigest() != manifest.sha256:
        raise SnapshotError(f"version {manifest.version}: payload sha256 mismatch")
    return payload


def parse_manifest(raw: dict[str, Any]) -> Manifest:
    try:
        return Manifest.model_validate(raw)
    except Exception as err:  # pydantic's error is long; the first line is the reason
        raise SnapshotError(f"manifest: {str(err).splitlines()[0]}") from None


def fetch_chunk(base_url: str, manifest: Manifest, index: int, *, timeout: float, retries: int = 3) -> bytes:
    """GET ``{base_url}chunks/{index}`` from a snapshot server and verify it, re-fetching a bad or failed
    copy up to ``retries`` times; raise SnapshotError naming the chunk when every attempt failed.

    The one HTTP path for chunks: agents without a chain parent, and relays falling back to the learner.
    """
    url = f"{base_url.rstrip('/')}/chunks/{index}"
    for attempt in range(retries + 1):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - the site hands out the URL
                data = response.read()
            verify_chunk(manifest, index, data)
            return data
        except (OSError, SnapshotError) as err:
            if attempt == retries:
                raise SnapshotError(f"chunk {index} of version {manifest.version} from {url}: {err}") from None
    raise AssertionError("unreachable")


def fetch_payload(base_url: str, manifest: Manifest, *, timeout: float = 30.0, retries: int = 3) -> bytes:
    """Every chunk of ``manifest`` from a snapshot server (:func:`fetch_chunk`), joined and checked whole: the
    path of an agent without a chain parent. Nothing is returned unless every chunk verified; turning the
    bytes into tensors is the receiver's business (this plane imports no torch)."""
    chunks = {info.index: fetch_chunk(base_url, manifest, info.index, timeout=timeout, retries=retries)
              for info in manifest.chunks}
    return assemble(manifest, chunks)
