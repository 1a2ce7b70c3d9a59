"""``gspo``: every token of a sequence gets the sequence's geometric-mean ratio, clipped per sequence (Zheng et
al., 2025, Eq. 7); the TIS/MIS behaviour weights are taken per sequence too."""

from __future__ import annotations

import torch

from .base import PolicyLoss, sequence_ratio
from .registry import register_policy_loss


@register_policy_loss("gspo")
class SequenceRatio(PolicyLoss):
    sequence_level = True

    def ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return sequence_ratio(logp, old_logp, mask)[:, None].expand_as(logp)
