"""``grpo``: the token-level ratio ``pi_theta(y_t) / pi_old(y_t)`` of PPO and GRPO (Shao et al., 2024, Eq. 3)."""

from __future__ import annotations

import torch

from .base import PolicyLoss
from .registry import register_policy_loss


@register_policy_loss("grpo")
class TokenRatio(PolicyLoss):
    def ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.exp(logp - old_logp)
