"""GRPO math against values worked out by hand in float64: advantages (unbiased and population std), the clip,
clip-higher, the KL term, the aggregation choices, the off-policy corrections (TIS, MIS, AReaL's decoupled) and
GSPO's sequence ratio."""

from __future__ import annotations

import math

import pytest
import torch

from dataplane.jobs import LossConfig
from learner.grpo import (
    aggregation_weights,
    behaviour_weights,
    group_advantages,
    k3_kl,
    policy_loss,
    sequence_ratio,
)

from .helpers import loss_config

EPS = 1e-6
LN2 = math.log(2.0)


def f64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ---- advantages ----------------------------------------------------------------------------------------

# Two groups, interleaved in the batch: group 0 = rewards (1, 0, 0, 0), group 1 = rewards (2, 4).
REWARDS = f64([1.0, 2.0, 0.0, 0.0, 4.0, 0.0])
GROUPS = torch.tensor([0, 1, 0, 0, 1, 0])


def test_group_advantages_by_hand() -> None:
    # group 0: mean = 1/4 = 0.25; deviations 0.75, -0.25, -0.25, -0.25; squared sum 0.5625 + 3 * 0.0625 = 0.75
    #          unbiased variance = 0.75 / 3 = 0.25, std = 0.5
    # group 1: mean = 3; deviations -1, +1; unbiased variance = (1 + 1) / 1 = 2, std = sqrt(2)
    r2 = math.sqrt(2.0)
    expected = [0.75 / (0.5 + EPS), -1.0 / (r2 + EPS), -0.25 / (0.5 + EPS), -0.25 / (0.5 + EPS),
                1.0 / (r2 + EPS), -0.25 / (0.5 + EPS)]

    adv = group_advantages(REWARDS, GROUPS, eps=EPS)  # the default: the unbiased std, as LossConfig's

    assert adv.dtype == torch.float64
    assert adv.tolist() == pytest.approx(expected, rel=1e-12)
    # the closed forms: the lone success of four is +1.5, each failure -0.5
    assert adv[0].item() == pytest.approx(1.5, rel=1e-5)
    assert adv[2].item() == pytest.approx(-0.5, rel=1e-5)


def test_group_advantages_with_the_population_std_by_hand() -> None:
    # group 0: population variance = 0.75 / 4 = 0.1875, std = sqrt(0.1875) = 0.4330127...
    # group 1: variance = (1 + 1) / 2 = 1, std = 1
    std0 = math.sqrt(0.1875)
    expected = [0.75 / (std0 + EPS), -1.0 / (1.0 + EPS), -0.25 / (std0 + EPS), -0.25 / (std0 + EPS),
                1.0 / (1.0 + EPS), -0.25 / (std0 + EPS)]

    adv = group_advantages(REWARDS, GROUPS, eps=EPS, std="population")

    assert adv.tolist() == pytest.approx(expected, rel=1e-12)
    # the closed forms: the lone success of four is +sqrt(3), each failure -1/sqrt(3)
    assert adv[0].item() == pytest.approx(math.sqrt(3), rel=1e-5)
    assert adv[2].item() == pytest.approx(-1 / math.sqrt(3), rel=1e-5)


def test_the_two_stds_of_a_pair() -> None:
    # (1, 0): mean 0.5, deviations +-0.5; the unbiased std sqrt(0.5) = 0.707 gives +-0.707 (torch.std, verl, TRL),
    # the population std 0.5 gives +-1
    rewards, groups = f64([1.0, 0.0]), torch.tensor([0, 0])

    assert group_advantages(rewards, groups, eps=0.0).tolist() == pytest.approx([0.5**0.5, -(0.5**0.5)], rel=1e-12)
    assert group_advantages(rewards, groups, eps=0.0, std="population").tolist() == pytest.approx([1.0, -1.0])
    assert group_advantages(rewards, groups, eps=0.0).tolist() == pytest.approx(
        ((rewards - rewards.mean()) / rewards.std(unbiased=True)).tolist(), rel=1e-12)


