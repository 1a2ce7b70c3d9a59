"""The on-disk layout of published snapshots: the one writer and reader of it.

Under a root, each version lives in its own directory, ``v<version>/manifest.json`` and
``v<version>/chunks/<i>``, the same paths the learner's HTTP server exposes (``GET {url}chunks/{i}``,
:func:`dataplane.snapshot.fetch_chunk`). A version appears whole or not at all (written into a hidden temp
directory, then renamed) and is never modified, so a slow agent can keep downloading an old version while
newer ones appear; :func:`prune_versions` drops all but the newest few and those the caller protects.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection
from pathlib import Path

from ..snapshot import Manifest, SnapshotError, parse_manifest, split

MANIFEST = "manifest.json"
CHUNKS = "chunks"


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version}"


def write_version(root: Path, manifest: Manifest, payload: bytes) -> Path:
    """Lay out ``payload`` cut as ``manifest`` says under ``root``, atomically; returns the version directory."""
    parts = split(payload, manifest.chunk_bytes)
    if len(payload) != manifest.total_bytes or len(parts) != len(manifest.chunks):
        raise SnapshotError(f"version {manifest.version}: payload of {len(payload)} bytes does not match a manifest "
                            f"of {manifest.total_bytes} bytes in {len(manifest.chunks)} chunks")
    root = Path(root)
    tmp = root / f".v{manifest.version}.tmp"  # hidden: never listed as a version
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / CHUNKS).mkdir(parents=True)
    for info, part in zip(manifest.chunks, parts, strict=True):
        (tmp / CHUNKS / str(info.index)).write_bytes(part)
    (tmp / MANIFEST).write_text(manifest.model_dump_json())
    final = version_dir(root, manifest.version)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)  # appears whole or not at all
    return final


def read_version(path: Path) -> tuple[Manifest, dict[int, bytes]]:
    """The manifest and chunks of the version directory ``path`` (unverified: a relay checks each chunk)."""
    path = Path(path)
    try:
        manifest = parse_manifest(json.loads((path / MANIFEST).read_text()))
        return manifest, {c.index: (path / CHUNKS / str(c.index)).read_bytes() for c in manifest.chunks}
    except (OSError, json.JSONDecodeError) as err:
        raise SnapshotError(f"snapshot directory {path}: {err}") from None


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
