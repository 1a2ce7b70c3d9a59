"""What the policy-loss variants share: the PPO clip and GSPO's sequence ratio (pure tensor functions).

Shapes as in :mod:`learner.grpo`: ``B`` sequences, ``T`` token positions, ``mask`` 1 on learning tokens.
"""

from __future__ import annotations

import torch


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's per-sequence ratio ``s_i = exp(mean_t (logp - old_logp))``: the geometric mean of the token
    ratios over learning tokens (Zheng et al., 2025, Eq. 7). [B]; 1 for a row with no learning token."""
    mask = mask.to(logp.dtype)
    mean_log_ratio = ((logp - old_logp) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return torch.exp(mean_log_ratio)


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, *, clip_low: float, clip_high: float,
                      dual_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-clip ``min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)`` and where the clip binds.

    ratio: [B, T]; advantages: [B] or [B, T]. Asymmetric bounds are DAPO's clip-higher (Yu et al., 2025):
    a larger ``eps_high`` lets unlikely tokens with positive advantage grow further. ``dual_clip`` is the
    dual-clip bound ``c > 1`` (Ye et al., 2020; verl's ``clip_ratio_c``, the bound delta of the paper's E.3
    run): where ``A < 0`` the surrogate is at least ``c * A``, so a stale token whose ratio exploded cannot
    push the loss without limit. Returns the surrogate and three [B, T] bools: clipped below (ratio < 1 -
    eps_low, A < 0), above (ratio > 1 + eps_high, A > 0), and by the dual clip (ratio > c, A < 0): the
    tokens whose gradient the clips zero.
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    with torch.no_grad():
        low = (ratio < 1.0 - clip_low) & (adv < 0)
        high = (ratio > 1.0 + clip_high) & (adv > 0)
        dual = (ratio > dual_clip) & (adv < 0) if dual_clip is not None else torch.zeros_like(low)
    if dual_clip is not None:
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, dual_clip * adv), surrogate)
    return surrogate, low, high, dual
