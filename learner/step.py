"""One optimizer update of the GRPO loss on whole groups, on one process or data-parallel (DDP).

Rank 0 collates the batch, computes the group advantages and the loss denominator over the whole
batch, and sends each rank a contiguous slice of rows. Each rank scales its share of the loss by the
world size (DDP averages gradients), so the update equals the single-process update on the whole
batch. Micro-batches (gradient accumulation) split a rank's slice the same way.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel

from dataplane.jobs import LossConfig
from dataplane.records import Trajectory

from . import distributed
from .batch import Batch, collate, token_logprobs
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


class PolicyTrainer:
    """Owns the policy (DDP-wrapped when parallel), its optimizer and the frozen reference model.

    ``loss`` is a resolved :class:`LossConfig` (a job's ``loss``, or :meth:`LossConfig.resolved`); its
    ``max_grad_norm`` is not read here: the caller passes ``max_grad_norm`` (the learner passes the job's).

    ``micro_batch`` rows per forward/backward (None: the whole slice at once); ``bf16`` runs the
    forward passes under CUDA bf16 autocast (the loss and the parameters stay fp32); ``max_grad_norm``
    rescales a gradient whose global L2 norm exceeds it (None: no clipping). Clipping happens after DDP's
    all-reduce, so every rank sees the same norm and takes the same step.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: LossConfig, *,
                 pad_id: int, reference: torch.nn.Module | None = None, micro_batch: int | None = None,
                 bf16: bool = False, ctx: DistContext | None = None, max_grad_norm: float | None = None) -> None:
        self.ctx = ctx or DistContext()
        if bf16 and not self.ctx.device.startswith("cuda"):
            raise ValueError("bf16 autocast needs a CUDA device")
        if not loss.is_resolved:
            raise ValueError("the loss settings have unresolved defaults; use a job's loss or LossConfig.resolved()")
        if loss.kl_beta > 0 and reference is None:
            raise ValueError("kl_beta > 0 needs a reference model")
        self.module, self.optimizer, self.loss = model, optimizer, loss
        self.pad_id, self.reference, self.micro_batch, self.bf16 = pad_id, reference, micro_batch, bf16
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm!r}")
        self.max_grad_norm = max_grad_norm
        self.last_grad_norm = 0.0
        self.model: torch.nn.Module = model
        if self.ctx.parallel:
            cuda = self.ctx.device.startswith("cuda")
            self.model = DistributedDataParallel(model, device_ids=[self.ctx.local_rank] if cuda else None)

    # --- rank 0 -------------------------------------------------------------------------------------------

    def step(self, records: list[Trajectory]) -> StepResult:
        """Train one update on ``records`` (whole groups); every rank takes part. Rank 0 only."""
        batch = collate(records, pad_id=self.pad_id)
        if len(batch) < self.ctx.world:
            raise ValueError(f"a batch of {len(batch)} sequences cannot feed {self.ctx.world} ranks")
        s = self.loss
        advantages = group_advantages(batch.rewards, batch.group_index, eps=s.advantage_eps,
                                      scale=s.advantage == "std")
        _, denominator = aggregation_weights(batch.token_mask, mode=s.aggregation, norm_length=s.norm_length)
        shards = [("step", _Shard(batch.rows(lo, hi), advantages[lo:hi], denominator))
                  for lo, hi in distributed.split_rows(len(batch), self.ctx.world)]
        _, mine = distributed.exchange(self.ctx, shards)
        stats = sum(distributed.gather(self.ctx, self._train(mine)), LossStats())
        return StepResult(loss=stats.pg + stats.kl_term, reward_mean=float(batch.rewards.mean()),
                          reward_std=float(batch.rewards.std(unbiased=False)), tokens=int(batch.token_mask.sum()),
                          sequences=len(batch), stats=stats, grad_norm=self.last_grad_norm)

    def load_state(self, model_state: dict | None, optimizer_state: dict | None) -> None:
        """Load a checkpoint's state on every rank (rank 0 passes it; the others receive it)."""
        distributed.exchange(self.ctx, [("load", optimizer_state)] * self.ctx.world)
        self._load(model_state, optimizer_state)

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
            elif op == "step":
                distributed.gather(self.ctx, self._train(payload))

    # --- every rank ---------------------------------------------------------------------------------------

    def _load(self, model_state: dict | None, optimizer_state: dict | None) -> None:
        if model_state is not None:
            self.module.load_state_dict(model_state)
        if self.ctx.parallel:  # rank 0's parameters and buffers everywhere
            with torch.no_grad():
                for tensor in [*self.module.parameters(), *self.module.buffers()]:
                    torch.distributed.broadcast(tensor.data, src=0)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)

    def _autocast(self):
        if self.bf16:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _train(self, shard: _Shard) -> LossStats:
        device = self.ctx.device
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        rows = len(shard.batch)
        size = self.micro_batch or rows
        chunks = [(lo, min(lo + size, rows)) for lo in range(0, rows, size)]
        stats = LossStats()
        for k, (lo, hi) in enumerate(chunks):
            part = shard.batch.rows(lo, hi).to(device)
            last = k == len(chunks) - 1
            sync = contextlib.nullcontext() if last or not self.ctx.parallel else self.model.no_sync()
            with sync:
                with self._autocast():
                    logp = token_logprobs(self.model, part)
                    ref = None
                    if self.loss.kl_beta > 0:
                        with torch.no_grad():
                            ref = token_logprobs(self.reference, part)
                terms = policy_loss(logp, part.behaviour_logp, shard.advantages[lo:hi].to(device), part.token_mask,
                                    self.loss, ref_logp=ref, denominator=shard.denominator)
                (terms.loss * self.ctx.world).backward()
            stats = stats + terms.stats
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])) \
                if params else torch.zeros(())
        self.last_grad_norm = float(norm)
        self.optimizer.step()
        return stats
