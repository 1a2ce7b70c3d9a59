"""Learner checkpoints: everything a restarted learner needs to continue the same run, written atomically.

One file, ``checkpoint.pt``, holds the model, the optimizer, the version counter, the RNG states, the
loop's counters, and the stream entry ids trained since the previous checkpoint (acknowledged only once
this file is in place; see :class:`learner.loop.LearnerLoop`). It is written to a temporary file,
fsynced and renamed over the old one (``os.replace``), so a crash at any moment leaves either the old
checkpoint or the new one, never half of one. ``run-config.json`` beside it records the resolved
configuration of the run. (It was ``config.json`` once, which made the directory look like a Hugging Face
model to ``from_pretrained``, which then failed with "Unrecognized model ... model_type": a model comes out
of a job with ``echo2-learner export`` or ``echo2 job export``.)

A sharded (FSDP) learner keeps the model and optimizer out of that file: every rank first writes its shards
into ``sharded-v<version>-<random>/`` (a ``torch.distributed.checkpoint`` directory, :mod:`learner.fsdp`), then
``checkpoint.pt`` (format 2) is committed naming it, and older such directories are removed. Both formats
load at any world size, sharded or not.

Writing the file (and fsyncing it twice) took 30-170 ms on the 2-core machine for the tiny model, as long as a
training step: an unsharded learner's :class:`Committer` writes it on a thread of its own from a copy of the state
(:func:`copied`), while the next step reads and trains.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = 1  # model and optimizer inside checkpoint.pt
SHARDED_FORMAT = 2  # model and optimizer in the DCP directory checkpoint.pt names


@dataclass
class Checkpoint:
    version: int  # learner updates done: v_t
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]  # see capture_rng
    trained_entry_ids: list[str]  # stream entries trained in steps after the previous checkpoint
    job: dict[str, Any]  # whose run this is: job id, creation time, model directory
    state: dict[str, Any] = field(default_factory=dict)  # loop counters: dropped records, recent rewards, ...
    sharded: str | None = None  # the DCP directory (in the store) holding model and optimizer; then both are {}


def capture_rng(extra: random.Random | None = None) -> dict[str, Any]:
    """torch (CPU and every CUDA device), Python's ``random`` and an optional extra generator."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if extra is not None:
        state["extra"] = extra.getstate()
    return state


def restore_rng(state: dict[str, Any], extra: random.Random | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if extra is not None and "extra" in state:
        extra.setstate(_as_tuples(state["extra"]))


def _as_tuples(value: Any) -> Any:
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list | tuple) else value


class CheckpointStore:
    """``root/checkpoint.pt`` and ``root/run-config.json``; ``root`` is created on first write."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / "checkpoint.pt"
        self.config_path = self.root / "run-config.json"

    def exists(self) -> bool:
        return self.path.exists()

    def save(self, checkpoint: Checkpoint) -> Path:
        """Commit ``checkpoint`` (its sharded directory, if any, already written), then drop older directories."""
        payload = {"format": SHARDED_FORMAT if checkpoint.sharded else FORMAT, **asdict(checkpoint)}
        if not checkpoint.sharded:
            del payload["sharded"]  # format 1 as it always was
        self._atomic_write(self.path, lambda f: torch.save(payload, f))
        for old in self.root.glob("sharded-v*"):
            if old.name != checkpoint.sharded:
                shutil.rmtree(old, ignore_errors=True)
        return self.path

    def load(self) -> Checkpoint | None:
        """The last committed checkpoint, on the CPU; None if there is none."""
        if not self.path.exists():
            return None
        payload = torch.load(self.path, map_location="cpu", weights_only=True)
        found = payload.pop("format", None)
        if found not in (FORMAT, SHARDED_FORMAT):
            raise ValueError(f"{self.path}: not a checkpoint of format {FORMAT} or {SHARDED_FORMAT} (found {found!r})")
        checkpoint = Checkpoint(**payload)
        if checkpoint.sharded and not self.sharded_path(checkpoint).is_dir():
            raise ValueError(f"{self.path} names the sharded checkpoint {self.sharded_path(checkpoint)}, which is "
                             "missing")
        return checkpoint

    def sharded_path(self, checkpoint: Checkpoint) -> Path | None:
        """The DCP directory of a sharded checkpoint; None for a whole one."""
        return self.root.absolute() / checkpoint.sharded if checkpoint.sharded else None  # other ranks' cwd may differ

    def fresh_sharded_dir(self, version: int) -> Path:
        """A new, empty directory for the shards of ``version`` (never the committed one, even at the same
        version; what a crash leaves is removed at the next commit). Every rank writes into it, so with
        several machines ``root`` must be on a filesystem they all mount."""
        path = self.root.absolute() / f"sharded-v{version:08d}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def save_config(self, config: dict[str, Any]) -> Path:
        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        self._atomic_write(self.config_path, lambda f: f.write(text.encode()))
        self._drop_old_config()
        return self.config_path

    def _drop_old_config(self) -> None:
        """An earlier learner's run configuration under its old name, ``config.json`` (see the module)."""
        old = self.root / "config.json"
        try:
            saved = json.loads(old.read_text())
        except (OSError, ValueError):
            return
        if isinstance(saved, dict) and "learner" in saved and "model_type" not in saved:
            old.unlink(missing_ok=True)

    def _atomic_write(self, path: Path, write) -> None:  # noqa: ANN001 - a callable taking a binary file
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # the commit point
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a power cut
        finally:
            os.close(fd)


def copied(value: Any, memo: dict | None = None) -> Any:
    """``value`` (a state dict, an optimizer's, nested dicts and lists) with every tensor copied to the CPU, so it
    can be written while training goes on changing the originals. Tensors that share memory (tied weights) stay
    shared in the copy."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        key = (value.device, value.data_ptr(), value.dtype, tuple(value.shape))
        if key not in memo:
            memo[key] = value.detach().to("cpu", copy=True)
        return memo[key]
    if isinstance(value, dict):
        return {k: copied(v, memo) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(copied(v, memo) for v in value)
    return value


class Committer:
    """Runs what a checkpoint commit involves (writing the file; then what must follow it, a snapshot's
    publication) on one thread of its own, in the order handed over, while the training thread goes on.
    :meth:`finished` collects what is done (or waits for all of it) and raises what failed there."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo2-commit")
        self._pending: list[concurrent.futures.Future] = []

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def submit(self, work: Callable[[], Any]) -> None:
        self._pending.append(self._pool.submit(work))

    def finished(self, *, wait: bool) -> list[Any]:
        """The results of the work handed over that is done, oldest first (with ``wait``: all of it, waiting for
        it); the first failure is raised instead."""
        done = []
        while self._pending and (wait or self._pending[0].done()):
            done.append(self._pending.pop(0).result())
        return done

    def close(self) -> None:
        """Finish what was handed over (failures are the caller's to have settled) and stop the thread."""
        self._pool.shutdown(wait=True)
