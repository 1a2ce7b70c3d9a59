"""Policy snapshots: safetensors bytes cut into chunks, described by an immutable manifest.

The manifest carries the version, total size, each chunk's sha256 and the learner's digest of the whole payload
(``sha256``), so a receiver verifies every chunk on arrival and installs only a complete snapshot whose bytes
hash to the learner's digest. A snapshot is ``full`` (the weights, in ``dtype``) or a ``delta`` against an
earlier version (:mod:`dataplane.delta`): then ``base_version``/``base_sha256`` name the full payload it applies
to and ``full`` is the manifest of the full payload it rebuilds, served under ``{url}full/`` to a receiver that
lacks the base (docs/broadcast.md "Formats"). A manifest without ``kind`` (older learners) is a full one.
The site checks a manifest's shape (:func:`parse_manifest`) before announcing its version, and tells agents only
its reference (:func:`manifest_reference`: the sha256 and size of its canonical JSON); each agent takes the
manifest once, from its chain parent's relay ``accept`` or from the learner's server, ``{url}manifest.json``
(:func:`fetch_manifest`), and uses it only when it hashes to that reference (:func:`verified_manifest`), so it holds
exactly what the site checked, never what a peer or a server says instead.
Manifest and chunks come over HTTP with the worker's transfer credential (``Authorization: Bearer``,
:mod:`dataplane.credentials`).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, get_args

from pydantic import BaseModel, Field, ValidationError, model_validator

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
MAX_CHUNK_BYTES = 64 << 20
"""The largest chunk a manifest may declare (16 x what the learner cuts): every receiver reads at most a chunk's
declared size, so this bounds what one read of a peer or a server can cost."""
MAX_CHUNKS = 1 << 17
"""The most chunks a manifest may list: a relay's ``hello`` naming every index still fits its 1 MiB header."""
MAX_MANIFEST_BYTES = 64 << 20
"""The largest manifest a ``snapshot`` message may refer to: :data:`MAX_CHUNKS` chunks, and a delta's ``full``
manifest as many again, at ~110 bytes each."""
MAX_SNAPSHOT_BYTES = MAX_CHUNKS * MAX_CHUNK_BYTES
"""What the manifest's shape allows at most (8 TiB); the site bounds it further (``ECHO2_MAX_SNAPSHOT_BYTES``)."""
FULL = "full"  # where a delta version's full payload lives: {url}full/manifest.json, {url}full/chunks/<i>
DeltaEncoding = Literal["xor-zstd"]
DELTA_ENCODINGS: tuple[str, ...] = get_args(DeltaEncoding)


