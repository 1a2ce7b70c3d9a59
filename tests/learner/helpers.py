"""Helpers for the learner's tests: a resolved loss configuration and one GRPO update in this process."""

from __future__ import annotations

import torch

from dataplane.jobs import LossConfig
from dataplane.records import Trajectory
from learner import distributed
from learner.step import PolicyTrainer, StepResult


def loss_config(*, clip_eps: float = 0.2, max_new_tokens: int = 1, **fields) -> LossConfig:
    """``LossConfig(**fields)`` resolved as a job with ``clip_eps`` and ``max_new_tokens`` would resolve it
    (the defaults: grpo, token-mean, behaviour ratio, eps 0.2/0.2, no KL, norm_length 1)."""
    return LossConfig(**fields).resolved(clip_eps=clip_eps, max_new_tokens=max_new_tokens)


def grpo_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, records: list[Trajectory], *, pad_id: int,
              loss: LossConfig | None = None, clip_eps: float = 0.2, device: str = "cpu") -> StepResult:
    """One optimizer update of the GRPO loss on whole groups, in this process (the learner keeps one
    :class:`PolicyTrainer` instead)."""
    trainer = PolicyTrainer(model, optimizer, loss or loss_config(clip_eps=clip_eps), pad_id=pad_id,
                            ctx=distributed.DistContext(device=device))
    return trainer.step(records)
