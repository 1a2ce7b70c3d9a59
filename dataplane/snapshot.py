"""Policy snapshots: safetensors bytes cut into chunks, described by an immutable manifest.

The manifest carries the version, total size, each chunk's sha256 and the learner's digest of the whole payload
(``sha256``), so a receiver verifies every chunk on arrival and installs only a complete snapshot whose bytes
hash to the learner's digest. The manifest reaches agents from the site (which checked its shape with
:func:`parse_manifest`), never from a peer. Chunks come over HTTP with the worker's transfer credential
(``Authorization: Bearer``, :mod:`dataplane.credentials`).
"""

from __future__ import annotations

import hashlib
import math
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


class SnapshotError(ValueError):
    pass


SHA256_HEX = r"^[0-9a-f]{64}$"


class ChunkInfo(BaseModel):
    index: int = Field(ge=0)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256_HEX)


class Manifest(BaseModel):
    """A snapshot's description. Its shape is checked: chunks ``0..n-1`` in order, each ``chunk_bytes`` but the
    last, adding up to ``total_bytes`` (exactly how :func:`build_manifest` cuts a payload)."""

    job_id: int = Field(ge=1)
    version: int = Field(ge=0)
    format: str = Field(default="safetensors", max_length=32, description="safetensors (weights), or "
                        "checkpoint-tar for a job's base, version 0 (dataplane.basemodel).")
    total_bytes: int = Field(ge=0)
    chunk_bytes: int = Field(ge=1)
    chunks: list[ChunkInfo] = Field(min_length=1)
    sha256: str = Field(pattern=SHA256_HEX, description="The learner's sha256 of the whole payload: a receiver "
                        "installs only bytes that hash to it.")

    @model_validator(mode="after")
    def _cut_as_built(self) -> Manifest:
        expected = max(1, math.ceil(self.total_bytes / self.chunk_bytes))
        if len(self.chunks) != expected:
            raise ValueError(f"{len(self.chunks)} chunks, but {self.total_bytes} bytes in chunks of {self.chunk_bytes} "
                             f"make {expected}")
        for position, info in enumerate(self.chunks):
            size = min(self.chunk_bytes, self.total_bytes - position * self.chunk_bytes)
            if info.index != position or info.size != size:
                raise ValueError(f"chunk {position} must have index {position} and size {size}, not index "
                                 f"{info.index} and size {info.size}")
        return self


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


def parse_manifest(raw: Any) -> Manifest:
    """A manifest, or one line naming the field: ``manifest: chunks.0.sha256: String should match ...``."""
    if not isinstance(raw, dict):
        raise SnapshotError("manifest: must be a JSON object")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f"{p}: " if i == len(first["loc"]) - 1 else f"{p}." for i, p in enumerate(first["loc"]))
        raise SnapshotError(f"manifest: {where}{first['msg'].removeprefix('Value error, ')}") from None


def fetch_chunk(base_url: str, manifest: Manifest, index: int, *, timeout: float, retries: int = 3,
                credential: str | None = None) -> bytes:
    """GET ``{base_url}chunks/{index}`` from a snapshot server (with ``Authorization: Bearer <credential>``) and
    verify it, re-fetching a bad or failed copy up to ``retries`` times; raise SnapshotError naming the chunk
    when every attempt failed. A refusal (4xx: no or a bad credential, a version gone) is not retried.

    The one HTTP path for chunks: agents without a chain parent, and relays falling back to the learner.
    """
    url = f"{base_url.rstrip('/')}/chunks/{index}"
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    for attempt in range(retries + 1):
        try:
            request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the site hands out the URL
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
                data = response.read()
            verify_chunk(manifest, index, data)
            return data
        except urllib.error.HTTPError as err:
            if 400 <= err.code < 500 or attempt == retries:
                reason = err.read(500).decode(errors="replace").strip() or err.reason
                raise SnapshotError(f"chunk {index} of version {manifest.version} from {url}: {err.code} "
                                    f"{reason}") from None
        except (OSError, SnapshotError) as err:
            if attempt == retries:
                raise SnapshotError(f"chunk {index} of version {manifest.version} from {url}: {err}") from None
    raise AssertionError("unreachable")


def fetch_payload(base_url: str, manifest: Manifest, *, timeout: float = 30.0, retries: int = 3,
                  credential: str | None = None) -> bytes:
    """Every chunk of ``manifest`` from a snapshot server (:func:`fetch_chunk`), joined and checked whole against
    the learner's digest: the path of an agent without a chain parent. Nothing is returned unless every chunk
    verified; turning the bytes into tensors is the receiver's business (this plane imports no torch)."""
    chunks = {info.index: fetch_chunk(base_url, manifest, info.index, timeout=timeout, retries=retries,
                                      credential=credential)
              for info in manifest.chunks}
    return assemble(manifest, chunks)
