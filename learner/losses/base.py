"""What the policy-loss variants share: their interface, the PPO clip and GSPO's sequence ratio (pure tensor
functions).

Shapes as in :mod:`learner.grpo`: ``B`` sequences, ``T`` token positions, ``mask`` 1 on learning tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.jobs import LossConfig


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


@dataclass
class Surrogate:
    """What a variant's surrogate gives :func:`learner.grpo.policy_loss`: the per-token objective (maximized) and
    the masks behind the step's statistics. All [B, T]."""

    value: torch.Tensor  # the objective per token, differentiable; the loss is -sum(c * w * value) / D
    ratio: torch.Tensor  # the ratio the variant used (for the mean_ratio statistic)
    clip_low: torch.Tensor  # bool: clipped below (the clip zeroes the gradient)
    clip_high: torch.Tensor  # bool: clipped above
    dual: torch.Tensor  # bool: clipped by the dual clip


class PolicyLoss:
    """One policy-loss variant (``LossConfig.type``): how the policy ratio is taken and turned into a surrogate.

    The rest of the loss is common to every variant (:func:`learner.grpo.policy_loss`): the off-policy weights
    ``w``, the aggregation coefficients ``c`` and denominator ``D``, the KL term. A variant is registered under its
    name with :func:`learner.losses.register_policy_loss`; the default surrogate is PPO's clip of :meth:`ratio`.
    """

    name: str = ""  # set by the registration
    #: The TIS/MIS behaviour weight of a token is its sequence's geometric-mean weight (GSPO), not its own.
    sequence_level: bool = False

    def ratio(self, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The policy ratio [B, T] against ``old_logp`` (the behaviour log-probs, or the detached ``logp``)."""
        raise NotImplementedError

    def surrogate(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  config: LossConfig) -> Surrogate:
        """PPO-clip of :meth:`ratio` with the job's clip range (and dual clip); advantages [B]."""
        ratio = self.ratio(logp, old_logp, mask)
        value, low, high, dual = clipped_surrogate(ratio, advantages, clip_low=config.clip_eps_low,
                                                   clip_high=config.clip_eps_high, dual_clip=config.dual_clip)
        return Surrogate(value, ratio, low, high, dual)
