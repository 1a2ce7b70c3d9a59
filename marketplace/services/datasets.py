"""Data sets owners upload (docs/datasets.md): stored by digest, never read from a path a request names.

An upload is the data set's archive (``dataplane.dataset.content.pack``: what ``echo2 job submit`` sends for a
job file's ``data.path``). It is read from the request body up to ``ECHO2_DATASET_MAX_BYTES``, hashed as it comes,
checked to be a data set archive (regular files with plain names, nothing else), and stored as
``<ECHO2_DATASET_DIR>/<digest>.tar``; who uploaded it is kept beside it (``<digest>.owners``, one user id a line).
A job whose ``dataset`` task names a digest with ``source: upload`` must name one its owner uploaded (knowing a
digest is not holding the data); ``source: learner`` the site cannot check: the job's learner holds the files.
The job's learner downloads the upload with the owner's token (:func:`dataset_file`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

from dataplane.dataset import content
from dataplane.jobs import JobSpec
from dataplane.tasks import build_task

from .base import ServiceError

_PIECE = 1 << 20
_owners_lock = threading.Lock()


class TooLarge(ServiceError):
    """An upload over ``ECHO2_DATASET_MAX_BYTES`` (the API answers 413)."""


class OverQuota(ServiceError):
    """An upload that would take its owner past ``ECHO2_DATASET_QUOTA_BYTES`` (the API answers 409)."""


def dataset_dir() -> Path:
    return Path(settings.ECHO2["DATASET_DIR"])


def _paths(digest: str) -> tuple[Path, Path]:
    content.check_digest(digest)
    root = dataset_dir()
    return root / f"{digest}.tar", root / f"{digest}.owners"


def _owners(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _receive(stream: BinaryIO, into: BinaryIO, max_bytes: int) -> str:
    """Copy at most ``max_bytes`` of ``stream`` into ``into``; the sha256 of what came."""
    digest, size = hashlib.sha256(), 0
    while piece := stream.read(_PIECE):
        size += len(piece)
        if size > max_bytes:
            raise TooLarge(f"body: a data set of more than {max_bytes} bytes (ECHO2_DATASET_MAX_BYTES)")
        digest.update(piece)
        into.write(piece)
    if size == 0:
        raise ServiceError("body: empty; send the data set's archive (echo2 job submit makes it from data.path)")
    return digest.hexdigest()


def dataset_store(*, owner, stream: BinaryIO, length: int | None) -> dict:
    """Store an uploaded archive under its digest (see the module); returns ``{"digest", "bytes", "files"}``."""
    max_bytes = int(settings.ECHO2["DATASET_MAX_BYTES"])
    if length is not None and length > max_bytes:
        raise TooLarge(f"body: a data set of {length} bytes, at most {max_bytes} (ECHO2_DATASET_MAX_BYTES)")
    root = dataset_dir()
    root.mkdir(parents=True, exist_ok=True)
    room = _quota_room(owner, root)
    if length is not None and length > room:
        raise _over_quota(length, room)
    max_bytes = min(max_bytes, room)
    with tempfile.NamedTemporaryFile(dir=root, prefix=".upload-", delete=False) as tmp:
        try:
            try:
                digest = _receive(stream, tmp, max_bytes)
            except TooLarge:
                if max_bytes == room:  # the quota, not the per-upload cap, was the bound
                    raise _over_quota(max_bytes + 1, room) from None
                raise
            tmp.flush()
            tmp.seek(0)
            try:
                files = content.check_archive(tmp)
            except content.DatasetError as err:
                raise ServiceError(f"body: {err}") from None
        except BaseException:
            os.unlink(tmp.name)
            raise
    archive, owners = _paths(digest)
    os.replace(tmp.name, archive)  # the same digest is the same bytes: a second upload replaces it with itself
    with _owners_lock:
        if str(owner.pk) not in _owners(owners):
            with owners.open("a") as out:
                out.write(f"{owner.pk}\n")
    return {"digest": digest, "bytes": archive.stat().st_size, "files": files}


def _quota_room(owner, root: Path) -> int:
    """Bytes ``owner`` may still upload: ``ECHO2_DATASET_QUOTA_BYTES`` less the archives it uploaded (one it
    shares with another owner counts for both: either may be the one who keeps it)."""
    quota = int(settings.ECHO2.get("DATASET_QUOTA_BYTES", 1 << 30))
    me = str(owner.pk)
    used = 0
    for owners in root.glob("*.owners"):
        if me in _owners(owners):
            try:
                used += owners.with_suffix(".tar").stat().st_size
            except OSError:
                continue
    return max(0, quota - used)


def _over_quota(size: int, room: int) -> OverQuota:
    quota = int(settings.ECHO2.get("DATASET_QUOTA_BYTES", 1 << 30))
    return OverQuota(f"body: {size} more bytes would pass your data set quota of {quota} bytes "
                     f"({room} left; ECHO2_DATASET_QUOTA_BYTES)")


def dataset_file(*, user, digest: str) -> Path | None:
    """The stored archive of ``digest`` if ``user`` uploaded it; else None. Staff get no exception: a data set
    is its owner's, and the site never needs to read one (only the job's learner does, with the owner's token)."""
    try:
        archive, owners = _paths(digest)
    except content.DatasetError:
        return None
    if not archive.is_file() or str(user.pk) not in _owners(owners):
        return None
    return archive


def datasets_check(*, owner, spec: JobSpec) -> None:
    """A job's task may name only data sets its owner uploaded, unless its learner serves them (``source:
    learner``), and only a code package (``task.code``, dataplane/usercode.py) its owner uploaded, always: the
    learner fetches it from here; ServiceError naming ``task`` otherwise."""
    task = build_task(spec.task)
    if task.code and dataset_file(user=owner, digest=task.code) is None:
        raise ServiceError(f"task: code: no code package {task.code[:12]}... was uploaded by you: echo2 job submit "
                           "packs and uploads it for a job file's task.code_modules (POST /api/datasets/)")
    digests = [d for d in task.content_digests() if d != task.code]
    if not digests or (spec.task.get("data") or {}).get("source") == "learner":
        return
    for digest in digests:
        if dataset_file(user=owner, digest=digest) is None:
            raise ServiceError(f"task: data.digest: no data set {digest[:12]}... was uploaded by you: upload it "
                               "(POST /api/datasets/; echo2 job submit does it for a job file's data.path), or "
                               "set data.source = \"learner\" and run echo2-learner --dataset PATH")
