"""Data-parallel learner processes launched by ``torchrun`` (one process per GPU, or per CPU over gloo).

Rank 0 is the learner the rest of the system sees: it alone talks to the site and Redis, writes
checkpoints and publishes snapshots. The other ranks only train: rank 0 sends each of them a command
per step over one collective (:func:`exchange`), and DDP averages their gradients.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world > 1


def init(device: str, *, timeout_s: float) -> DistContext:
    """Join the process group torchrun set up (``WORLD_SIZE`` > 1), or run alone.

    ``timeout_s`` bounds every collective, so a rank whose peer died fails instead of hanging; it must
    exceed the longest time rank 0 may spend between two steps (waiting for data, publishing).
    CUDA ranks use NCCL and the GPU ``cuda:<LOCAL_RANK>``; CPU ranks use gloo.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(device=device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda")
    if cuda:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return DistContext(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local_rank, device=device)


def shutdown(ctx: DistContext) -> None:
    """Leave the process group together: a rank that tears down its gloo connections while a peer still
    uses them can abort the peer ("terminate called without an active exception"), so every rank first
    meets the others at a barrier (skipped when a peer is gone: the barrier's error is not ours to raise)."""
    if ctx.parallel and dist.is_initialized():
        with contextlib.suppress(RuntimeError, dist.DistBackendError):
            dist.barrier()
        dist.destroy_process_group()


def exchange(ctx: DistContext, messages: list[Any] | None) -> Any:
    """Rank 0 sends ``messages[r]`` to each rank r and keeps ``messages[0]``; other ranks pass None."""
    if not ctx.parallel:
        return messages[0]
    out: list[Any] = [None]
    dist.scatter_object_list(out, messages if ctx.is_main else None, src=0)
    return out[0]


def broadcast(ctx: DistContext, value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if not ctx.parallel:
        return value
    box = [value if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(ctx: DistContext, value: Any) -> list[Any] | None:
    """Every rank's ``value`` on rank 0 (a list by rank); None elsewhere."""
    if not ctx.parallel:
        return [value]
    out = [None] * ctx.world if ctx.is_main else None
    dist.gather_object(value, out, dst=0)
    return out


def split_rows(rows: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous, near-equal row ranges covering ``0..rows`` (the first ones one longer)."""
    base, extra = divmod(rows, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out
