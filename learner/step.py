"""One optimizer update of the GRPO loss on whole groups, on one process or data-parallel (DDP or FSDP).

Rank 0 collates the batch, computes the group advantages and the loss denominator over the whole
batch, and sends each rank a contiguous slice of rows. Each rank scales its share of the loss by the
world size (DDP and FSDP average gradients), so the update equals the single-process update on the whole
batch. Micro-batches (gradient accumulation) split a rank's slice the same way, into as many parts on
every rank (FSDP gathers parameters at each forward: the ranks' passes must pair up).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from dataplane.jobs import LossConfig
from dataplane.packed import PackedRecords, pack_records
from dataplane.records import Trajectory

from . import distributed, fsdp
from .batch import Batch, Workspace, collate_packed, token_logprobs
from .checkpoint import CheckpointStore, copied
from .distributed import DistContext
from .grpo import LossStats, aggregation_weights, group_advantages, policy_loss

log = logging.getLogger("echo2.learner")


@dataclass
class StepResult:
    loss: float
    reward_mean: float
    reward_std: float
    tokens: int  # learning tokens in the batch
    sequences: int
    stats: LossStats = field(default_factory=LossStats)
    grad_norm: float = 0.0  # global L2 norm of the update's gradient, before clipping
    trained_rows: int = 0  # rows passed forward and backward (the others had advantage 0: PolicyTrainer)

    @property
    def clip_fraction(self) -> float:
        return self.stats.summary()["clip_fraction"]

    def metrics(self) -> dict[str, float]:
        return {**self.stats.summary(), "grad_norm": self.grad_norm}


@dataclass
class _Shard:
    batch: Batch
    advantages: torch.Tensor  # [rows]
    denominator: float
    parts: int = 1  # micro-batches, the same number on every rank


class PolicyTrainer:
    """Owns the policy (DDP-wrapped when parallel, unless already sharded by :func:`learner.fsdp.shard`),
    its optimizer (made after sharding: it holds the shards) and the frozen reference model.

    ``loss`` is a resolved :class:`LossConfig` (a job's ``loss``, or :meth:`LossConfig.resolved`); its
    ``max_grad_norm`` is not read here: the caller passes ``max_grad_norm`` (the learner passes the job's).

    ``micro_batch`` rows per forward/backward (None: the whole slice at once); ``bf16`` runs the
    forward passes under CUDA bf16 autocast (the loss and the parameters stay fp32), or, for a sharded
    model, says it was sharded with bf16 mixed precision (which does the casting, on CPU too);
    ``max_grad_norm`` rescales a gradient whose global L2 norm exceeds it (None: no clipping). Clipping
    happens after the gradients are averaged, so every rank sees the same norm and takes the same step.

    ``skip_idle_rows``: without a KL term, a row whose advantage is exactly 0 (its group's rewards all equal, the
    common case while a policy is rarely right) adds exactly 0 to the loss and its gradient, whatever the variant:
    every surrogate is the ratio times the advantage. Its forward and backward are skipped; the denominator
    still counts it, so the update is the one the whole batch gives (up to summation order), and the optimizer
    steps as it would (on zero gradients when no row is left). The loss statistics (clip fraction, mean ratio,
    behaviour KL) are then over the rows that carry a gradient.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: LossConfig, *,
                 pad_id: int, reference: torch.nn.Module | None = None, micro_batch: int | None = None,
                 bf16: bool = False, ctx: DistContext | None = None, max_grad_norm: float | None = None,
                 skip_idle_rows: bool = True) -> None:
        self.ctx = ctx or DistContext()
        self.sharded = fsdp.is_sharded(model)
        if bf16 and not self.sharded and not self.ctx.device.startswith("cuda"):
            raise ValueError("bf16 autocast needs a CUDA device (or a model sharded with bf16 mixed precision)")
        if not loss.is_resolved:
            raise ValueError("the loss settings have unresolved defaults; use a job's loss or LossConfig.resolved()")
        if loss.kl_beta > 0 and reference is None:
            raise ValueError("kl_beta > 0 needs a reference model")
        self.module, self.optimizer, self.loss = model, optimizer, loss
        self.pad_id, self.reference, self.micro_batch, self.bf16 = pad_id, reference, micro_batch, bf16
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm!r}")
        self.max_grad_norm = max_grad_norm
        self.skip_idle_rows = skip_idle_rows
        self.last_grad_norm = 0.0
        self.model: torch.nn.Module = model
        self.workspace = Workspace()  # the batch's buffers, reused from step to step (learner/batch.py)
        if self.ctx.parallel and not self.sharded:
            cuda = self.ctx.device.startswith("cuda")
            self.model = DistributedDataParallel(model, device_ids=[self.ctx.local_rank] if cuda else None)

    # --- rank 0 -------------------------------------------------------------------------------------------

    def step(self, records: list[Trajectory] | PackedRecords) -> StepResult:
        """Train one update on ``records`` (whole groups; models, or columns as the learner reads them); every rank
        takes part. Rank 0 only."""
        packed = records if isinstance(records, PackedRecords) else pack_records(records)
        batch = collate_packed(packed, pad_id=self.pad_id, workspace=self.workspace)
        if len(batch) < self.ctx.world:
            raise ValueError(f"a batch of {len(batch)} sequences cannot feed {self.ctx.world} ranks")
        s = self.loss
        advantages = group_advantages(batch.rewards, batch.group_index, eps=s.advantage_eps,
                                      scale=s.advantage == "std", std=s.advantage_std)
        _, denominator = aggregation_weights(batch.token_mask, mode=s.aggregation, norm_length=s.norm_length)
        whole = batch
        if self.skip_idle_rows and s.kl_beta == 0:
            keep = _rows_with_gradient(advantages, minimum=self.ctx.world)
            if len(keep) < len(batch):
                batch, advantages = batch.select(keep), advantages[keep]
        slices = distributed.split_rows(len(batch), self.ctx.world)
        parts = math.ceil((slices[0][1] - slices[0][0]) / (self.micro_batch or len(batch)))  # the first is longest
        shards = [("step", _Shard(batch.rows(lo, hi), advantages[lo:hi], denominator, parts)) for lo, hi in slices]
        _, mine = distributed.exchange(self.ctx, shards)
        stats = sum(distributed.gather(self.ctx, self._train(mine)), LossStats())
        return StepResult(loss=stats.pg + stats.kl_term, reward_mean=float(whole.rewards.mean()),
                          reward_std=float(whole.rewards.std(unbiased=False)), tokens=int(whole.token_mask.sum()),
                          sequences=len(whole), stats=stats, grad_norm=self.last_grad_norm, trained_rows=len(batch))

    def load_state(self, model_state: dict | None, optimizer_state: dict | None, *,
                   sharded: Path | None = None) -> None:
        """Load a checkpoint's state on every rank: a whole one (rank 0 passes it; the others receive it,
        or their shards of it), or the sharded checkpoint directory ``sharded`` (every rank reads it)."""
        if sharded is not None:
            distributed.exchange(self.ctx, [("load_sharded", sharded)] * self.ctx.world)
            fsdp.load_sharded(self.module, self.optimizer, sharded)
            return
        distributed.exchange(self.ctx, [("load", None if self.sharded else optimizer_state)] * self.ctx.world)
        self._load(model_state, optimizer_state)

    def checkpoint_state(self, store: CheckpointStore, version: int, *, copy: bool = False) -> dict:
        """The model and optimizer of a :class:`Checkpoint`: whole (rank 0 moves them to the CPU; with ``copy``,
        copies them, to be written while training goes on), or, for a sharded model, written by every rank into the
        store's directory for ``version`` and named there."""
        if not self.sharded:
            if copy:
                return {"model": copied(self.module.state_dict()), "optimizer": copied(self.optimizer.state_dict())}
            return {"model": {k: v.detach().cpu() for k, v in self.module.state_dict().items()},
                    "optimizer": self.optimizer.state_dict()}
        path = store.fresh_sharded_dir(version)
        distributed.exchange(self.ctx, [("save", path)] * self.ctx.world)
        fsdp.save_sharded(self.module, self.optimizer, path)
        return {"model": {}, "optimizer": {}, "sharded": path.name}

    def full_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The whole model, tensor by tensor on the CPU (a snapshot's weights; :func:`learner.fsdp.full_tensors`).
        A sharded model is gathered one parameter at a time with the other ranks: iterate it to the end."""
        if self.sharded:
            distributed.exchange(self.ctx, [("gather", None)] * self.ctx.world)
        return fsdp.full_tensors(self.module)

    def release(self) -> None:
        """Let the other ranks' :meth:`serve` return. Rank 0 only; call once, at the end."""
        if self.ctx.parallel:
            distributed.exchange(self.ctx, [("stop", None)] * self.ctx.world)

    # --- ranks > 0 ----------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Follow rank 0's commands (train a slice, load a checkpoint) until it releases this rank."""
        while True:
            op, payload = distributed.exchange(self.ctx, None)
            if op == "stop":
                return
            if op == "load":
                self._load(None, payload)
            elif op == "load_sharded":
                fsdp.load_sharded(self.module, self.optimizer, payload)
            elif op == "save":
                fsdp.save_sharded(self.module, self.optimizer, payload)
            elif op == "gather":
                for _ in fsdp.full_tensors(self.module, keep=False):
                    pass
            elif op == "step":
                distributed.gather(self.ctx, self._train(payload))

    # --- every rank ---------------------------------------------------------------------------------------

    def _load(self, model_state: dict | None, optimizer_state: dict | None) -> None:
        if self.sharded:  # rank 0's whole state, each rank keeping its shards
            fsdp.load_full(self.module, self.optimizer, model_state, optimizer_state)
            return
        if model_state is not None:
            self.module.load_state_dict(model_state)
        if self.ctx.parallel:  # rank 0's parameters and buffers everywhere
            with torch.no_grad():
                for tensor in [*self.module.parameters(), *self.module.buffers()]:
                    torch.distributed.broadcast(tensor.data, src=0)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)

    def _autocast(self):
        if self.bf16 and not self.sharded:  # a sharded model casts by its mixed-precision policy
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _no_sync(self, skip: bool):
        """Hold back the gradient reduction of a micro-batch that is not the last (gradient accumulation)."""
        if not skip or not self.ctx.parallel:
            return contextlib.nullcontext()
        return fsdp.no_sync(self.model) if self.sharded else self.model.no_sync()

    def _train(self, shard: _Shard) -> LossStats:
        device = self.ctx.device
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts = distributed.split_rows(len(shard.batch), shard.parts)
        stats = LossStats()
        for k, (lo, hi) in enumerate(parts):
            empty = lo == hi  # fewer rows here than parts: a pass of weight 0 on one row keeps the ranks paired
            lo, hi = (0, 1) if empty else (lo, hi)
            part = shard.batch.rows(lo, hi).to(device)
            with self._no_sync(skip=k < len(parts) - 1):
                with self._autocast():
                    logp = token_logprobs(self.model, part)
                    ref = None
                    if self.loss.kl_beta > 0:
                        with torch.no_grad():
                            ref = token_logprobs(self.reference, part)
                terms = policy_loss(logp, part.behaviour_logp, shard.advantages[lo:hi].to(device), part.token_mask,
                                    self.loss, ref_logp=ref, denominator=shard.denominator)
                (terms.loss * (0.0 if empty else self.ctx.world)).backward()
            stats = stats if empty else stats + terms.stats
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])) \
                if params else torch.zeros(())
        self.last_grad_norm = fsdp.as_float(norm)  # a DTensor over sharded gradients
        self.optimizer.step()
        return stats


def _rows_with_gradient(advantages: torch.Tensor, *, minimum: int) -> torch.Tensor:
    """The indices of the rows whose advantage is not 0, topped up with rows of advantage 0 (which add nothing) to
    at least ``minimum``: every rank must take part in a step (and the optimizer step on a zero gradient)."""
    keep = torch.nonzero(advantages != 0).flatten()
    if len(keep) >= minimum:
        return keep
    idle = torch.nonzero(advantages == 0).flatten()[: minimum - len(keep)]
    return torch.sort(torch.cat([keep, idle])).values