class SnapshotError(ValueError):
    """A snapshot that cannot be had; ``status`` is the HTTP status of a server's refusal (None otherwise)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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
    total_bytes: int = Field(ge=0, le=MAX_SNAPSHOT_BYTES)
    chunk_bytes: int = Field(ge=1, le=MAX_CHUNK_BYTES)
    chunks: list[ChunkInfo] = Field(min_length=1, max_length=MAX_CHUNKS)
    sha256: str = Field(pattern=SHA256_HEX, description="The learner's sha256 of the whole payload: a receiver "
                        "installs only bytes that hash to it.")
    kind: Literal["full", "delta"] = Field(default="full", description="full: the payload is the weights; delta: "
                                           "it rebuilds them from the full payload of base_version.")
    dtype: Literal["bf16", "fp32"] | None = Field(default=None, description="The weights' floating-point dtype "
                                                  "(None: not said; older learners published fp32).")
    base_version: int | None = Field(default=None, ge=1, description="delta: the version it applies to.")
    base_sha256: str | None = Field(default=None, pattern=SHA256_HEX, description="delta: the sha256 of that "
                                    "version's full payload: a receiver holding other bytes refuses the delta.")
    encoding: DeltaEncoding | None = Field(default=None, description="delta: how the payload encodes "
                                                      "the difference (xor-zstd: dataplane.delta).")
    full: Manifest | None = Field(default=None, description="delta: the manifest of the full payload it "
                                  "rebuilds (its sha256 is the rebuilt payload's), served under {url}full/.")

    @model_validator(mode="after")
    def _kind_fits(self) -> Manifest:
        delta_fields = {"base_version": self.base_version, "base_sha256": self.base_sha256,
                        "encoding": self.encoding, "full": self.full}
        if self.kind == "full":
            given = [name for name, value in delta_fields.items() if value is not None]
            if given:
                raise ValueError(f"a full snapshot has no {', '.join(given)} (only a delta does)")
            return self
        missing = [name for name, value in delta_fields.items() if value is None]
        if missing:
            raise ValueError(f"a delta needs {', '.join(missing)}")
        full = self.full
        if self.base_version >= self.version:
            raise ValueError(f"base_version: a delta of version {self.version} applies to an earlier version, "
                             f"not {self.base_version}")
        if full.kind != "full" or (full.job_id, full.version) != (self.job_id, self.version):
            raise ValueError(f"full: must be the full snapshot of job {self.job_id} version {self.version}")
        if (full.format, full.dtype) != (self.format, self.dtype):
            raise ValueError("full: must have the delta's format and dtype")
        return self

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


class ChunkCutter:
    """Cut bytes written piece by piece (a tensor at a time) into chunks of ``chunk_bytes``, as
    :func:`build_manifest` cuts a whole payload, without ever holding more than one chunk: each complete chunk
    goes to ``emit(index, data)`` at once; :meth:`finish` emits the last and returns the manifest's fields."""

    def __init__(self, chunk_bytes: int, emit: Callable[[int, bytes], None]) -> None:
        if chunk_bytes < 1:
            raise SnapshotError(f"chunk_bytes must be >= 1, not {chunk_bytes}")
        self.chunk_bytes, self.emit = chunk_bytes, emit
        self.chunks: list[ChunkInfo] = []
        self.total = 0
        self._whole = hashlib.sha256()
        self._buffer = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        position = 0
        while position < len(view):
            take = min(self.chunk_bytes - len(self._buffer), len(view) - position)
            self._buffer += view[position:position + take]
            position += take
            if len(self._buffer) == self.chunk_bytes:
                self._cut()

    def _cut(self) -> None:
        data = bytes(self._buffer)
        self._buffer = bytearray()
        self._whole.update(data)
        self.total += len(data)
        info = ChunkInfo(index=len(self.chunks), size=len(data), sha256=hashlib.sha256(data).hexdigest())
        self.chunks.append(info)
        self.emit(info.index, data)

    def finish(self) -> dict[str, Any]:
        """Emit what is left (an empty payload is one empty chunk); returns ``total_bytes``, ``chunk_bytes``,
        ``chunks`` and ``sha256`` for a :class:`Manifest`."""
        if self._buffer or not self.chunks:
            self._cut()
        return {"total_bytes": self.total, "chunk_bytes": self.chunk_bytes, "chunks": self.chunks,
                "sha256": self._whole.hexdigest()}


def verify_chunk(manifest: Manifest, index: int, data: bytes) -> None:
    if not 0 <= index < len(manifest.chunks):
        raise SnapshotError(f"chunk {index}: manifest has {len(manifest.chunks)} chunks")
    info = manifest.chunks[index]
    if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
        raise SnapshotError(f"chunk {index} of version {manifest.version}: sha256 mismatch")


def ordered_chunks(manifest: Manifest, chunks: Mapping[int, bytes], *, digest: str | None = None) -> list[bytes]:
    """The verified chunks in order, hashed as one payload without joining them (no second copy of a model);
    raise unless every chunk is present and the whole payload hashes to the learner's digest. ``digest``: the sha256
    of exactly these chunks in order, already computed as they arrived (a relay's ChunkBook), so not hashed again."""
    missing = [c.index for c in manifest.chunks if c.index not in chunks]
    if missing:
        raise SnapshotError(f"version {manifest.version}: missing chunks {missing[:5]}")
    ordered = [chunks[c.index] for c in manifest.chunks]
    if digest is None:
        whole = hashlib.sha256()
        for data in ordered:
            whole.update(data)
        digest = whole.hexdigest()
    if digest != manifest.sha256:
        raise SnapshotError(f"version {manifest.version}: payload sha256 mismatch")
    return ordered


