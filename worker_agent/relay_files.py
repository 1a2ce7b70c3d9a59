"""Where an agent and its relay process hand payloads to each other (docs/agent.md "The relay process"): files in the
agent's own work directory under its cache (``.relay-work/agent-<pid>-<random>``), never the pipe. The agent writes
the chunks a relay already holds (a cached base) for the child to read; the child writes each version it received for
the agent to read, check whole against the manifest's digest and delete. The work directories of agents that are gone
(killed before they could clear their own) are removed by the next agent to start its child."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from dataplane.snapshot import Manifest, SnapshotError, ordered_chunks


def payload_name(job_id: int, version: int, request: int) -> str:
    return f"job{job_id}-v{version}-{request}.payload"


def write_held(path: Path, manifest: Manifest, chunks: dict[int, bytes]) -> None:
    """Held chunks, each at its offset (the child reads those named in the command)."""
    with open(path, "wb") as f:
        for index, data in sorted(chunks.items()):
            f.seek(index * manifest.chunk_bytes)
            f.write(data)


def read_held(path: str | Path, manifest: Manifest, indices: list[int]) -> dict[int, bytes]:
    """The held chunks, each at its offset in the file (the relay verifies each)."""
    chunks = {}
    with open(path, "rb") as f:
        for index in indices:
            f.seek(index * manifest.chunk_bytes)
            chunks[index] = f.read(manifest.chunks[index].size)
    return chunks


def write_payload(path: Path, ordered: list[bytes]) -> None:
    """A received version, whole: written aside, then renamed, so the agent never reads a part of it."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for chunk in ordered:
            f.write(chunk)
    tmp.replace(path)


def read_payload(path: Path, manifest: Manifest) -> list[bytes]:
    """The payload the child wrote, read chunk by chunk and checked whole against the manifest's digest (a file can
    be truncated or overwritten); the file is deleted either way. Raises :class:`SnapshotError` naming the file."""
    try:
        with open(path, "rb") as f:
            chunks = {info.index: f.read(info.size) for info in manifest.chunks}
            if f.read(1):
                raise SnapshotError(f"{path}: longer than the manifest's {manifest.total_bytes} bytes")
        return ordered_chunks(manifest, chunks)
    except OSError as err:
        raise SnapshotError(f"the relay process's payload {path}: {err}") from None
    finally:
        path.unlink(missing_ok=True)


def clear_stale(root: Path) -> None:
    """Remove the work directories of agents that are gone."""
    for path in root.glob("agent-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    with contextlib.suppress(PermissionError):  # another user's: running
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return True
