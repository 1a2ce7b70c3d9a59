"""Base snapshots on the agent's disk: one checkpoint directory per base digest, least recently used evicted first.

A job's base (its snapshot version 0, :mod:`dataplane.basemodel`) arrives as an archive whose sha256 is the
job's base digest. The agent unpacks it here, under ``<root>/<digest>/``, and builds the job's engine from
that directory with ``from_pretrained``, like any checkpoint directory. A later job on the same base finds
it here: the entry is checked again against the digest (its files re-packed hash to it) before use, and a
damaged entry is dropped and downloaded again.

The cache holds at most ``max_bytes`` (``echo2-agent run --cache-gb``): after each new entry the least recently
used others are evicted; the entry just added or used is never evicted, even when it alone is larger. Two
jobs sharing a digest share the entry. Entries appear whole or not at all (unpacked into a hidden temporary
directory, then renamed) and disappear the same way (renamed away, then deleted), so two agents may share a
cache directory: the second to unpack a digest keeps the first one's entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from dataplane import basemodel

log = logging.getLogger("echo2.agent")

MARKER = ".echo2-base.json"  # hidden, so not one of the checkpoint's files: re-packing an entry gives its digest
_DIGEST = re.compile(r"[0-9a-f]{64}")


class CacheError(ValueError):
    """A digest that cannot name an entry, or a payload that does not hash to it."""


@dataclass(frozen=True)
class Entry:
    digest: str
    path: Path
    size: int
    last_used: float


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "echo2" / "base-snapshots"


class BaseCache:
    def __init__(self, root: str | Path, *, max_bytes: int) -> None:
        self.root, self.max_bytes = Path(root), max_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _path(self, digest: str) -> Path:
        if not _DIGEST.fullmatch(digest):
            raise CacheError(f"base digest {digest[:80]!r} is not a sha256 in hex")
        return self.root / digest

    def get(self, digest: str) -> Path | None:
        """The checkpoint directory of ``digest``, if cached and intact (re-packed, its files hash to the digest);
        marks it used. A damaged entry is removed: None."""
        path = self._path(digest)
        if not (path / MARKER).is_file():
            return None
        try:
            intact = basemodel.digest(path) == digest
        except (OSError, basemodel.ArchiveError):
            intact = False
        if not intact:
            log.warning("cached base %s... does not match its digest; dropping it", digest[:12])
            self._remove(path)
            return None
        self._touch(path)
        return path

    def payload(self, digest: str) -> bytes | None:
        """The archive of ``digest`` re-packed from its entry (to serve a chain child), if cached and intact."""
        path = self._path(digest)
        if not (path / MARKER).is_file():
            return None
        try:
            payload = basemodel.pack(path)
        except (OSError, basemodel.ArchiveError):
            payload = b""
        if hashlib.sha256(payload).hexdigest() != digest:
            self._remove(path)
            return None
        self._touch(path)
        return payload

    def put(self, digest: str, payload: bytes) -> Path:
        """Unpack the base archive ``payload`` (its sha256 must be ``digest``) as the entry of ``digest`` and
        evict the least recently used others beyond ``max_bytes``; returns the entry's directory."""
        path = self._path(digest)
        if hashlib.sha256(payload).hexdigest() != digest:
            raise CacheError(f"payload does not hash to base digest {digest[:12]}...")
        if (path / MARKER).is_file():  # cached already (and checked by get or payload when it was read)
            self._touch(path)
            return path
        tmp = self.root / f".tmp-{digest[:12]}-{uuid.uuid4().hex[:8]}"
        try:
            basemodel.unpack(payload, tmp)
            size = sum(p.stat().st_size for p in tmp.iterdir())
            (tmp / MARKER).write_text(json.dumps({"digest": digest, "bytes": size}))
            with self._lock:
                if (path / MARKER).is_file():  # another job or agent put it there first: the same files
                    shutil.rmtree(tmp, ignore_errors=True)
                else:
                    self._remove(path)  # a half-removed leftover, if any
                    tmp.rename(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._touch(path)
        self.evict(keep={digest})
        return path

    def entries(self) -> list[Entry]:
        """The complete entries, least recently used first."""
        out = []
        for marker in self.root.glob(f"*/{MARKER}"):
            try:
                size = int(json.loads(marker.read_text())["bytes"])
                out.append(Entry(marker.parent.name, marker.parent, size, marker.stat().st_mtime))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda e: (e.last_used, e.digest))

    def evict(self, *, keep: Collection[str] = ()) -> list[str]:
        """Remove least recently used entries, except ``keep``, until the rest fit ``max_bytes``; returns them."""
        evicted = []
        with self._lock:
            entries = self.entries()
            total = sum(e.size for e in entries)
            for entry in entries:
                if total <= self.max_bytes:
                    break
                if entry.digest in keep:
                    continue
                self._remove(entry.path)
                total -= entry.size
                evicted.append(entry.digest)
        for digest in evicted:
            log.info("base cache: evicted %s... (least recently used; cache limit %.2f GB)", digest[:12],
                     self.max_bytes / 1e9)
        return evicted

    def _touch(self, path: Path) -> None:
        with contextlib.suppress(OSError):  # evicted meanwhile by another agent sharing the directory
            os.utime(path / MARKER, (time.time(), time.time()))

    def _remove(self, path: Path) -> None:
        """Rename away, then delete: nobody sees a half-deleted entry as complete."""
        if not path.exists():
            return
        trash = self.root / f".trash-{path.name[:12]}-{uuid.uuid4().hex[:8]}"
        try:
            path.rename(trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)