@pytest.mark.parametrize("std", ["unbiased", "population"])
@pytest.mark.parametrize("eps", [EPS, 0.0])
def test_a_group_of_one_sample_has_advantage_zero_not_nan(std: str, eps: float) -> None:
    # the std of one sample is 0/0 unbiased (torch.std gives NaN) and 0 population; its deviation is 0 either way,
    # so the group carries no signal: advantage 0, and the other group is untouched
    adv = group_advantages(f64([0.7, 1.0, 0.0]), torch.tensor([0, 1, 1]), eps=eps, std=std)

    assert adv[0].item() == 0.0
    spread = 0.5**0.5 if std == "unbiased" else 0.5
    assert adv[1:].tolist() == pytest.approx([0.5 / (spread + eps), -0.5 / (spread + eps)], rel=1e-12)


def test_an_unknown_std_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown advantage std 'sample'"):
        group_advantages(REWARDS, GROUPS, std="sample")


def test_group_with_equal_rewards_has_zero_advantage() -> None:
    adv = group_advantages(f64([1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]))

    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert not torch.isnan(adv).any()
    assert adv[3].item() == pytest.approx(-0.5 / (0.5**0.5 + 1e-6), rel=1e-12)


def test_mean_only_advantages() -> None:
    # the same two groups, centred but not scaled (Dr.GRPO): r - 0.25 in group 0, r - 3 in group 1
    adv = group_advantages(REWARDS, GROUPS, scale=False)

    assert adv.tolist() == pytest.approx([0.75, -1.0, -0.25, -0.25, 1.0, -0.25], rel=1e-12)


# ---- the token-level surrogate against the behaviour log-probs (the default) -----------------------------

# ratio = pi_theta / mu per token; clip_eps = 0.2, so the trust region for the ratio is [0.8, 1.2].
#   row 0, A = +1:  ratios 1.1 (inside), 1.5 (above: clipped to 1.2), 0.5 (below: min keeps 0.5, not clipped)
#   row 1, A = -2:  ratios 0.9 (inside), 0.5 (below: min picks 0.8 * -2 = -1.6), 1.5 (above: min keeps -3.0)
#   row 2, A = 0.5: ratio 1.05 learns; ratios 2.0 and 0.1 are masked out (loss mask 0)
RATIOS = [[1.1, 1.5, 0.5], [0.9, 0.5, 1.5], [1.05, 2.0, 0.1]]
ADVANTAGES = [1.0, -2.0, 0.5]
MASK = [[1, 1, 1], [1, 1, 1], [1, 0, 0]]
BEHAVIOUR = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.5], [-0.7, -0.1, -4.0]]
DEFAULT = loss_config()  # grpo, token-mean, behaviour ratio, eps 0.2/0.2, no KL


def inputs():
    behaviour = f64(BEHAVIOUR)
    logp = (behaviour + f64(RATIOS).log()).requires_grad_(True)
    return logp, behaviour, f64(ADVANTAGES), torch.tensor(MASK)


def loss_and_grad(settings: LossConfig, **kwargs):
    logp, behaviour, adv, mask = inputs()
    terms = policy_loss(logp, behaviour, adv, mask, settings, **kwargs)
    terms.loss.backward()
    return terms, logp.grad


def test_default_loss_by_hand() -> None:
    # per-token min(ratio * A, clip(ratio) * A) on learning tokens:
    #   row 0: 1.1, min(1.5, 1.2) = 1.2, min(0.5, 0.8) = 0.5                 -> 2.8
    #   row 1: -1.8, min(-1.0, -1.6) = -1.6, min(-3.0, -2.4) = -3.0           -> -6.4
    #   row 2: 0.525                                                         -> 0.525
    # token-mean over 7 learning tokens: loss = -(2.8 - 6.4 + 0.525) / 7 = 3.075 / 7
    terms, grad = loss_and_grad(DEFAULT)

    assert terms.loss.item() == pytest.approx(3.075 / 7, rel=1e-12)
    assert terms.summary["pg_loss"] == pytest.approx(3.075 / 7, rel=1e-12)
    assert terms.summary["kl_loss"] == 0.0
    # the clip binds on (0, 1) (above, A > 0) and (1, 1) (below, A < 0); (0, 2) and (1, 2) lie outside
    # [0.8, 1.2] but the min keeps their unclipped term, so their gradient flows
    assert terms.summary["clip_high_fraction"] == pytest.approx(1 / 7)
    assert terms.summary["clip_low_fraction"] == pytest.approx(1 / 7)
    assert terms.summary["clip_fraction"] == pytest.approx(2 / 7)
    # mean ratio on learning tokens: (1.1 + 1.5 + 0.5 + 0.9 + 0.5 + 1.5 + 1.05) / 7
    assert terms.summary["mean_ratio"] == pytest.approx(7.05 / 7)
    # d(ratio * A)/d logp = ratio * A where the unclipped term is chosen, 0 where the clipped constant is;
    # the loss is minus the mean over 7 tokens, so grad = -ratio * A / 7 there; masked tokens get 0.
    expected = [[-1.1 / 7, 0.0, -0.5 / 7],
                [1.8 / 7, 0.0, 3.0 / 7],
                [-0.525 / 7, 0.0, 0.0]]
    torch.testing.assert_close(grad, f64(expected), rtol=1e-12, atol=1e-15)


