"""The on-disk layout of published snapshots: the one writer and reader of it.

Under a root, each version lives in its own directory, ``v<version>/manifest.json`` and
``v<version>/chunks/<i>``, the same paths the learner's HTTP server exposes (``GET {url}chunks/{i}``,
:func:`dataplane.snapshot.fetch_chunk`). A delta version (:mod:`dataplane.delta`) keeps the full payload it
rebuilds beside it, ``v<version>/full/manifest.json`` and ``v<version>/full/chunks/<i>`` (``GET
{url}full/chunks/{i}``), for receivers that lack its base and for the next delta. A version appears whole or
not at all (written into a hidden temp directory, :func:`staging`, then renamed) and is never modified, so a
slow agent can keep downloading an old version while newer ones appear; :func:`prune_versions` drops all but
the newest few and those the caller protects.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from ..snapshot import FULL, Manifest, SnapshotError, parse_manifest, split

MANIFEST = "manifest.json"
CHUNKS = "chunks"


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version}"


@contextlib.contextmanager
def staging(root: Path, version: int) -> Iterator[Path]:
    """A hidden directory to lay ``version`` out in; renamed to ``v<version>`` (replacing it) when the block ends
    without an error, removed when it raises: the version appears whole or not at all."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".v{version}.tmp"  # hidden: never listed as a version
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = version_dir(root, version)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def chunk_files(directory: Path, then: Callable[[bytes], None] | None = None) -> Callable[[int, bytes], None]:
    """An ``emit`` for :class:`~dataplane.snapshot.ChunkCutter`: writes chunk ``i`` to ``directory/i``, then
    hands it to ``then`` (a delta encoder), if any."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    def emit(index: int, data: bytes) -> None:
        (directory / str(index)).write_bytes(data)
        if then is not None:
            then(data)

    return emit


def write_manifest(directory: Path, manifest: Manifest) -> None:
    (Path(directory) / MANIFEST).write_text(manifest.model_dump_json())


def write_version(root: Path, manifest: Manifest, payload: bytes) -> Path:
    """Lay out ``payload`` cut as ``manifest`` says under ``root``, atomically; returns the version directory."""
    parts = split(payload, manifest.chunk_bytes)
    if len(payload) != manifest.total_bytes or len(parts) != len(manifest.chunks):
        raise SnapshotError(f"version {manifest.version}: payload of {len(payload)} bytes does not match a manifest "
                            f"of {manifest.total_bytes} bytes in {len(manifest.chunks)} chunks")
    with staging(root, manifest.version) as tmp:
        (tmp / CHUNKS).mkdir()
        for info, part in zip(manifest.chunks, parts, strict=True):
            (tmp / CHUNKS / str(info.index)).write_bytes(part)
        write_manifest(tmp, manifest)
    return version_dir(root, manifest.version)


def read_version(path: Path) -> tuple[Manifest, dict[int, bytes]]:
    """The manifest and chunks of the version directory ``path`` (unverified: a relay checks each chunk)."""
    path = Path(path)
    try:
        manifest = parse_manifest(json.loads((path / MANIFEST).read_text()))
        return manifest, {c.index: (path / CHUNKS / str(c.index)).read_bytes() for c in manifest.chunks}
    except (OSError, json.JSONDecodeError) as err:
        raise SnapshotError(f"snapshot directory {path}: {err}") from None


def full_payload(root: Path, version: int) -> tuple[Manifest, Path] | None:
    """The manifest of ``version``'s full payload and the directory of its chunks (``v<version>/full/`` for a
    delta, the version itself for a full snapshot), or None when the store does not hold it."""
    path = version_dir(root, version)
    for directory in (path / FULL, path):
        try:
            manifest = parse_manifest(json.loads((directory / MANIFEST).read_text()))
        except (OSError, json.JSONDecodeError, SnapshotError):
            continue
        if manifest.kind == "full":
            return manifest, directory / CHUNKS
    return None


def iter_chunks(directory: Path, manifest: Manifest) -> Iterator[bytes]:
    """The chunks of ``manifest`` from ``directory``, read one at a time (unverified: the caller hashes them)."""
    for info in manifest.chunks:
        try:
            yield (Path(directory) / str(info.index)).read_bytes()
        except OSError as err:
            raise SnapshotError(f"version {manifest.version}: chunk {info.index}: {err}") from None


def read_manifest(root: Path, version: int) -> Manifest | None:
    """The manifest of ``version`` under ``root``, or None when that version is not there."""
    try:
        return parse_manifest(json.loads((version_dir(root, version) / MANIFEST).read_text()))
    except (OSError, json.JSONDecodeError):
        return None


def list_versions(root: Path) -> list[int]:
    """The versions published under ``root``, oldest first."""
    return sorted(int(p.name[1:]) for p in Path(root).glob("v*") if p.name[1:].isdigit() and p.is_dir())


def prune_versions(root: Path, *, keep: int, protect: Collection[int] = ()) -> list[int]:
    """Delete all but the newest ``keep`` versions and those in ``protect``; returns the versions deleted."""
    old = list_versions(root)[:-keep] if keep > 0 else list_versions(root)
    old = [version for version in old if version not in protect]
    for version in old:
        shutil.rmtree(version_dir(root, version), ignore_errors=True)
    return old
