"""The learner's loss against a second, independent implementation in plain Python floats (float64), no torch.

``learner.grpo`` works on whole tensors (masks, ``torch.minimum``, autograd); the reference below walks the batch
token by token with the formulas as the papers write them, and differentiates by hand. The two must agree on the
loss, on the gradient with respect to every log-prob, on the advantages and on the mean behaviour weight, for
every combination of the variant (``grpo``, ``gspo``), the off-policy correction (``behaviour``, ``tis``, ``mis``,
``decoupled``, ``none``), the aggregation (4) and the advantage's std (``unbiased``, ``population``): 80 variants,
plus Dr.GRPO's mean-only advantage. The batch holds a group of one sample and a row with no learning token.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
import torch

from learner.grpo import group_advantages, policy_loss

from .helpers import loss_config

# ---- the batch: 6 sequences of up to 4 tokens, groups of 3, 2 and 1 ------------------------------------------

GROUPS = [0, 0, 0, 1, 1, 2]
REWARDS = [1.0, 0.0, 0.5, 2.0, -1.0, 0.3]
LENGTHS = [4, 3, 0, 4, 1, 2]  # learning tokens per row; row 2 has none
T = 4
CLIP_LOW, CLIP_HIGH, DUAL, CAP, BETA, NORM, EPS = 0.2, 0.28, 3.0, 1.3, 0.05, 5, 1e-6


def _batch():
    rng = random.Random(32)
    mask = [[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS]
    mu = [[rng.uniform(-3.0, -0.1) for _ in range(T)] for _ in LENGTHS]
    # behaviour ratios from 0.4 to 2.5: inside and outside the clip range [0.8, 1.28], above and below the cap 1.3
    logp = [[m + math.log(rng.uniform(0.4, 2.5)) for m in row] for row in mu]
    ref = [[lp + rng.uniform(-0.5, 0.5) for lp in row] for row in logp]
    return logp, mu, ref, mask


# ---- the reference ------------------------------------------------------------------------------------------

def reference_advantages(*, std: str, scale: bool) -> list[float]:
    """``(r - mean_g) / (std_g + eps)`` with the statistics module's std (stdev: n - 1; pstdev: n); a group of one
    sample has no spread and gets 0; ``scale=False``: ``r - mean_g``."""
    members = {g: [r for r, h in zip(REWARDS, GROUPS, strict=True) if h == g] for g in set(GROUPS)}
    out = []
    for r, g in zip(REWARDS, GROUPS, strict=True):
        values = members[g]
        centred = r - math.fsum(values) / len(values)
        if not scale:
            out.append(centred)
        elif len(values) == 1:
            out.append(0.0)
        else:
            spread = statistics.stdev(values) if std == "unbiased" else statistics.pstdev(values)
            out.append(centred / (spread + EPS))
    return out


def _clipped_min(r: float, a: float, dual: float | None) -> tuple[float, float]:
    """PPO's ``min(r A, clip(r) A)`` (and the dual clip's ``max(., c A)`` where A < 0) and its derivative in r."""
    low, high = 1.0 - CLIP_LOW, 1.0 + CLIP_HIGH
    unclipped, clipped = r * a, min(max(r, low), high) * a
    if unclipped <= clipped:
        value, slope = unclipped, a
    else:  # the clipped term is smaller: constant outside the range
        value, slope = clipped, (a if low < r < high else 0.0)
    if dual is not None and a < 0 and dual * a > value:
        value, slope = dual * a, 0.0
    return value, slope


def reference_loss(logp, mu, ref, mask, adv, *, kind: str, off_policy: str, aggregation: str, dual: float | None):
    """The loss, its gradient [B][T] by hand, and the mean behaviour weight over learning tokens."""
    rows = len(logp)
    lengths = [sum(row) for row in mask]
    if aggregation == "token-mean":
        coef, denom = [list(row) for row in mask], max(sum(lengths), 1.0)
    elif aggregation == "seq-mean-token-mean":
        coef, denom = [[m / max(n, 1.0) for m in row] for row, n in zip(mask, lengths, strict=True)], float(rows)
    elif aggregation == "seq-mean-token-sum":
        coef, denom = [list(row) for row in mask], float(rows)
    else:  # seq-mean-token-sum-norm
        coef, denom = [list(row) for row in mask], float(rows * NORM)
    loss, weight_sum = 0.0, 0.0
    grad = [[0.0] * T for _ in range(rows)]
    for i in range(rows):
        n = max(lengths[i], 1.0)
        log_w = [logp[i][t] - mu[i][t] for t in range(T)]  # pi_prox = the learner's policy before the update
        rho = math.exp(sum(lw * m for lw, m in zip(log_w, mask[i], strict=True)) / n)
        # the behaviour weight w and the policy the ratio is taken against
        if off_policy == "behaviour":
            weights, old = [1.0] * T, mu[i]
        else:
            base = [rho] * T if kind == "gspo" else [math.exp(lw) for lw in log_w]
            old = logp[i]  # its value: the ratio is 1
            if off_policy == "tis":
                weights = [min(b, CAP) for b in base]
            elif off_policy == "mis":
                weights = [0.0] * T if rho > CAP else base
            elif off_policy == "decoupled":
                weights = base
            else:  # none
                weights = [1.0] * T
        weight_sum += sum(w * m for w, m in zip(weights, mask[i], strict=True))
        if kind == "grpo":
            for t in range(T):
                r = math.exp(logp[i][t] - old[t])
                value, slope = _clipped_min(r, adv[i], dual)
                loss -= coef[i][t] * weights[t] * value / denom
                grad[i][t] -= coef[i][t] * weights[t] * slope * r / denom  # d r / d logp_t = r
        else:  # gspo: one ratio s per sequence, d s / d logp_u = s * mask_u / n
            s = math.exp(sum((logp[i][t] - old[t]) * mask[i][t] for t in range(T)) / n)
            value, slope = _clipped_min(s, adv[i], dual)
            for t in range(T):
                loss -= coef[i][t] * weights[t] * value / denom
                for u in range(T):
                    grad[i][u] -= coef[i][t] * weights[t] * slope * s * mask[i][u] / n / denom
        for t in range(T):  # beta * k3(pi || ref), d k3 / d logp = 1 - exp(ref - logp)
            d = ref[i][t] - logp[i][t]
            loss += BETA * coef[i][t] * (math.exp(d) - d - 1.0) / denom
            grad[i][t] += BETA * coef[i][t] * (1.0 - math.exp(d)) / denom
    return loss, grad, weight_sum / max(sum(lengths), 1.0)


# ---- the comparison -------------------------------------------------------------------------------------------

VARIANTS = list(itertools.product(["grpo", "gspo"], ["behaviour", "tis", "mis", "decoupled", "none"],
                                  ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                   "seq-mean-token-sum-norm"], ["unbiased", "population"]))


def _compare(kind: str, off_policy: str, aggregation: str, std: str, advantage: str = "std") -> None:
    dual = DUAL if aggregation in ("token-mean", "seq-mean-token-sum") else None  # on in half of them
    settings = loss_config(type=kind, off_policy=off_policy, aggregation=aggregation, advantage=advantage,
                           advantage_std=std, advantage_eps=EPS, clip_eps_low=CLIP_LOW, clip_eps_high=CLIP_HIGH,
                           dual_clip=dual, is_cap=CAP, kl_beta=BETA, norm_length=NORM)
    logp, mu, ref, mask = _batch()
    expected_adv = reference_advantages(std=std, scale=advantage == "std")
    expected_loss, expected_grad, expected_weight = reference_loss(
        logp, mu, ref, mask, expected_adv, kind=kind, off_policy=off_policy, aggregation=aggregation, dual=dual)

    f64 = torch.float64
    adv = group_advantages(torch.tensor(REWARDS, dtype=f64), torch.tensor(GROUPS), eps=settings.advantage_eps,
                           scale=settings.advantage == "std", std=settings.advantage_std)
    logp_t = torch.tensor(logp, dtype=f64, requires_grad=True)
    terms = policy_loss(logp_t, torch.tensor(mu, dtype=f64), adv, torch.tensor(mask, dtype=f64), settings,
                        ref_logp=torch.tensor(ref, dtype=f64))
    terms.loss.backward()

    assert adv.tolist() == pytest.approx(expected_adv, rel=1e-12, abs=1e-15)
    assert terms.loss.item() == pytest.approx(expected_loss, rel=1e-11, abs=1e-14)
    torch.testing.assert_close(logp_t.grad, torch.tensor(expected_grad, dtype=f64), rtol=1e-10, atol=1e-14)
    assert terms.summary["is_weight_mean"] == pytest.approx(expected_weight, rel=1e-12)


@pytest.mark.parametrize(("kind", "off_policy", "aggregation", "std"), VARIANTS)
def test_the_loss_and_its_gradient_match_the_reference(kind: str, off_policy: str, aggregation: str,
                                                       std: str) -> None:
    _compare(kind, off_policy, aggregation, std)


@pytest.mark.parametrize("off_policy", ["behaviour", "decoupled"])
def test_the_mean_only_advantage_matches_the_reference(off_policy: str) -> None:
    _compare("grpo", off_policy, "token-mean", "unbiased", advantage="mean")


def test_the_batch_exercises_what_it_should() -> None:
    """The data reach every branch the reference has: clipped above and below, capped and masked weights."""
    logp, mu, _, mask = _batch()
    ratios = [math.exp(lp - m) for row_lp, row_mu, row_m in zip(logp, mu, mask, strict=True)
              for lp, m, k in zip(row_lp, row_mu, row_m, strict=True) if k]
    rhos = [math.exp(sum((lp - m) * k for lp, m, k in zip(a, b, c, strict=True)) / sum(c))
            for a, b, c in zip(logp, mu, mask, strict=True) if sum(c)]
    assert min(ratios) < 1 - CLIP_LOW and max(ratios) > CAP > 1 + CLIP_HIGH
    assert any(r < CAP for r in rhos) and any(r > CAP for r in rhos)  # MIS rejects some sequences, not all
    assert len(VARIANTS) == 80