def test_clip_higher_releases_only_the_upper_bound() -> None:
    # eps_high = 0.6: the range is [0.8, 1.6]. Token (0, 1), ratio 1.5 with A = +1, is no longer clipped:
    # its term goes from 1.2 to 1.5, everything else is unchanged. loss = -(3.1 - 6.4 + 0.525) / 7 = 2.775 / 7
    terms, grad = loss_and_grad(loss_config(clip_eps_low=0.2, clip_eps_high=0.6))

    assert terms.loss.item() == pytest.approx(2.775 / 7, rel=1e-12)
    assert terms.summary["clip_high_fraction"] == 0.0
    assert terms.summary["clip_low_fraction"] == pytest.approx(1 / 7)
    _, default_grad = loss_and_grad(DEFAULT)
    changed = (grad != default_grad).nonzero().tolist()
    assert changed == [[0, 1]]
    assert grad[0, 1].item() == pytest.approx(-1.5 / 7, rel=1e-12)


def test_lower_clip_bound_alone() -> None:
    # eps_low = 0.6, eps_high = 0.2: the range is [0.4, 1.2]. Token (1, 1), ratio 0.5 with A = -2, is no
    # longer clipped: min(-1.0, -1.0) = -1.0 instead of -1.6. loss = -(2.8 - 5.8 + 0.525) / 7 = 2.475 / 7
    terms, grad = loss_and_grad(loss_config(clip_eps_low=0.6, clip_eps_high=0.2))

    assert terms.loss.item() == pytest.approx(2.475 / 7, rel=1e-12)
    assert terms.summary["clip_low_fraction"] == 0.0
    assert grad[1, 1].item() == pytest.approx(1.0 / 7, rel=1e-12)  # -(0.5 * -2) / 7


def test_on_policy_loss_is_minus_mean_advantage_per_token() -> None:
    # ratio 1 everywhere: loss = -(A0 * 2 + A1 * 1) / 3 with masks (1, 1) and (1, 0)
    behaviour = f64([[-1.0, -2.0], [-0.5, -0.5]])
    logp = behaviour.clone().requires_grad_(True)

    terms = policy_loss(logp, behaviour, f64([0.6, -0.3]), torch.tensor([[1, 1], [1, 0]]), DEFAULT)
    terms.loss.backward()

    assert terms.loss.item() == pytest.approx(-(0.6 * 2 - 0.3) / 3, rel=1e-12)
    assert terms.summary["clip_fraction"] == 0.0
    assert terms.summary["mean_ratio"] == pytest.approx(1.0)
    assert terms.summary["behaviour_kl"] == pytest.approx(0.0, abs=1e-15)
    torch.testing.assert_close(logp.grad, f64([[-0.2, -0.2], [0.1, 0.0]]), rtol=1e-12, atol=1e-15)


def test_fully_masked_batch_gives_zero_loss_not_nan() -> None:
    logp, behaviour, adv, _ = inputs()

    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        logp.grad = None
        terms = policy_loss(logp, behaviour, adv, torch.zeros(3, 3), loss_config(aggregation=mode))
        terms.loss.backward()

        assert terms.loss.item() == 0.0
        assert torch.equal(logp.grad, torch.zeros(3, 3, dtype=torch.float64))


# ---- aggregation ---------------------------------------------------------------------------------------

