"""Where a task may read its data files (``math``'s JSONL), and how much of one.

A task spec names a file by path, and every machine that builds the task reads it: the learner and the agents
read what their own machine holds (their operators chose it), unconfined. The site builds tasks from requests of
strangers (``POST /api/jobs/``, ``/api/jobs/plan/``, an agent's calibration), so it must read nothing it was not
given: ``marketplace.apps`` confines the site's processes with :func:`configure` to

- ``builtin:<file>`` (a file shipped in ``dataplane/tasks/data/``; a plain file name, no ``/``), or
- an absolute path lexically under ``root`` (``ECHO2_TASK_DATA_ROOT``): no ``..`` component, resolved (symlinks
  followed) still under ``root``, a regular file, at most ``max_bytes`` (``ECHO2_TASK_DATA_MAX_BYTES``).

A path outside the root is refused before the file system is touched, and every failure inside it (missing, a
directory, a FIFO, a device, a symlink out of the root, unreadable) reads the same, so the answers say nothing
about files outside the root. The file is opened without following a last symlink and without blocking (a FIFO
cannot hang the request), and read in pieces that stop at the cap, so a file that grows (or lies about its size)
costs at most ``max_bytes`` of memory.

The policy is a process default (:func:`configure`) that a context can override (:func:`using`): a test process that
is both site and learner reads like the learner inside ``using(UNCONFINED)``.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from .base import TaskSpecError

DATA_DIR = Path(__file__).with_name("data")
BUILTIN_PREFIX = "builtin:"
_PIECE = 1 << 20


@dataclass(frozen=True)
class TaskFiles:
    """A policy for task data files: ``root`` None reads any path (the learner's and agents' own machine);
    ``max_bytes`` None reads files of any size."""

    root: Path | None = None
    max_bytes: int | None = None

    @property
    def confined(self) -> bool:
        return self.root is not None

    def read(self, path: str) -> bytes:
        """The bytes of the file ``path`` names, under this policy; :class:`TaskSpecError` naming ``path`` when
        it may not or cannot be read."""
        if path.startswith(BUILTIN_PREFIX):
            name = path.removeprefix(BUILTIN_PREFIX)
            if not name or "/" in name or "\\" in name or name in (".", ".."):
                raise TaskSpecError(f"path: {path!r}: builtin: takes the name of a file in dataplane/tasks/data/")
            return self._read(DATA_DIR / name, path, under=DATA_DIR)
        if self.root is None:
            return self._read(Path(path).expanduser(), path, under=None)
        root = Path(os.path.abspath(self.root))
        where = Path(path)
        if not where.is_absolute() or ".." in where.parts or not Path(os.path.abspath(where)).is_relative_to(root):
            raise TaskSpecError(f"path: {path!r} is not a file this site may read: give builtin:<file> or an absolute "
                                f"path under the site's task data root, {root} (ECHO2_TASK_DATA_ROOT)")
        return self._read(where, path, under=root)

    def _read(self, file: Path, path: str, *, under: Path | None) -> bytes:
        if under is None and self.max_bytes is None:  # the learner's and agents' reading, as it always was
            try:
                return file.read_bytes()
            except OSError as err:
                raise TaskSpecError(f"path: cannot read {path!r}: {err.strerror or err}") from None
        unreadable = TaskSpecError(f"path: no readable regular file at {path!r}")
        if under is not None:
            real = Path(os.path.realpath(file))
            if not real.is_relative_to(Path(os.path.realpath(under))):  # a symlink out of the root
                raise unreadable
            file = real
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            raise unreadable from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise unreadable
        with os.fdopen(fd, "rb", buffering=0) as handle:
            limit = self.max_bytes
            if limit is not None and info.st_size > limit:
                raise self._too_large(path)
            pieces, size = [], 0
            while piece := handle.read(_PIECE if limit is None else min(_PIECE, limit + 1 - size)):
                pieces.append(piece)
                size += len(piece)
                if limit is not None and size > limit:  # it grew while read
                    raise self._too_large(path)
            return b"".join(pieces)

    def _too_large(self, path: str) -> TaskSpecError:
        return TaskSpecError(f"path: {path!r} is larger than this site reads ({self.max_bytes} bytes, "
                             "ECHO2_TASK_DATA_MAX_BYTES)")


UNCONFINED = TaskFiles()
_default = UNCONFINED
_override: ContextVar[TaskFiles | None] = ContextVar("echo2_task_files", default=None)


def configure(files: TaskFiles) -> None:
    """Make ``files`` this process's policy (the site does, when Django loads ``marketplace``)."""
    global _default
    _default = files


def current() -> TaskFiles:
    """The policy in force here: the context's (:func:`using`), else the process's (:func:`configure`)."""
    return _override.get() or _default


@contextlib.contextmanager
def using(files: TaskFiles) -> Iterator[TaskFiles]:
    """Read task files under ``files`` within the block (this thread or task only)."""
    token = _override.set(files)
    try:
        yield files
    finally:
        _override.reset(token)


def read_task_file(path: str) -> bytes:
    """The bytes of the task data file ``path`` names, under the policy in force (:func:`current`)."""
    return current().read(path)
