"""GRPO math as pure tensor functions (paper section 3.2; Shao et al., 2024).

Shapes: ``B`` sequences, ``T`` completion tokens (right-padded), masks are 1 on tokens that learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, eps: float = 1e-6,
                     scale: bool = True) -> torch.Tensor:
    """Group-normalized advantage ``A_i = (r_i - mean_g) / (std_g + eps)`` for each sequence.

    rewards: [B] float; group_index: [B] long in ``0..G-1``. ``scale=False`` gives the mean-only
    variant (Dr.GRPO). The std is the population std of the group, as in the GRPO paper's code.
    """
    groups = int(group_index.max().item()) + 1
    count = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, torch.ones_like(rewards))
    mean = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, rewards) / count
    centered = rewards - mean[group_index]
    if not scale:
        return centered
    var = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, centered**2) / count
    return centered / (var.sqrt()[group_index] + eps)


@dataclass(frozen=True)
class LossTerms:
    loss: torch.Tensor  # scalar, differentiable
    clip_fraction: float
    mean_ratio: float


def clipped_surrogate_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                           mask: torch.Tensor, *, clip_eps: float = 0.2) -> LossTerms:
    """Token-level PPO-clip surrogate against the behaviour policy, averaged over learning tokens.

    logp, behaviour_logp, mask: [B, T]; advantages: [B]. The ratio is taken against the log-probs the
    worker reported, so a record generated under an older snapshot is importance-weighted (and clipped)
    rather than treated as on-policy.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - behaviour_logp)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    surrogate = torch.minimum(unclipped, clipped)
    tokens = mask.sum().clamp(min=1.0)
    loss = -(surrogate * mask).sum() / tokens
    with torch.no_grad():
        was_clipped = ((unclipped - clipped).abs() > 1e-12).to(logp.dtype)
        clip_fraction = float((was_clipped * mask).sum() / tokens)
        mean_ratio = float((ratio * mask).sum() / tokens)
    return LossTerms(loss=loss, clip_fraction=clip_fraction, mean_ratio=mean_ratio)