def test_seq_mean_token_mean_by_hand() -> None:
    # per-sequence means of the same token terms: 2.8 / 3, -6.4 / 3, 0.525 / 1; then the mean of the three:
    # loss = -(0.9333... - 2.1333... + 0.525) / 3 = 0.675 / 3 = 0.225
    terms, grad = loss_and_grad(loss_config(aggregation="seq-mean-token-mean"))

    assert terms.loss.item() == pytest.approx(0.225, rel=1e-12)
    # a token's gradient is -ratio * A / (n_i * B): the lone learning token of row 2 weighs 3x a row-0 token
    assert grad[2, 0].item() == pytest.approx(-0.525 / 3, rel=1e-12)
    assert grad[0, 0].item() == pytest.approx(-1.1 / 9, rel=1e-12)


def test_seq_mean_token_sum_norm_uses_a_constant_normalizer() -> None:
    # Dr.GRPO: the token sum over B * norm_length = 3 * 4 = 12, whatever the lengths: 3.075 / 12
    terms, grad = loss_and_grad(loss_config(aggregation="seq-mean-token-sum-norm", norm_length=4))

    assert terms.loss.item() == pytest.approx(3.075 / 12, rel=1e-12)
    assert grad[2, 0].item() == pytest.approx(-0.525 / 12, rel=1e-12)


def test_seq_mean_token_sum_is_verls_token_sum_then_sequence_mean() -> None:
    # verl's seq-mean-token-sum: sum each row's tokens (2.8, -6.4, 0.525), then the mean of the 3 rows;
    # norm_length plays no part: loss = -(2.8 - 6.4 + 0.525) / 3 = 3.075 / 3
    terms, grad = loss_and_grad(loss_config(aggregation="seq-mean-token-sum", norm_length=4))

    assert terms.loss.item() == pytest.approx(3.075 / 3, rel=1e-12)
    assert grad[2, 0].item() == pytest.approx(-0.525 / 3, rel=1e-12)


def test_dual_clip_bounds_the_surrogate_of_negative_advantages() -> None:
    # c = 1.4: row 1 (A = -2) has ratio 1.5 > c, its surrogate min(-3.0, -2.4) = -3.0 is raised to c * A = -2.8
    # and its gradient is zeroed; every other token is as in the default: loss = -(2.8 - 6.2 + 0.525) / 7
    terms, grad = loss_and_grad(loss_config(dual_clip=1.4))

    assert terms.loss.item() == pytest.approx(2.875 / 7, rel=1e-12)
    assert grad[1, 2].item() == 0.0
    assert grad[1, 0].item() == pytest.approx(-0.9 * -2.0 / 7, rel=1e-12)
    assert terms.summary["dual_clip_fraction"] == pytest.approx(1 / 7)
    # positive advantages are never dual-clipped: row 0's ratio 1.5 (> c) keeps the ordinary clip
    assert grad[0, 1].item() == 0.0 and terms.summary["clip_high_fraction"] == pytest.approx(1 / 7)


def test_dual_clip_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="dual_clip"):
        loss_config(dual_clip=0.9)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_splitting_a_batch_with_the_full_denominator_is_exact(mode: str) -> None:
    # micro-batches and data-parallel ranks each see some rows; with the whole batch's D they add up exactly
    settings = loss_config(aggregation=mode, norm_length=4, kl_beta=0.1)
    logp, behaviour, adv, mask = inputs()
    ref = logp.detach() - 0.3
    whole = policy_loss(logp, behaviour, adv, mask, settings, ref_logp=ref)
    _, denominator = aggregation_weights(mask, mode=mode, norm_length=4)

    parts = [policy_loss(logp[rows], behaviour[rows], adv[rows], mask[rows], settings, ref_logp=ref[rows],
                         denominator=denominator) for rows in (slice(0, 1), slice(1, 3))]

    assert (parts[0].loss + parts[1].loss).item() == pytest.approx(whole.loss.item(), rel=1e-12)
    assert (parts[0].stats + parts[1].stats).summary() == pytest.approx(whole.stats.summary(), rel=1e-12)


# ---- KL to the reference -------------------------------------------------------------------------------

def test_k3_estimator_by_hand() -> None:
    # k3 = exp(d) - d - 1 with d = ref - logp: d = 0 -> 0; d = ln 2 -> 2 - ln 2 - 1; d = -ln 2 -> 0.5 + ln 2 - 1
    logp = f64([0.0, 0.0, 0.0])
    kl = k3_kl(logp, f64([0.0, LN2, -LN2]))

    assert kl.tolist() == pytest.approx([0.0, 1 - LN2, LN2 - 0.5], rel=1e-12, abs=1e-15)


