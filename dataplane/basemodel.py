"""The base snapshot (version 0): a job's checkpoint directory as one deterministic archive.

Version 0 of every job is its base model, published by the learner like any snapshot (manifest, chunks,
the same relay and HTTP paths, every chunk checked against the manifest), so a provider needs no local copy
and no hub access. Its payload (manifest ``format`` :data:`FORMAT`) is an uncompressed POSIX (pax) tar of
the directory's top-level regular files -- config, tokenizer and weights, what ``from_pretrained`` reads;
hidden files and subdirectories are left out -- with the names sorted and every other header field fixed
(mtime 0, mode 0644, uid/gid 0, no owner names). The same files always give the same bytes, so the payload's
sha256 is the job's **base digest**, and an agent can re-pack a cached copy to check it against the digest
(or to serve it to a chain child) without keeping the archive. Later versions are weights only (safetensors).
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

FORMAT = "checkpoint-tar"
"""The manifest ``format`` of a base snapshot; later versions are ``safetensors``."""
_PIECE = 1 << 20


class ArchiveError(ValueError):
    """A checkpoint directory that cannot be packed, or a payload that is not a safe base archive."""


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The files a base snapshot carries: ``directory``'s top-level regular files (symlinks followed, as in a
    Hugging Face cache), hidden names skipped, sorted by name."""
    root = Path(directory)
    if not root.is_dir():
        raise ArchiveError(f"{root} is not a directory")
    files = sorted((p for p in root.iterdir() if not p.name.startswith(".") and p.is_file()), key=lambda p: p.name)
    if not files:
        raise ArchiveError(f"{root} holds no files")
    return files


def write_archive(directory: str | Path, out: BinaryIO) -> None:
    """Write the deterministic archive of ``directory`` to ``out`` (anything with ``write`` and ``tell``)."""
    write_files(checkpoint_files(directory), out)


def write_files(files: list[Path], out: BinaryIO) -> None:
    """The archive of ``files`` (regular files of distinct plain names, in order) written to ``out``: the same
    bytes for the same files, whatever their mtimes, modes or owners (a data set's archive is one too)."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for path in files:
            info = tarfile.TarInfo(path.name)
            info.size, info.mtime, info.mode, info.type = path.stat().st_size, 0, 0o644, tarfile.REGTYPE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with path.open("rb") as data:
                tar.addfile(info, data)


def pack(directory: str | Path) -> bytes:
    """The base snapshot payload of ``directory``."""
    out = io.BytesIO()
    write_archive(directory, out)
    return out.getvalue()


class _HashingSink:
    def __init__(self) -> None:
        self.hash, self.size = hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


def digest(directory: str | Path) -> str:
    """sha256 of :func:`pack` of ``directory``, computed without holding the archive in memory."""
    sink = _HashingSink()
    write_archive(directory, sink)  # type: ignore[arg-type]  # a write-only sink is all tarfile's "w" mode uses
    return sink.hash.hexdigest()


_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def checked_member(member: tarfile.TarInfo, seen: list[str]) -> str:
    """The name of ``member`` of a base archive, if it is one :func:`write_archive` writes: a plain regular
    file (not sparse: a sparse member's declared size is not in the archive, so it would expand without bound)
    with a plain name (no separator, no leading dot, no control character) not ``seen`` before; else
    :class:`ArchiveError`."""
    name = member.name
    if (member.type not in _REGULAR or member.sparse is not None or not name or name.startswith(".")
            or len(PurePosixPath(name).parts) != 1 or "\\" in name or _CONTROL.search(name) or name in seen):
        raise ArchiveError(f"base archive: refusing member {name!r}")
    return name


def unpack(payload: bytes, destination: str | Path) -> list[str]:
    """Write the files of a base archive into ``destination`` (created); returns their names.

    Refuses anything :func:`write_archive` does not produce: links, devices, directories, sparse members,
    paths with a separator, a leading dot or a control character, duplicate names. Every member's data lies
    in the archive, so the files together hold fewer bytes than ``payload`` (the size its manifest declared):
    a member whose size would pass that, or that yields more than its header says, is refused while it is
    written, before the disk sees more than the payload's size.
    """
    dest = Path(destination)
    dest.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    room = len(payload)
    try:
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as tar:
            for member in tar:
                name = checked_member(member, names)
                if member.size > room:
                    raise ArchiveError(f"base archive: member {name!r} declares {member.size} bytes, "
                                       f"more than the {len(payload)}-byte archive holds")
                room -= _write_member(tar, member, dest / name)
                names.append(name)
    except tarfile.TarError as err:
        raise ArchiveError(f"base archive: {err}") from None
    if not names:
        raise ArchiveError("base archive: no files")
    return names


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> int:
    """Copy ``member``'s data to ``path``, never more than its declared size; returns the bytes written."""
    source = tar.extractfile(member)
    assert source is not None  # a regular file
    written = 0
    with path.open("wb") as out:
        while piece := source.read(min(_PIECE, member.size - written + 1)):
            written += len(piece)
            if written > member.size:
                raise ArchiveError(f"base archive: member {member.name!r} holds more than its declared size")
            out.write(piece)
    return written