def assemble(manifest: Manifest, chunks: Mapping[int, bytes]) -> bytes:
    """Join verified chunks; raise unless every chunk is present and the whole payload hashes right."""
    return b"".join(ordered_chunks(manifest, chunks))


def full_url(url: str) -> str:
    """Where a delta version's full payload is served, given the version's URL."""
    return f"{url.rstrip('/')}/{FULL}/"


def parse_manifest(raw: Any, *, max_total_bytes: int = MAX_SNAPSHOT_BYTES) -> Manifest:
    """A manifest, or one line naming the field: ``manifest: chunks.0.sha256: String should match ...``.

    Bounded as well as shaped: chunks of at most :data:`MAX_CHUNK_BYTES`, at most :data:`MAX_CHUNKS` of them, and
    ``total_bytes`` (a delta's ``full`` payload too) at most ``max_total_bytes`` (the site's setting)."""
    if not isinstance(raw, dict):
        raise SnapshotError("manifest: must be a JSON object")
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f"{p}: " if i == len(first["loc"]) - 1 else f"{p}." for i, p in enumerate(first["loc"]))
        raise SnapshotError(f"manifest: {where}{first['msg'].removeprefix('Value error, ')}") from None
    for where, part in (("", manifest), ("full.", manifest.full)):
        if part is not None and part.total_bytes > max_total_bytes:
            raise SnapshotError(f"manifest: {where}total_bytes: {part.total_bytes} bytes, this site takes snapshots "
                                f"of at most {max_total_bytes}")
    return manifest


class ManifestReference(NamedTuple):
    """What a ``snapshot`` message says of its manifest instead of carrying it: the sha256 and the size of the
    manifest's canonical JSON (:func:`canonical_manifest`)."""

    sha256: str
    size: int


def canonical_manifest(manifest: Manifest | Mapping[str, Any]) -> bytes:
    """The bytes a manifest's reference hashes: its JSON, every field the model has (``model_dump(mode="json")``,
    as the site stores it), keys sorted, no spaces, ASCII. The learner serves its own serialization of the same
    manifest (field order, an older learner's missing defaults), so both ends hash this form of what they hold,
    never the bytes as they travelled."""
    data = manifest.model_dump(mode="json") if isinstance(manifest, Manifest) else manifest
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def manifest_reference(manifest: Manifest | Mapping[str, Any]) -> ManifestReference:
    """The reference a ``snapshot`` message carries for ``manifest`` (a :class:`Manifest`, or its JSON as the site
    stored it after :func:`parse_manifest`)."""
    data = canonical_manifest(manifest)
    return ManifestReference(hashlib.sha256(data).hexdigest(), len(data))