def test_kl_term_adds_beta_times_k3_per_token() -> None:
    # ref = logp + d with d per token below; the masked tokens' huge d must not count.
    #   learning-token k3 sums: row 0: 0 + (1 - ln 2) + (ln 2 - 0.5) = 0.5; row 1: (1 - ln 2); row 2: ln 2 - 0.5
    #   total = 1.0 over 7 tokens, so kl = 1/7 and the loss grows by beta * 1/7 = 0.1 / 7
    # d k3 / d logp = 1 - exp(d) with the reference held fixed: 0, -1 or +0.5, times beta / 7
    deltas = f64([[0.0, LN2, -LN2], [LN2, 0.0, 0.0], [-LN2, 5.0, 5.0]])
    logp, *_ = inputs()
    ref = logp.detach() + deltas

    terms, grad = loss_and_grad(loss_config(kl_beta=0.1), ref_logp=ref)

    assert terms.summary["kl"] == pytest.approx(1 / 7, rel=1e-12)
    assert terms.summary["kl_loss"] == pytest.approx(0.1 / 7, rel=1e-12)
    assert terms.loss.item() == pytest.approx(3.075 / 7 + 0.1 / 7, rel=1e-12)
    _, default_grad = loss_and_grad(DEFAULT)
    expected_extra = 0.1 / 7 * (1 - deltas.exp()) * f64(MASK)
    torch.testing.assert_close(grad - default_grad, expected_extra, rtol=1e-12, atol=1e-15)


def test_kl_off_needs_no_reference() -> None:
    terms, _ = loss_and_grad(loss_config(kl_beta=0.0), ref_logp=None)

    assert terms.loss.item() == pytest.approx(3.075 / 7, rel=1e-12)
    with pytest.raises(ValueError, match="reference"):
        loss_and_grad(loss_config(kl_beta=0.1), ref_logp=None)


# ---- off-policy corrections ----------------------------------------------------------------------------

# Decoupled modes take the PPO ratio against the learner's own (detached) log-probs: it is 1, the clip
# does not bind, and the token term is -w * A with the behaviour weight w = pi_prox / mu = RATIOS above.

def test_tis_truncates_each_token_weight_at_the_cap() -> None:
    # C = 1.2: w = [[1.1, 1.2, 0.5], [0.9, 0.5, 1.2], [1.05, -, -]] (1.5 -> 1.2 twice)
    # loss = -(1 * (1.1 + 1.2 + 0.5) - 2 * (0.9 + 0.5 + 1.2) + 0.5 * 1.05) / 7 = -(2.8 - 5.2 + 0.525) / 7 = 1.875 / 7
    terms, grad = loss_and_grad(loss_config(off_policy="tis", is_cap=1.2))

    assert terms.loss.item() == pytest.approx(1.875 / 7, rel=1e-12)
    assert terms.summary["is_corrected_fraction"] == pytest.approx(2 / 7)
    assert terms.summary["clip_fraction"] == 0.0
    assert terms.summary["mean_ratio"] == pytest.approx(1.0)
    # gradient of -w * A * exp(logp - sg(logp)) is -w * A
    expected = [[-1.1 / 7, -1.2 / 7, -0.5 / 7], [1.8 / 7, 1.0 / 7, 2.4 / 7], [-0.525 / 7, 0.0, 0.0]]
    torch.testing.assert_close(grad, f64(expected), rtol=1e-12, atol=1e-15)


def test_tis_truncation_changes_exactly_the_capped_tokens() -> None:
    # a cap above every ratio leaves the true weights: -(3.1 - 5.8 + 0.525) / 7 = 2.175 / 7; capping at 1.2
    # changes (0, 1) by +0.3 (A = +1) and (1, 2) by -0.6 (A = -2): 2.175 / 7 - 0.3 / 7 = 1.875 / 7
    loose, loose_grad = loss_and_grad(loss_config(off_policy="tis", is_cap=10.0))
    tight, tight_grad = loss_and_grad(loss_config(off_policy="tis", is_cap=1.2))

    assert loose.loss.item() == pytest.approx(2.175 / 7, rel=1e-12)
    assert loose.loss.item() - tight.loss.item() == pytest.approx(0.3 / 7, rel=1e-9)
    assert (loose_grad != tight_grad).nonzero().tolist() == [[0, 1], [1, 2]]


