"""A data set's content: its files as one deterministic archive whose sha256 is the data set's **digest**.

A data set is a file (``train.parquet``, ``data.jsonl``) or a directory of files (several parquet shards, a
``Dataset.save_to_disk`` directory of arrow files): its top-level regular files, hidden names skipped, sorted. Its
archive is the base snapshot's (:func:`dataplane.basemodel.write_files`: an uncompressed pax tar, mtime 0, mode
0644, no owners), so the same files always give the same digest wherever they lie, the agent's base cache
(``worker_agent/cache.py``) keeps a data set as it keeps a base model, and unpacking refuses what the archive never
holds (links, paths, duplicates).

Where this machine holds a digest's files is this process's table (:func:`register`, :func:`locate`): the learner
registers ``--dataset PATH`` (or the copy it fetched from the site), the agent the cache entry it fetched from the
learner. A ``dataset`` task reads its rows from there, lazily: the site builds the task to validate a job and
never reads them.

The learner serves a digest like a snapshot version (:func:`data_url`): ``GET /data/<digest>/manifest.json`` and
``/data/<digest>/chunks/<i>`` with the worker's transfer credential; the manifest's ``sha256`` is the digest, so a
receiver checks every chunk against it and the whole against the digest the job names.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import re
import tarfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

from .. import basemodel
from ..snapshot import (
    _OPENER,
    DEFAULT_CHUNK_BYTES,
    Manifest,
    SnapshotError,
    build_manifest,
    fetch_payload,
    parse_manifest,
    read_bounded,
)

FORMAT = "dataset-tar"
"""The manifest ``format`` of a data set served by the learner."""
PREFIX = "data"
"""The learner's snapshot server serves digest ``d`` under ``/data/<d>/``."""
DIGEST = re.compile(r"[0-9a-f]{64}")
MAX_FILES = 10_000
MAX_BYTES = 1 << 30
"""The largest data set an agent fetches (1 GiB): rows are held in memory on every machine (docs/datasets.md)."""
MAX_MANIFEST_BYTES = 16 << 20

_where: dict[str, Path] = {}
_lock = threading.Lock()


class DatasetError(ValueError):
    """A data set that cannot be packed, found, fetched or read; the message names the field or the file."""