MANIFEST_SLACK_BYTES = 64 << 10
"""What a served manifest may exceed its reference's size by (its own serialization: escapes, spacing): the read is
bounded by the size announced, never by the server."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A snapshot server never redirects: following one would let it point the fetcher anywhere (its own machine,
    a metadata service) past the address rules the URL was checked by."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 - urllib's signature
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} refused", headers, fp)


_OPENER = urllib.request.build_opener(_NoRedirects)


def read_bounded(response: Any, size: int, *, deadline: float | None = None) -> bytes:
    """At most ``size`` bytes of ``response`` (an HTTP response), refused the moment it says or sends more: a
    ``Content-Length`` over ``size`` is refused before a byte is read, and a body that goes on is cut off after
    ``size + 1`` bytes, so a server sending far more than declared costs at most one declared size. ``deadline``
    (``time.monotonic()``): the body is read piece by piece and given up once it passes (a server trickling bytes
    never trips a per-read timeout)."""
    length = response.headers.get("Content-Length")
    if length is not None and (not length.strip().isdigit() or int(length) > size):
        raise SnapshotError(f"the server announced {length.strip()[:20]} bytes, {size} were declared")
    data = response.read(size + 1) if deadline is None else _read_until(response, size + 1, deadline)
    if len(data) > size:
        raise SnapshotError(f"the server sent more than the {size} bytes declared")
    return data


def _read_until(response: Any, size: int, deadline: float) -> bytes:
    parts, got = [], 0
    while got < size:
        if time.monotonic() > deadline:
            raise SnapshotError(f"{got} of the body's bytes by the deadline")
        piece = response.read1(min(size - got, 1 << 16))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


def _get(url: str, *, credential: str | None, limit: int, timeout: float, deadline: float | None) -> bytes:
    """One GET of ``url`` from a snapshot server, with the worker's credential, reading at most ``limit`` bytes."""
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - the site hands out the URL
    with _OPENER.open(request, timeout=timeout) as response:
        return read_bounded(response, limit, deadline=deadline)


def _refusal(what: str, err: urllib.error.HTTPError) -> SnapshotError:
    """A server's refusal of ``what`` as the SnapshotError that names it, with the server's reason."""
    reason = err.read(500).decode(errors="replace").strip() if err.fp else ""
    return SnapshotError(f"{what}: {err.code} {reason or err.reason}", status=err.code)


def fetch_chunk(base_url: str, manifest: Manifest, index: int, *, timeout: float, retries: int = 3,
                credential: str | None = None, deadline: float | None = None) -> bytes:
    """GET ``{base_url}chunks/{index}`` from a snapshot server (with ``Authorization: Bearer <credential>``) and
    verify it, re-fetching a bad or failed copy up to ``retries`` times; raise SnapshotError naming the chunk
    when every attempt failed. A refusal (4xx: no or a bad credential, a version gone) is not retried. No
    redirect is followed, and no more than the chunk's declared size is read (:func:`read_bounded`). ``timeout``
    bounds each read; ``deadline`` (``time.monotonic()``), if given, the whole, retries included.

    The one HTTP path for chunks: agents without a chain parent, relays falling back to the learner, the site's
    export.
    """
    if not 0 <= index < len(manifest.chunks):
        raise SnapshotError(f"chunk {index}: manifest has {len(manifest.chunks)} chunks")
    url = f"{base_url.rstrip('/')}/chunks/{index}"
    what = f"chunk {index} of version {manifest.version} from {url}"
    for attempt in range(retries + 1):
        try:
            data = _get(url, credential=credential, limit=manifest.chunks[index].size, timeout=timeout,
                        deadline=deadline)
            verify_chunk(manifest, index, data)
            return data
        except urllib.error.HTTPError as err:
            if 300 <= err.code < 500 or attempt == retries:
                raise _refusal(what, err) from None
        except (OSError, http.client.HTTPException, SnapshotError) as err:
            if attempt == retries or (deadline is not None and time.monotonic() > deadline):
                raise SnapshotError(f"{what}: {err or err.__class__.__name__}") from None
    raise AssertionError("unreachable")


def fetch_chunks(base_url: str, manifest: Manifest, *, timeout: float = 30.0, retries: int = 3,
                 credential: str | None = None, deadline: float | None = None) -> list[bytes]:
    """Every chunk of ``manifest`` from a snapshot server (:func:`fetch_chunk`), in order and checked whole
    against the learner's digest (:func:`ordered_chunks`): the path of an agent without a chain parent. Nothing
    is returned unless every chunk verified; turning the bytes into tensors is the receiver's business (this
    plane imports no torch). ``deadline`` (``time.monotonic()``): the whole fetch's."""
    chunks = {info.index: fetch_chunk(base_url, manifest, info.index, timeout=timeout, retries=retries,
                                      credential=credential, deadline=deadline)
              for info in manifest.chunks}
    return ordered_chunks(manifest, chunks)