def test_mis_masks_whole_sequences_whose_ratio_exceeds_the_cap() -> None:
    # geometric-mean weights: row 0 (1.1 * 1.5 * 0.5)^(1/3) = 0.938, row 1 (0.9 * 0.5 * 1.5)^(1/3) = 0.877,
    # row 2 1.05 (one learning token). With C = 1.0 row 2 is rejected; rows 0 and 1 keep their true token
    # weights: loss = -(1 * (1.1 + 1.5 + 0.5) - 2 * (0.9 + 0.5 + 1.5)) / 7 = -(3.1 - 5.8) / 7 = 2.7 / 7
    terms, grad = loss_and_grad(loss_config(off_policy="mis", is_cap=1.0))

    assert terms.loss.item() == pytest.approx(2.7 / 7, rel=1e-12)
    assert terms.summary["is_corrected_fraction"] == pytest.approx(1 / 7)
    assert grad[2].tolist() == [0.0, 0.0, 0.0]
    assert grad[0, 1].item() == pytest.approx(-1.5 / 7, rel=1e-12)


def test_decoupled_weights_every_token_by_its_untruncated_behaviour_ratio() -> None:
    # AReaL: w = pi_prox / mu untruncated = RATIOS; r = pi_theta / pi_prox = 1 (one update per batch), no clip:
    # loss = -(1 * (1.1 + 1.5 + 0.5) - 2 * (0.9 + 0.5 + 1.5) + 0.5 * 1.05) / 7 = -(3.1 - 5.8 + 0.525) / 7 = 2.175 / 7
    terms, grad = loss_and_grad(loss_config(off_policy="decoupled", is_cap=1.0))  # the cap is not read

    assert terms.loss.item() == pytest.approx(2.175 / 7, rel=1e-12)
    assert terms.summary["is_corrected_fraction"] == 0.0
    assert terms.summary["clip_fraction"] == 0.0
    assert terms.summary["mean_ratio"] == pytest.approx(1.0)
    assert terms.summary["is_weight_mean"] == pytest.approx(7.05 / 7)  # the true weights' mean
    expected = [[-1.1 / 7, -1.5 / 7, -0.5 / 7], [1.8 / 7, 1.0 / 7, 3.0 / 7], [-0.525 / 7, 0.0, 0.0]]
    torch.testing.assert_close(grad, f64(expected), rtol=1e-12, atol=1e-15)
    # with one update per batch, decoupled is TIS whose cap never binds
    loose, loose_grad = loss_and_grad(loss_config(off_policy="tis", is_cap=1000.0))
    assert loose.loss.item() == terms.loss.item() and torch.equal(loose_grad, grad)


def test_decoupled_gspo_weights_each_sequence_by_its_geometric_mean_ratio() -> None:
    # w_i = S_i (the sequence's geometric-mean behaviour ratio) on every token of row i, r = 1:
    # loss = -(S0 - 2 * S1 + 0.5 * S2) / 3 and grad = -A_i * S_i / (n_i * 3) -- a narrow clip changes nothing
    settings = loss_config(type="gspo", aggregation="seq-mean-token-mean", off_policy="decoupled",
                           clip_eps_low=0.04, clip_eps_high=0.04)
    terms, grad = loss_and_grad(settings)

    assert terms.loss.item() == pytest.approx(-(S0 - 2 * S1 + 0.5 * S2) / 3, rel=1e-12)
    expected = [[-S0 / 9] * 3, [2 * S1 / 9] * 3, [-0.5 * S2 / 3, 0.0, 0.0]]
    torch.testing.assert_close(grad, f64(expected), rtol=1e-12, atol=1e-15)
    assert terms.summary["clip_fraction"] == 0.0


