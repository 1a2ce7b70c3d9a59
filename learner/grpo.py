"""GRPO loss as pure tensor functions (ECHO-2 paper section 3.2 and appendix F.5.3; Shao et al., 2024).

Shapes: ``B`` sequences, ``T`` token positions (right-padded); ``mask`` is 1 on tokens that learn (the
completion's assistant tokens: ``record.loss_mask``). Three policies meet here: the learner's policy
``pi_theta`` (``logp``, differentiable), the behaviour policy ``mu`` that generated a record under
snapshot ``v <= v_t`` (``behaviour_logp``, reported by the worker), and the frozen base model
(``ref_logp``, only for the KL term). Every loss is ``sum(c * l) / D``: per-token terms ``l``, per-token
aggregation coefficients ``c`` and one batch denominator ``D`` (see :func:`aggregation_weights`), so a
batch split into micro-batches or across data-parallel ranks sums to exactly the same loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from dataplane.jobs import LossConfig

from .losses import get_policy_loss
from .losses.base import clipped_surrogate, sequence_ratio

__all__ = ["clipped_surrogate", "sequence_ratio"]  # moved to learner/losses/base.py; still importable from here


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, eps: float = 1e-6,
                     scale: bool = True, std: str = "unbiased") -> torch.Tensor:
    """Group-normalized advantage ``A_i = (r_i - mean_g) / (std_g + eps)`` for each sequence (GRPO Eq. 3).

    rewards: [B] float; group_index: [B] long in ``0..G-1``. ``scale=False`` gives the mean-only
    variant of Dr.GRPO (Liu et al., 2025), which drops the std to avoid favouring low-variance groups.
    ``std`` (``LossConfig.advantage_std``): ``unbiased`` divides the squared deviations by ``n - 1``, as the GRPO
    paper's code (``torch.std``), verl and TRL do; ``population`` by ``n``. A group of one sample has deviation 0
    and gets advantage 0 under either (its ``n - 1`` is taken as 1: no 0/0).

    A guard, not the defence (the learner quarantines such records before they get here): a group holding a
    non-finite reward, or whose statistics overflow, gets advantage 0 -- no signal -- instead of NaNs that
    would spread through the loss to every parameter.
    """
    groups = int(group_index.max().item()) + 1
    finite = torch.isfinite(rewards)
    rewards = torch.where(finite, rewards, torch.zeros_like(rewards))
    count = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, torch.ones_like(rewards))
    mean = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, rewards) / count
    centered = rewards - mean[group_index]
    if scale:
        if std not in ("unbiased", "population"):
            raise ValueError(f"unknown advantage std {std!r}; expected 'unbiased' or 'population'")
        dof = (count - 1.0).clamp(min=1.0) if std == "unbiased" else count
        var = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, centered**2) / dof
        centered = centered / (var.sqrt()[group_index] + eps)
    bad = finite.logical_not() | torch.isfinite(centered).logical_not()
    bad_group = torch.zeros(groups, dtype=torch.long).index_add_(0, group_index, bad.long()) > 0
    return torch.where(bad_group[group_index], torch.zeros_like(centered), centered)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1 >= 0``.

    Schulman (2020), "Approximating KL divergence"; the estimator GRPO adds with weight beta (Eq. 4).
    Unbiased for tokens sampled from ``pi`` (the policy of ``logp``) and never negative, unlike
    ``logp - ref``.
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def aggregation_weights(mask: torch.Tensor, *, mode: str, norm_length: int = 1) -> tuple[torch.Tensor, float]:
    """Per-token coefficients ``c`` [B, T] and the batch denominator ``D`` of ``loss = sum(c * l) / D``.

    - ``token-mean`` (DAPO, Yu et al., 2025): every learning token of the batch weighs the same:
      ``c = mask``, ``D = sum(mask)``. Long completions weigh more than short ones.
    - ``seq-mean-token-mean`` (GRPO's Eq. 3, and GSPO): mean over each sequence's tokens, then over the
      ``B`` sequences: ``c = mask / n_i``, ``D = B``.
    - ``seq-mean-token-sum`` (verl's meaning): each sequence's token sum, then the mean over the ``B``
      sequences: ``c = mask``, ``D = B``. Long completions weigh more, in proportion to their length.
    - ``seq-mean-token-sum-norm`` (Dr.GRPO, Liu et al., 2025): token sums over a constant normalizer, so the
      gradient has no length bias: ``c = mask``, ``D = B * norm_length`` (the generation budget). verl's
      mode of this name divides by the padded width alone (``D = T``); ours divides by ``B`` too, so the
      loss does not grow with the batch: the same direction, a gradient ``B`` times smaller.

    ``D`` depends only on the whole batch's mask, so callers splitting a batch pass the full batch's ``D``.
    Fully masked rows count in ``B`` and add nothing; ``D`` is at least 1, so an empty batch gives 0.
    """
    mask = mask if mask.is_floating_point() else mask.float()
    rows = mask.shape[0]
    if mode == "token-mean":
        return mask, max(float(mask.sum()), 1.0)
    if mode == "seq-mean-token-mean":
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0), float(max(rows, 1))
    if mode == "seq-mean-token-sum":
        return mask, float(max(rows, 1))
    if mode == "seq-mean-token-sum-norm":
        return mask, float(max(rows, 1) * norm_length)
    raise ValueError(f"unknown aggregation {mode!r}")


def behaviour_weights(prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, *, mode: str,
                      cap: float, per_sequence: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weight of each token for a record sampled by the behaviour policy: (weights, corrected) [B, T].

    ``w_t = pi_prox(y_t) / mu(y_t)``, with ``pi_prox`` the learner's policy at the step (decoupled PPO:
    Hilton et al., 2022; AReaL, Fu et al., 2025, Eq. 5) and ``mu`` the stale snapshot the worker used.

    - ``tis``: truncated IS, ``min(w_t, C)`` per token (Yao et al., 2025, "off-policy RL" note).
    - ``mis``: masked IS at the sequence level: a sequence whose geometric-mean ratio
      ``rho_i = exp(mean_t log w_t)`` exceeds ``C`` is rejected (weight 0); the others keep their true
      token weights (Liu, Li et al., 2025, "When speed kills stability", geometric-level rejection).
    - ``decoupled``: AReaL's behaviour weight, ``w_t`` untruncated (Fu et al., 2025, Eq. 5); ``cap`` is not read
      and no token counts as corrected.

    ``per_sequence`` (GSPO) replaces the token weights by the sequence's ``rho_i`` before truncating or
    masking, matching GSPO's sequence-level ratio. ``corrected`` marks tokens that were truncated or masked.
    """
    log_w = (prox_logp - behaviour_logp).detach()
    rho = sequence_ratio(prox_logp.detach(), behaviour_logp, mask)[:, None]
    weights = rho.expand_as(log_w) if per_sequence else torch.exp(log_w)
    if mode == "tis":
        corrected = weights > cap
        return weights.clamp(max=cap), corrected
    if mode == "mis":
        corrected = (rho > cap).expand_as(log_w)
        return torch.where(corrected, torch.zeros_like(weights), weights), corrected
    if mode == "decoupled":
        return weights, torch.zeros_like(weights, dtype=torch.bool)
    raise ValueError(f"unknown off-policy correction {mode!r}")


@dataclass
class LossStats:
    """Additive sums behind a step's metrics; add the stats of micro-batches or ranks with ``+``.

    ``pg`` and ``kl_term`` are the two parts of the loss (already divided by the batch denominator);
    the others are sums over learning tokens (``tokens`` of them) or over sequences.
    """

    pg: float = 0.0
    kl_term: float = 0.0
    tokens: float = 0.0
    sequences: float = 0.0
    clip_low: float = 0.0
    clip_high: float = 0.0
    ratio: float = 0.0
    kl: float = 0.0
    behaviour_kl: float = 0.0
    is_weight: float = 0.0
    is_corrected: float = 0.0
    dual_clip: float = 0.0

    def __add__(self, other: LossStats) -> LossStats:
        return LossStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def summary(self) -> dict[str, float]:
        """Means per learning token, and the loss parts."""
        per_token = max(self.tokens, 1.0)
        return {
            "pg_loss": self.pg, "kl_loss": self.kl_term, "kl": self.kl / per_token,
            "clip_fraction": (self.clip_low + self.clip_high) / per_token,
            "clip_low_fraction": self.clip_low / per_token, "clip_high_fraction": self.clip_high / per_token,
            "mean_ratio": self.ratio / per_token, "behaviour_kl": self.behaviour_kl / per_token,
            "is_weight_mean": self.is_weight / per_token, "is_corrected_fraction": self.is_corrected / per_token,
            "dual_clip_fraction": self.dual_clip / per_token,
        }


@dataclass
class LossTerms:
    loss: torch.Tensor  # scalar, differentiable: this batch's share of sum(c * l) / D
    stats: LossStats = field(default_factory=LossStats)

    @property
    def summary(self) -> dict[str, float]:
        return self.stats.summary()


def policy_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                config: LossConfig, *, ref_logp: torch.Tensor | None = None,
                denominator: float | None = None) -> LossTerms:
    """The configured GRPO/GSPO objective, per token ``l = -w * surrogate(ratio, A) + beta * k3``.

    The PPO ratio is taken against the behaviour log-probs (``off_policy="behaviour"``: the record is
    importance-weighted and clipped toward the snapshot that generated it), or against the learner's
    own detached log-probs with a separate behaviour weight ``w`` (``tis``/``mis``/``decoupled``, decoupled PPO;
    with one optimizer update per batch that ratio is 1 in value and the clip does not bind, so ``w`` carries
    the whole off-policy correction), or against the detached log-probs with no weight at all (``none``:
    stale records treated as on-policy, the ablation baseline).

    ``decoupled`` is AReaL's objective (Fu et al., 2025, Eq. 5) ``w * min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``
    with ``r = pi_theta / pi_prox`` and ``w = pi_prox / mu`` untruncated. ``pi_prox`` is the policy at the start of
    the update: the learner's parameters before this step's optimizer update. Their log-probs are ``logp`` itself,
    detached -- the same values a no-grad recomputation would give, without a second forward pass -- because the
    learner takes one optimizer update per batch (micro-batches accumulate into it). So here, unlike in AReaL with
    several mini-batch updates per batch, ``r`` is 1 in value, the clip never binds, and ``decoupled`` equals
    ``tis`` with an infinite cap. ``type`` names the variant that takes the ratio
    and its surrogate (``learner/losses/<type>.py``): ``grpo`` the token ratio, ``gspo`` the sequence's
    geometric-mean ratio (:func:`sequence_ratio`), clipped per sequence.

    logp, behaviour_logp, mask, ref_logp: [B, T]; advantages: [B]. ``denominator`` is the full batch's
    ``D`` when this call sees only part of it (micro-batch, rank). ``config`` is resolved (every default
    filled in: :meth:`LossConfig.resolved`; a job's ``loss`` always is).
    """
    s = config
    variant = get_policy_loss(s.type)
    mask = mask.to(logp.dtype)
    if s.off_policy == "behaviour":
        old, weights, corrected = behaviour_logp, torch.ones_like(logp), torch.zeros_like(mask, dtype=torch.bool)
    elif s.off_policy == "none":
        old, weights, corrected = logp.detach(), torch.ones_like(logp), torch.zeros_like(mask, dtype=torch.bool)
    else:
        old = logp.detach()
        weights, corrected = behaviour_weights(old, behaviour_logp, mask, mode=s.off_policy, cap=s.is_cap,
                                               per_sequence=variant.sequence_level)
    surrogate = variant.surrogate(logp, old, advantages, mask, s)
    coef, full_denominator = aggregation_weights(mask, mode=s.aggregation, norm_length=s.norm_length)
    denom = full_denominator if denominator is None else denominator
    pg = -(coef * weights * surrogate.value).sum() / denom
    kl_term = torch.zeros((), dtype=logp.dtype, device=logp.device)
    kl = torch.zeros_like(logp)
    if s.kl_beta > 0:
        if ref_logp is None:
            raise ValueError("kl_beta > 0 needs the reference model's log-probs")
        kl = k3_kl(logp, ref_logp)
        kl_term = s.kl_beta * (coef * kl).sum() / denom
    with torch.no_grad():  # one device-to-host copy for all the statistics
        sums = torch.stack([
            pg, kl_term, mask.sum(), (mask.sum(dim=1) > 0).sum().to(mask.dtype), (surrogate.clip_low * mask).sum(),
            (surrogate.clip_high * mask).sum(), (surrogate.ratio * mask).sum(), (kl * mask).sum(),
            (k3_kl(behaviour_logp, logp) * mask).sum(), (weights * mask).sum(), (corrected * mask).sum(),
            (surrogate.dual * mask).sum(),
        ]).detach().double().tolist()
    return LossTerms(loss=pg + kl_term, stats=LossStats(*sums))