def dataset_files(path: str | Path) -> list[Path]:
    """The files of the data set at ``path``: the file itself, or a directory's top-level regular files (symlinks
    followed, hidden names skipped), sorted by name."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DatasetError(f"dataset: no file or directory at {str(path)!r}")
    files = sorted((p for p in path.iterdir() if not p.name.startswith(".") and p.is_file()), key=lambda p: p.name)
    if not files:
        raise DatasetError(f"dataset: {str(path)!r} holds no files (subdirectories are not part of a data set)")
    if len(files) > MAX_FILES:
        raise DatasetError(f"dataset: {str(path)!r} holds {len(files)} files, at most {MAX_FILES}")
    return files


def pack(path: str | Path) -> bytes:
    """The archive of the data set at ``path``."""
    out = io.BytesIO()
    basemodel.write_files(dataset_files(path), out)
    return out.getvalue()


def digest(path: str | Path) -> str:
    """The digest of the data set at ``path``: sha256 of :func:`pack`, computed without holding the archive."""
    sink = basemodel._HashingSink()
    basemodel.write_files(dataset_files(path), sink)  # type: ignore[arg-type]  # write-only is all tar's "w" needs
    return sink.hash.hexdigest()


def check_archive(payload: bytes | BinaryIO) -> list[str]:
    """The member names of a data set archive, if ``payload`` is one :func:`pack` could have written (regular
    files with plain names, no duplicates, at least one); else :class:`DatasetError`. The site checks an upload
    with it before storing it."""
    names: list[str] = []
    try:
        source = io.BytesIO(payload) if isinstance(payload, bytes) else payload
        with tarfile.open(fileobj=source, mode="r:") as tar:
            for member in tar:
                names.append(basemodel.checked_member(member, names))
                if len(names) > MAX_FILES:
                    raise DatasetError(f"dataset: more than {MAX_FILES} files")
    except (tarfile.TarError, basemodel.ArchiveError) as err:
        raise DatasetError(f"dataset: not a data set archive ({err})") from None
    if not names:
        raise DatasetError("dataset: the archive holds no files")
    return names


def check_digest(value: object, *, field: str = "digest") -> str:
    if not isinstance(value, str) or not DIGEST.fullmatch(value):
        raise DatasetError(f"{field}: must be the data set's sha256 in lowercase hex (64 characters)")
    return value


def register(digest_: str, path: str | Path) -> None:
    """This machine holds the data set ``digest_`` at ``path`` (a file or a directory of its files)."""
    with _lock:
        _where[check_digest(digest_)] = Path(path)


def locate(digest_: str) -> Path | None:
    """Where this machine holds the data set ``digest_``, if it was registered."""
    with _lock:
        return _where.get(digest_)


def data_url(snapshot_url: str, digest_: str) -> str:
    """Where the learner whose snapshots are at ``snapshot_url`` (``http://host:port/v<n>/``) serves ``digest_``."""
    match = re.match(r"^(https?://[^/]+)/", snapshot_url)
    if match is None:
        raise DatasetError(f"snapshot url {snapshot_url[:100]!r} names no server")
    return f"{match.group(1)}/{PREFIX}/{check_digest(digest_)}/"


def manifest_for(payload: bytes, *, job_id: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Manifest:
    """The manifest the learner serves a data set's archive under: its ``sha256`` is the digest."""
    return build_manifest(payload, job_id=job_id, version=0, chunk_bytes=chunk_bytes, format=FORMAT)


def check_manifest(manifest: Manifest, *, digest_: str, max_bytes: int) -> None:
    """A served manifest must describe the data set the job names, and no more than ``max_bytes`` of it."""
    if manifest.format != FORMAT:
        raise SnapshotError(f"dataset {digest_[:12]}...: the server sent a {manifest.format!r} manifest")
    if manifest.sha256 != digest_:
        raise SnapshotError(f"dataset {digest_[:12]}...: the server's manifest is of {manifest.sha256[:12]}...")
    if manifest.total_bytes > max_bytes:
        raise SnapshotError(f"dataset {digest_[:12]}...: {manifest.total_bytes} bytes, this agent takes data sets "
                            f"of at most {max_bytes}")


def fetch(base_url: str, digest_: str, *, credential: str | None, timeout: float = 30.0,
          max_bytes: int = MAX_BYTES) -> bytes:
    """The archive of data set ``digest_`` from the learner serving it at ``base_url`` (:func:`data_url`), with the
    worker's transfer credential: the manifest must be the digest's, every chunk is checked against it (a bad copy
    fetched again, then refused) and the whole against the digest. Raises SnapshotError naming what failed."""
    url = f"{base_url.rstrip('/')}/manifest.json"
    headers = {"Authorization": f"Bearer {credential}"} if credential else {}
    try:
        with _OPENER.open(urllib.request.Request(url, headers=headers), timeout=timeout) as response:  # noqa: S310
            raw = json.loads(read_bounded(response, MAX_MANIFEST_BYTES))
    except urllib.error.HTTPError as err:
        reason = err.read(500).decode(errors="replace").strip() if err.fp else ""
        raise SnapshotError(f"dataset manifest from {url}: {err.code} {reason or err.reason}",
                            status=err.code) from None
    except (OSError, ValueError, http.client.HTTPException) as err:
        raise SnapshotError(f"dataset manifest from {url}: {err or type(err).__name__}") from None
    manifest = parse_manifest(raw, max_total_bytes=max_bytes)
    check_manifest(manifest, digest_=digest_, max_bytes=max_bytes)
    return fetch_payload(base_url, manifest, timeout=timeout, credential=credential)


def sha256(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()
