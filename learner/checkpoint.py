"""Learner checkpoints: everything a restarted learner needs to continue the same run, written atomically.

One file, ``checkpoint.pt``, holds the model, the optimizer, the version counter, the RNG states, the
loop's counters, and the stream entry ids trained since the previous checkpoint (acknowledged only once
this file is in place; see :class:`learner.loop.LearnerLoop`). It is written to a temporary file,
fsynced and renamed over the old one (``os.replace``), so a crash at any moment leaves either the old
checkpoint or the new one, never half of one. ``config.json`` beside it records the resolved
configuration of the run.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = 1


@dataclass
class Checkpoint:
    version: int  # learner updates done: v_t
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]  # see capture_rng
    trained_entry_ids: list[str]  # stream entries trained in steps after the previous checkpoint
    job: dict[str, Any]  # whose run this is: job id, creation time, model directory
    state: dict[str, Any] = field(default_factory=dict)  # loop counters: dropped records, recent rewards, ...


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
    """``root/checkpoint.pt`` and ``root/config.json``; ``root`` is created on first write."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / "checkpoint.pt"
        self.config_path = self.root / "config.json"

    def exists(self) -> bool:
        return self.path.exists()

    def save(self, checkpoint: Checkpoint) -> Path:
        payload = {"format": FORMAT, **asdict(checkpoint)}
        self._atomic_write(self.path, lambda f: torch.save(payload, f))
        return self.path

    def load(self) -> Checkpoint | None:
        """The last committed checkpoint, on the CPU; None if there is none."""
        if not self.path.exists():
            return None
        payload = torch.load(self.path, map_location="cpu", weights_only=True)
        if payload.pop("format", None) != FORMAT:
            raise ValueError(f"{self.path}: not a checkpoint of format {FORMAT}")
        return Checkpoint(**payload)

    def save_config(self, config: dict[str, Any]) -> Path:
        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        self._atomic_write(self.config_path, lambda f: f.write(text.encode()))
        return self.config_path

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