def test_behaviour_weights_functions_directly() -> None:
    prox = f64([[math.log(3.0), 0.0]])
    mu = f64([[0.0, 0.0]])  # token ratios 3 and 1; geometric mean sqrt(3) = 1.732
    mask = torch.tensor([[1, 1]])

    w, corrected = behaviour_weights(prox, mu, mask, mode="tis", cap=2.0)  # 3 -> 2
    assert w[0].tolist() == pytest.approx([2.0, 1.0]) and corrected.tolist() == [[True, False]]
    w, corrected = behaviour_weights(prox, mu, mask, mode="mis", cap=2.0)  # 1.732 <= 2: true weights
    assert w[0].tolist() == pytest.approx([3.0, 1.0]) and corrected.tolist() == [[False, False]]
    w, corrected = behaviour_weights(prox, mu, mask, mode="mis", cap=1.5)  # 1.732 > 1.5: rejected
    assert w.tolist() == [[0.0, 0.0]] and corrected.tolist() == [[True, True]]
    w, _ = behaviour_weights(prox, mu, mask, mode="tis", cap=1.5, per_sequence=True)  # GSPO: min(1.732, 1.5)
    assert w[0].tolist() == pytest.approx([1.5, 1.5])
    w, corrected = behaviour_weights(prox, mu, mask, mode="decoupled", cap=1.5)  # AReaL: untruncated
    assert w[0].tolist() == pytest.approx([3.0, 1.0]) and corrected.tolist() == [[False, False]]
    with pytest.raises(ValueError, match="unknown off-policy correction 'vtrace'"):
        behaviour_weights(prox, mu, mask, mode="vtrace", cap=1.5)


def test_no_correction_treats_stale_records_as_on_policy() -> None:
    # off_policy = "none": weights 1, ratio 1: loss = -(1 * 3 - 2 * 3 + 0.5 * 1) / 7 = 2.5 / 7, grad -A / 7
    terms, grad = loss_and_grad(loss_config(off_policy="none"))

    assert terms.loss.item() == pytest.approx(2.5 / 7, rel=1e-12)
    expected = [[-1 / 7] * 3, [2 / 7] * 3, [-0.5 / 7, 0.0, 0.0]]
    torch.testing.assert_close(grad, f64(expected), rtol=1e-12, atol=1e-15)


# ---- GSPO ----------------------------------------------------------------------------------------------

S0, S1, S2 = 0.825 ** (1 / 3), 0.675 ** (1 / 3), 1.05  # geometric-mean ratios of the three rows


def test_sequence_ratio_is_the_geometric_mean_over_learning_tokens() -> None:
    logp, behaviour, _, mask = inputs()

    assert sequence_ratio(logp, behaviour, mask).tolist() == pytest.approx([S0, S1, S2], rel=1e-12)


def test_gspo_loss_and_gradient_by_hand() -> None:
    # wide clip (all ratios inside): per-sequence s_i * A_i, mean over 3 sequences (GSPO's default aggregation)
    # loss = -(S0 - 2 * S1 + 0.5 * S2) / 3; d s_i / d logp_t = s_i / n_i, so grad = -A_i * s_i / (n_i * 3)
    settings = loss_config(type="gspo", aggregation="seq-mean-token-mean", clip_eps_low=0.5, clip_eps_high=0.5)
    terms, grad = loss_and_grad(settings)

    assert terms.loss.item() == pytest.approx(-(S0 - 2 * S1 + 0.5 * S2) / 3, rel=1e-12)
    expected = [[-S0 / 9] * 3, [2 * S1 / 9] * 3, [-0.5 * S2 / 3, 0.0, 0.0]]
    torch.testing.assert_close(grad, f64(expected), rtol=1e-12, atol=1e-15)


def test_gspo_clips_whole_sequences() -> None:
    # eps = 0.04: range [0.96, 1.04]. Row 0 (0.938, A > 0): the min keeps s0, gradient flows. Row 1 (0.877,
    # A < 0): clipped to 0.96, no gradient. Row 2 (1.05, A > 0): clipped to 1.04, no gradient.
    # loss = -(S0 - 2 * 0.96 + 0.5 * 1.04) / 3
    settings = loss_config(type="gspo", aggregation="seq-mean-token-mean", clip_eps_low=0.04, clip_eps_high=0.04)
    terms, grad = loss_and_grad(settings)

    assert terms.loss.item() == pytest.approx(-(S0 - 2 * 0.96 + 0.5 * 1.04) / 3, rel=1e-12)
    assert terms.summary["clip_low_fraction"] == pytest.approx(3 / 7)  # the three learning tokens of row 1
    assert terms.summary["clip_high_fraction"] == pytest.approx(1 / 7)
    assert grad[1].tolist() == [0.0, 0.0, 0.0] and grad[2].tolist() == [0.0, 0.0, 0.0]
    assert grad[0].tolist() == pytest.approx([-S0 / 9] * 3, rel=1e-12)