def fetch_payload(base_url: str, manifest: Manifest, *, timeout: float = 30.0, retries: int = 3,
                  credential: str | None = None) -> bytes:
    """:func:`fetch_chunks`, joined into one payload."""
    return b"".join(fetch_chunks(base_url, manifest, timeout=timeout, retries=retries, credential=credential))


def fetch_manifest(base_url: str, reference: ManifestReference, *, timeout: float = 30.0, retries: int = 3,
                   backoff_s: float = 0.5, credential: str | None = None, deadline: float | None = None,
                   max_total_bytes: int = MAX_SNAPSHOT_BYTES) -> Manifest:
    """GET ``{base_url}manifest.json`` (with ``Authorization: Bearer <credential>``) and return it once it is a
    manifest whose canonical JSON hashes to ``reference``: the one the site checked and announced. A failed
    connection, a 5xx or a body cut short is tried again ``retries`` times after ``backoff_s``, doubling, each wait
    drawn between half and all of it (a fleet told of a version at once does not retry at once); a refusal (4xx: no
    or a bad credential, a version pruned) and a manifest of other bytes are not: SnapshotError, naming the URL and
    why. ``timeout`` bounds each try (a server trickling bytes is given up then, and tried again), ``deadline``
    (``time.monotonic()``) the whole, retries included."""
    url = f"{base_url.rstrip('/')}/manifest.json"
    what = f"manifest {reference.sha256[:12]}... from {url}"
    for attempt in range(retries + 1):
        try:
            ends = time.monotonic() + timeout if deadline is None else min(deadline, time.monotonic() + timeout)
            body = _get(url, credential=credential, limit=reference.size + MANIFEST_SLACK_BYTES, timeout=timeout,
                        deadline=ends)
            break
        except urllib.error.HTTPError as err:
            if 300 <= err.code < 500 or attempt == retries:
                raise _refusal(what, err) from None
            failure: Exception = err
        except (OSError, http.client.HTTPException, SnapshotError) as err:
            if attempt == retries:
                raise SnapshotError(f"{what}: {err or type(err).__name__}") from None
            failure = err
        pause = backoff_s * 2**attempt * random.uniform(0.5, 1.0)
        if deadline is not None and time.monotonic() + pause > deadline:
            raise SnapshotError(f"{what}: {failure or type(failure).__name__} (no time left to try again)")
        time.sleep(pause)
    return verified_manifest(body, reference, what=what, max_total_bytes=max_total_bytes)


def verified_manifest(body: bytes, reference: ManifestReference, *, what: str,
                      max_total_bytes: int = MAX_SNAPSHOT_BYTES) -> Manifest:
    """The manifest whose JSON is ``body``, once it hashes to ``reference`` (the one the site checked and announced),
    wherever it came from: the learner's server (:func:`fetch_manifest`) or a chain parent's ``accept``
    (:mod:`dataplane.broadcast.relay`). SnapshotError naming ``what`` and why otherwise."""
    try:
        raw = json.loads(body)
    except ValueError as err:
        raise SnapshotError(f"{what}: not JSON ({err})") from None
    manifest = parse_manifest(raw, max_total_bytes=max_total_bytes)
    if is_canonical(body, reference):  # the very bytes the site hashed: no need to serialize them again
        return manifest
    got = manifest_reference(manifest)
    if got != reference:
        raise SnapshotError(f"{what}: refused: it hashes to {got.sha256[:12]}... ({got.size} bytes), not to the "
                            f"{reference.sha256[:12]}... ({reference.size} bytes) the site announced")
    return manifest


def is_canonical(body: bytes, reference: ManifestReference) -> bool:
    """``body`` is the canonical JSON that ``reference`` names, byte for byte (what a relay parent sends)."""
    return len(body) == reference.size and hashlib.sha256(body).hexdigest() == reference.sha256
